// The playground: wires the panels to one session at a time. Its turns (turns.js) are
// streamed and followed to the end; then `refresh()` reloads the session's state from
// the service (the chain, the tree, the context, runs and files) and draws it.

import { api, allPages, apiKey, headers, ApiError, tokenSession } from "./api.js";
import { ChatView } from "./chat.js";
import { renderContext } from "./context.js";
import { $, $$, h, fill, num, short } from "./dom.js";
import { FilesPanel } from "./files.js";
import { RunsPanel } from "./runs.js";
import { NewSessionDialog, SessionList } from "./sessions.js";
import { Stopped } from "./stream.js";
import { Tree, renderTree } from "./tree.js";
import { TurnActions } from "./turns.js";

const CLEARED = "[Old tool result content cleared]";

class Playground extends TurnActions {
  constructor(config) {
    super();
    this.config = config;
    this.session = null;
    this.view = "full";
    this.tree = new Tree();
    this.chainIds = [];
    this.busy = null; // null | "running" | "requires_action" | "compacting" | "loading"
    const onError = (err) => this.error(err);
    this.chat = new ChatView($("#chat-log"), {
      edit: (msg, text) => this.edit(msg, text),
      regenerate: (msg) => this.regenerate(msg),
      rewind: (msg) => this.moveHead(msg.uuid, "Rewound: the next turn continues from this message"),
      forkAt: (msg) => this.fork(msg.uuid),
      sibling: (msg, step) => this.sibling(msg, step),
      answer: (results) => this.answer(results),
    });
    this.sessions = new SessionList({ onOpen: (id) => this.open(id).catch(onError), onError });
    this.files = new FilesPanel({
      confirm: (text) => this.confirm(text),
      onError,
      announce: (t) => this.say(t),
    });
    this.runs = new RunsPanel({ onError });
    this.dialog = new NewSessionDialog({ config, onCreated: (s) => this.created(s) });
    this.wire();
  }

