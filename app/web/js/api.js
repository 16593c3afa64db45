// The HTTP side: the API key (kept in this tab's session storage), JSON requests with
// problem+json errors, and Server-Sent Events read from a fetch body.

const KEY_ITEM = "parley.apiKey";

export const apiKey = {
  get: () => sessionStorage.getItem(KEY_ITEM) || "",
  set(value) {
    if (value) sessionStorage.setItem(KEY_ITEM, value);
    else sessionStorage.removeItem(KEY_ITEM);
  },
};

/** The session a browser token (`pbt_...`, minted by POST /tokens) is scoped to; null
 * for a tenant key. The token's claims are readable JSON; only the server can check them. */
export function tokenSession(key) {
  if (!key.startsWith("pbt_")) return null;
  try {
    const claims = key.slice(4).split(".")[0].replace(/-/g, "+").replace(/_/g, "/");
    const padded = claims + "=".repeat((4 - (claims.length % 4)) % 4);
    return JSON.parse(atob(padded)).s || null;
  } catch {
    return null;
  }
}

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
  /** Worth retrying: the service (or the way to it) failed, not the request. */
  get transient() {
    return this.status === 0 || this.status === 408 || this.status === 429 || this.status >= 502;
  }
}

export function headers(extra = {}) {
  const out = { ...extra };
  const key = apiKey.get();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

/** fetch with the key; JSON in (`json`) and out. `raw: true` returns the Response. */
export async function api(method, path, { json, body, headers: extra, signal, raw } = {}) {
  const init = { method, headers: headers(extra), signal };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    init.body = body;
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    if (err?.name === "AbortError") throw err;
    throw new ApiError(0, { detail: "The service cannot be reached (network error)" });
  }
  if (!response.ok) throw await problemOf(response);
  if (raw) return response;
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

export async function problemOf(response) {
  let problem = null;
  try {
    problem = await response.json();
  } catch {
    problem = { detail: `HTTP ${response.status} ${response.statusText}` };
  }
  return new ApiError(response.status, problem);
}

/** Every page of a listing that pages by `next_cursor`. */
export async function allPages(path, params = {}, maxPages = 50) {
  const items = [];
  let after = null;
  for (let page = 0; page < maxPages; page++) {
    const query = new URLSearchParams(params);
    if (after) query.set("after", after);
    const result = await api("GET", `${path}?${query}`);
    items.push(...result.data);
    after = result.next_cursor;
    if (!after) break;
  }
  return items;
}

/** One Server-Sent Event at a time from a fetch Response: {id, event, data}. Comments
 * (pings) only call `onBytes`, which also hears every other chunk (for watchdogs). */
export async function* sseEvents(response, onBytes = () => {}) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      onBytes(value);
      buffer += value;
      for (;;) {
        const match = /\r\n\r\n|\n\n|\r\r/.exec(buffer);
        if (!match) break;
        const chunk = buffer.slice(0, match.index);
        buffer = buffer.slice(match.index + match[0].length);
        const event = parseEvent(chunk);
        if (event) yield event;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function parseEvent(chunk) {
  let id = null;
  let event = "message";
  const data = [];
  for (const line of chunk.split(/\r\n|\n|\r/)) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") id = value;
    else if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length && id === null) return null;
  return { id, event, data: data.join("\n") };
}
