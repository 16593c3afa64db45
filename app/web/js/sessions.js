// The session list (newest first, a page at a time, searched by title, id or model) and
// the form that creates a session.

import { api } from "./api.js";
import { $, h, fill, debounce, short, when } from "./dom.js";

const PAGE = 20;
const SEARCH_PAGES = 10; // a search loads up to this many more pages of 100

export class SessionList {
  constructor({ onOpen, onError }) {
    this.onOpen = onOpen;
    this.onError = onError;
    this.items = [];
    this.cursor = null;
    this.current = null;
    this.list = $("#session-list");
    this.more = $("#more-sessions");
    this.search = $("#session-search");
    this.note = $("#session-list-note");
    this.more.addEventListener("click", () => this.loadMore().catch(onError));
    this.search.addEventListener(
      "input",
      debounce(() => this.searchAll().catch(onError), 200),
    );
  }

  async reload() {
    this.items = [];
    this.cursor = null;
    await this.loadMore();
  }

  async loadMore(limit = PAGE) {
    const query = new URLSearchParams({ limit: String(limit) });
    if (this.cursor) query.set("after", this.cursor);
    const page = await api("GET", `/sessions?${query}`);
    const known = new Set(this.items.map((s) => s.id));
    this.items.push(...page.data.filter((s) => !known.has(s.id)));
    this.cursor = page.next_cursor;
    this.draw();
  }

  /** A search covers every session: the pages not loaded yet are fetched first. */
  async searchAll() {
    for (let n = 0; this.search.value.trim() && this.cursor && n < SEARCH_PAGES; n++)
      await this.loadMore(100);
    this.draw();
  }

  upsert(session) {
    const index = this.items.findIndex((s) => s.id === session.id);
    if (index >= 0) this.items[index] = session;
    else this.items.unshift(session);
    this.draw();
  }

  remove(id) {
    this.items = this.items.filter((s) => s.id !== id);
    this.draw();
  }

  select(id) {
    this.current = id;
    this.draw();
  }

  draw() {
    const query = this.search.value.trim().toLowerCase();
    const shown = this.items.filter(
      (s) => !query || [s.title || "", s.id, s.model].some((v) => v.toLowerCase().includes(query)),
    );
    fill(
      this.list,
      shown.map((s) =>
        h(
          "li",
          {},
          h(
            "button",
            {
              type: "button",
              class: "session-item",
              "aria-current": s.id === this.current ? "true" : null,
              dataset: { id: s.id },
              onclick: () => this.onOpen(s.id),
            },
            h("span", { class: "title" }, s.title || `Untitled ${short(s.id)}`),
            h(
              "span",
              { class: "sub" },
              `${s.model} · ${s.status === "idle" ? when(s.updated_at) : s.status}`,
            ),
          ),
        ),
      ),
    );
    this.more.hidden = !this.cursor;
    if (query)
      this.note.textContent = `${shown.length} of ${this.items.length} loaded sessions match${this.cursor ? " (more not loaded)" : ""}.`;
    else this.note.textContent = this.items.length ? "" : "No sessions yet.";
  }
}

export const EXAMPLE_TOOL = {
  name: "ask_user",
  description: "Ask the person using the page a question and wait for the answer.",
  input_schema: { type: "object", properties: { question: { type: "string" } }, required: ["question"] },
};

/** The "New session" dialog; resolves nothing, calls onCreated(session). */
export class NewSessionDialog {
  constructor({ config, onCreated }) {
    this.dialog = $("#new-session-dialog");
    this.form = $("#new-session-form");
    this.error = $("#new-session-error");
    this.onCreated = onCreated;
    const tools = $("#builtin-tools");
    for (const name of config.builtin_tools) {
      tools.append(
        h(
          "label",
          { class: "inline" },
          h("input", { type: "checkbox", name: "builtin", value: name, checked: true }),
          ` ${name}`,
        ),
      );
    }
    $("#model-input").placeholder = `${config.default_model} (the service's default)`;
    $("#example-tool").addEventListener("click", () => {
      const area = this.form.elements.tools;
      let tools = [];
      try {
        tools = area.value.trim() ? JSON.parse(area.value) : [];
      } catch {
        tools = [];
      }
      if (!tools.some((t) => t.name === EXAMPLE_TOOL.name)) tools.push(EXAMPLE_TOOL);
      area.value = JSON.stringify(tools, null, 2);
    });
    $("#new-session-close").addEventListener("click", () => this.dialog.close());
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.create();
    });
  }

  open() {
    this.error.textContent = "";
    this.dialog.showModal();
    this.form.elements.title.focus();
  }

  body() {
    const f = this.form.elements;
    const int = (name) => (f[name].value.trim() === "" ? undefined : Number(f[name].value));
    const body = {
      builtin_tools: [...this.form.querySelectorAll("input[name=builtin]:checked")].map((el) => el.value),
    };
    if (f.title.value.trim()) body.title = f.title.value.trim();
    if (f.model.value.trim()) body.model = f.model.value.trim();
    if (f.system.value.trim()) body.system = f.system.value;
    if (f.tools.value.trim()) {
      try {
        body.tools = JSON.parse(f.tools.value);
      } catch (err) {
        throw new Error(`Client tools are not valid JSON: ${err.message}`);
      }
      if (!Array.isArray(body.tools))
        throw new Error("Client tools must be a JSON array of tool definitions");
    }
    if (f.thinking.value)
      body.thinking = {
        type: f.thinking.value,
        budget_tokens: f.thinking.value === "enabled" ? (int("budget_tokens") ?? 4096) : undefined,
      };
    if (int("max_tokens") !== undefined) body.max_tokens = int("max_tokens");
    const compaction = { auto: f.auto.checked, micro: f.micro.checked };
    for (const name of [
      "threshold_tokens",
      "context_window",
      "keep_recent_tool_results",
      "micro_batch_tokens",
      "collapse_at",
    ]) {
      if (int(name) !== undefined) compaction[name] = int(name);
    }
    body.compaction = compaction;
    return body;
  }

  async create() {
    this.error.textContent = "";
    try {
      const session = await api("POST", "/sessions", { json: this.body() });
      this.dialog.close();
      this.form.reset();
      this.form.querySelectorAll("input[name=builtin]").forEach((el) => (el.checked = true));
      await this.onCreated(session);
    } catch (err) {
      const fields = (err.problem?.errors || []).map((e) => `${(e.loc || []).slice(1).join(".")}: ${e.msg}`);
      fill(
        this.error,
        err.message,
        fields.length
          ? h(
              "ul",
              {},
              fields.map((t) => h("li", {}, t)),
            )
          : null,
      );
    }
  }
}