  wire() {
    const key = $("#api-key");
    key.value = apiKey.get();
    const useKey = () => {
      if (key.value.trim() === apiKey.get()) return;
      apiKey.set(key.value.trim());
      this.say(key.value.trim() ? "API key saved for this tab" : "API key removed");
      this.start().catch((err) => this.error(err));
    };
    key.addEventListener("change", useKey);
    $("#key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      useKey();
    });
    $("#new-session").addEventListener("click", () => this.dialog.open());
    $("#composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.send().catch((err) => this.error(err));
    });
    $("#message").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        $("#composer").requestSubmit();
      }
    });
    $("#cancel").addEventListener("click", () => this.cancel().catch((err) => this.error(err)));
    $("#compact-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.compact().catch((err) => this.error(err));
    });
    $("#fork").addEventListener("click", () => this.fork(null));
    $("#delete").addEventListener("click", () => this.remove().catch((err) => this.error(err)));
    $("#transcript").addEventListener("click", () => this.transcript().catch((err) => this.error(err)));
    $("#rename").addEventListener("click", () => this.renaming(true));
    $("#rename-discard").addEventListener("click", () => this.renaming(false));
    $("#rename-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.rename().catch((err) => this.error(err));
    });
    for (const radio of $$("input[name=view]")) {
      radio.addEventListener("change", () => {
        this.view = radio.value;
        this.refresh().catch((err) => this.error(err));
      });
    }
    window.addEventListener("hashchange", () => {
      const id = sessionFromHash();
      if (id && id !== this.session?.id) this.open(id).catch((err) => this.error(err));
    });
  }

  async start() {
    // A browser token reaches one session and cannot list the others: open that one.
    const scoped = tokenSession(apiKey.get());
    if (scoped) {
      await this.open(scoped);
      return;
    }
    await this.sessions.reload();
    const id = sessionFromHash();
    if (id) await this.open(id);
  }

  // --- status -------------------------------------------------------------------------

  say(text, kind = "") {
    const status = $("#status");
    status.className = `status ${kind}`;
    status.textContent = text;
  }

  error(err) {
    if (err instanceof Stopped) return;
    console.warn(err);
    let text = err?.message || String(err);
    if (err instanceof ApiError && err.status === 401) text = `${text}: enter an API key above`;
    this.say(text, "error");
  }

  setBusy(busy) {
    this.busy = busy;
    const has = Boolean(this.session);
    $("#send").disabled = !has || Boolean(busy);
    $("#message").disabled = !has || busy === "loading";
    $("#cancel").disabled = !(busy === "running" || busy === "requires_action") || !this.run?.id;
    $("#compact").disabled = !has || Boolean(busy);
    this.chat.busy = Boolean(busy);
    for (const button of $$(
      "#chat-log .actions button, #chat-log .siblings button, #tree-body button.node",
    )) {
      if (busy) button.disabled = true;
    }
    $("#hint").textContent =
      busy === "requires_action"
        ? "The run waits for your answer to its client tool call (or Cancel)."
        : busy === "running"
          ? "The model is replying…"
          : this.config.provider === "offline"
            ? "Offline model: /tool Name {json}, /long N, /think"
            : "";
  }

  // --- sessions -----------------------------------------------------------------------

  async created(session) {
    this.sessions.upsert(session);
    await this.open(session.id);
    this.say(`Created session ${session.title || short(session.id)}`);
  }

  async open(id) {
    this.detach();
    this.chat.reset();
    this.session = await api("GET", `/sessions/${id}`);
    if (location.hash !== `#session=${id}`) history.replaceState(null, "", `#session=${id}`);
    this.sessions.select(id);
    $("#session-tools").hidden = false;
    this.setBusy("loading");
    await this.refresh();
    this.setBusy(null);
    $("#message").focus();
    this.attach().catch((err) => this.error(err)); // follows an active run in the background
  }

  /** Reload everything about the current session and draw it. */
  async refresh() {
    if (!this.session) return;
    const id = this.session.id;
    const base = `/sessions/${id}`;
    const [session, chain, modelView, nodes, context] = await Promise.all([
      api("GET", base),
      allPages(`${base}/messages`, { view: this.view, limit: "1000" }),
      this.view === "full" ? allPages(`${base}/messages`, { view: "api", limit: "1000" }) : null,
      allPages(`${base}/tree`, { limit: "1000" }),
      api("GET", `${base}/context`),
      this.runs.load(id),
      this.files.load(id),
    ]);
    if (this.session?.id !== id) return;
    this.session = session;
    this.sessions.upsert(session);
    this.tree = new Tree(nodes);
    this.chainIds = chain.map((m) => m.uuid);
    const cleared = new Set();
    for (const msg of modelView || []) {
      for (const block of msg.content || [])
        if (block.type === "tool_result" && block.content === CLEARED) cleared.add(block.tool_use_id);
    }
    const pending = this.run?.status === "requires_action" ? this.run.required_action?.tool_uses : null;
    this.chat.render({
      messages: chain,
      view: this.view,
      cleared,
      pending: new Map((pending || []).map((use) => [use.id, use])),
      siblings: (m) => this.tree.siblings(m),
      busy: Boolean(this.busy && this.busy !== "loading"),
    });
    renderContext($("#context-body"), context, session);
    renderTree(
      $("#tree-body"),
      this.tree,
      this.chainIds,
      session.head_uuid,
      (uuid) => this.moveHead(uuid, "Moved the head"),
      Boolean(this.busy && this.busy !== "loading"),
    );
    this.drawHeader();
    const last = this.runs.latest();
    if (last?.status === "failed" && last.error && !this.chat.notes.length)
      this.chat.note(`The last run failed: ${last.error.message}`, "error");
  }

  drawHeader() {
    const s = this.session;
    $("#session-title").textContent = s ? s.title || `Untitled ${short(s.id)}` : "No session";
    document.title = s ? `${s.title || short(s.id)} · Parley playground` : "Parley playground";
    if (!s) {
      fill($("#session-meta"));
      return;
    }
    const tools = [...s.builtin_tools, ...s.tools.map((t) => `${t.name} (client)`)];
    fill(
      $("#session-meta"),
      h("span", {}, s.model),
      " · ",
      h("span", { class: `status ${s.status}` }, s.status.replace("_", " ")),
      ` · thinking ${s.thinking?.type || "off"} · tools: ${tools.join(", ") || "none"}`,
      ` · usage ${num(s.usage.input_tokens)} in / ${num(s.usage.output_tokens)} out / ${num(s.usage.cache_read_input_tokens)} cache reads`,
    );
  }

  renaming(on) {
    $("#rename-form").hidden = !on;
    $("#session-title").hidden = on;
    if (on) {
      $("#rename-input").value = this.session?.title || "";
      $("#rename-input").focus();
    }
  }

  async rename() {
    const title = $("#rename-input").value.trim();
    this.session = await api("PATCH", `/sessions/${this.session.id}`, { json: { title: title || null } });
    this.sessions.upsert(this.session);
    this.renaming(false);
    this.drawHeader();
    this.say("Renamed");
  }

  async fork(atUuid) {
    try {
      const copy = await api("POST", `/sessions/${this.session.id}/fork`, {
        json: atUuid ? { at_uuid: atUuid } : {},
      });
      const title = `Fork of ${this.session.title || short(this.session.id)}`.slice(0, 500);
      const named = await api("PATCH", `/sessions/${copy.id}`, { json: { title } });
      this.sessions.upsert(named);
      await this.open(named.id);
      this.say(`Forked into a new session: ${named.title}`);
    } catch (err) {
      this.error(err);
    }
  }

  async remove() {
    const s = this.session;
    if (
      !(await this.confirm(
        `Delete the session “${s.title || short(s.id)}” with its messages, runs and files?`,
      ))
    )
      return;
    await api("DELETE", `/sessions/${s.id}`);
    this.detach();
    this.sessions.remove(s.id);
    this.session = null;
    history.replaceState(null, "", location.pathname);
    $("#session-tools").hidden = true;
    this.drawHeader();
    fill($("#chat-log"), h("p", { class: "empty" }, "Session deleted. Create one or pick another."));
    renderContext($("#context-body"), null);
    fill($("#tree-body"), h("p", { class: "note" }, "No session."));
    await this.files.load(null);
    await this.runs.load(null);
    this.setBusy(null);
    this.say("Deleted");
  }

  async transcript() {
    const response = await fetch(`/sessions/${this.session.id}/transcript`, { headers: headers() });
    if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
    const url = URL.createObjectURL(await response.blob());
    const link = h("a", { href: url, download: `${this.session.id}.jsonl`, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  }

  confirm(text) {
    const dialog = $("#confirm-dialog");
    $("#confirm-text").textContent = text;
    $("#confirm-yes").textContent = "Yes, delete";
    return new Promise((resolve) => {
      const finish = (answer) => {
        dialog.close();
        $("#confirm-form").onsubmit = null;
        $("#confirm-no").onclick = null;
        dialog.oncancel = null;
        resolve(answer);
      };
      $("#confirm-form").onsubmit = (event) => {
        event.preventDefault();
        finish(true);
      };
      $("#confirm-no").onclick = () => finish(false);
      dialog.oncancel = () => finish(false);
      dialog.showModal();
      $("#confirm-no").focus();
    });
  }
}

function sessionFromHash() {
  const match = /^#session=([0-9a-f-]{36})$/i.exec(location.hash);
  return match ? match[1] : null;
}

async function main() {
  const config = await fetch("/playground/config.json").then((r) => r.json());
  fill(
    $("#provider"),
    config.provider === "offline"
      ? "offline model (not a language model)"
      : `Anthropic · ${config.default_model}`,
  );
  if (!config.key_required) $("#api-key").placeholder = "not needed: this service runs open";
  const app = new Playground(config);
  app.setBusy(null);
  window.playground = app; // for the console
  $("#new-session").disabled = false;
  try {
    await app.start();
  } catch (err) {
    app.error(err);
  } finally {
    document.body.dataset.ready = "true";
  }
}

main();
