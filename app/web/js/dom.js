// Small DOM helpers: elements are built with textContent only (never innerHTML), so
// nothing a model or a user writes is ever parsed as markup.

/** h("button", {class: "x", onclick: fn, "aria-label": "..."}, "text", child, ...) */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (key in el && typeof value !== "string") {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export const $ = (selector, root = document) => root.querySelector(selector);
export const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];

export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const NUMBER = new Intl.NumberFormat("en-US");
export const num = (n) => NUMBER.format(n ?? 0);

export function when(iso) {
  if (!iso) return "";
  const date = new Date(/[zZ]|[+-]\d\d:\d\d$/.test(iso) ? iso : iso + "Z");
  return date.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

export const short = (id) => String(id ?? "").slice(0, 8);

export function pretty(value) {
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}
