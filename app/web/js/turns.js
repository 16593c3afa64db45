// Turns: the runs the page starts (a message, an edit, a regeneration, client tool
// results, a compaction) and follows to the end with `followRun`, which survives
// dropped connections. Once a run settles, the page reloads the session's state from
// the service, so what is drawn is always what is stored.
//
// `TurnActions` is the base of the page's controller (main.js), which provides
// `session`, `chat`, `tree`, `runs`, `busy`, `setBusy()`, `refresh()`, `say()` and
// `error()`.

import { api, headers } from "./api.js";
import { $, num } from "./dom.js";
import { Stopped, followRun } from "./stream.js";

export class TurnActions {
  constructor() {
    this.run = null; // the active run: {id, lastId, status, required_action}
    this.stopper = null; // ends following the run (the page moved to another session)
  }

  /** Stop following the current run (it goes on at the service). */
  detach() {
    this.stopper?.abort();
    this.stopper = null;
    this.run = null;
  }

  /** Pick up a run that is active on opening: follow it, or show what it waits for. */
  async attach() {
    const run = this.runs.latest();
    if (!run || (run.status !== "running" && run.status !== "requires_action")) return;
    this.run = { id: run.id, lastId: 0, status: run.status, required_action: run.required_action };
    if (run.status === "requires_action") {
      this.chat.setPending(run.required_action?.tool_uses);
      this.setBusy("requires_action");
      this.say(
        `The model called ${run.required_action?.tool_uses?.map((t) => t.name).join(", ")}: answer it in the conversation`,
      );
      return;
    }
    await this.follow({ runId: run.id, lastId: 0 });
  }

  streamPost(path, body, extra = {}) {
    return (signal) =>
      fetch(path, {
        method: "POST",
        headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream", ...extra }),
        body: JSON.stringify({ ...body, stream: true }),
        signal,
      });
  }

  async send() {
    const box = $("#message");
    const text = box.value;
    if (!text.trim() || !this.session || this.busy) return;
    box.value = "";
    const ok = await this.turn(
      this.streamPost(
        `/sessions/${this.session.id}/messages`,
        { content: text },
        { "Idempotency-Key": newId() },
      ),
      { reopen: true },
    );
    if (!ok && !box.value) box.value = text;
  }

  async edit(msg, text) {
    const id = this.session.id;
    if (!msg.parent_uuid) {
      // A new first message: unset the head so the turn starts a new root.
      await api("POST", `/sessions/${id}/clear`);
      this.chat.truncateAfter(null);
      await this.turn(
        this.streamPost(`/sessions/${id}/messages`, { content: text }, { "Idempotency-Key": newId() }),
        { reopen: true },
      );
      return;
    }
    this.chat.truncateAfter(msg.parent_uuid);
    await this.turn(
      this.streamPost(
        `/sessions/${id}/messages`,
        { content: text, parent_uuid: msg.parent_uuid },
        { "Idempotency-Key": newId() },
      ),
      { reopen: true },
    );
  }

  async regenerate(msg) {
    this.chat.truncateAfter(msg.parent_uuid);
    await this.turn(
      this.streamPost(`/sessions/${this.session.id}/messages/${msg.uuid}/regenerate`, {}, { "Idempotency-Key": newId() }),
      { reopen: true },
    );
  }

  async answer(results) {
    const { id, lastId } = this.run;
    this.chat.setPending([]);
    await this.turn(this.streamPost(`/sessions/${this.session.id}/runs/${id}/tool_results`, { results }), {
      runId: id,
      lastId,
      reopen: true, // results are accepted once: sending them again is safe
    });
  }

  /** Start a run with `open` and follow it to the end. Returns false when it did not start. */
  async turn(open, { runId = null, lastId = 0, reopen = false } = {}) {
    const known = new Set(this.runs.items.map((r) => r.id));
    const sessionId = this.session.id;
    const findRun = async () => {
      const page = await api("GET", `/sessions/${sessionId}/runs?limit=5`);
      return page.data.find((r) => !known.has(r.id))?.id || null;
    };
    return this.follow({ open, reopen, findRun, runId, lastId });
  }

  async follow({ open = null, reopen = false, findRun = null, runId = null, lastId = 0 }) {
    this.stopper?.abort();
    const stopper = new AbortController();
    this.stopper = stopper;
    this.run = { id: runId, lastId, status: "running" };
    this.chat.notes = [];
    this.setBusy("running");
    this.say("The model is replying…");
    try {
      const end = await followRun({
        sessionId: this.session.id,
        runId,
        lastId,
        open,
        reopen,
        findRun,
        stop: stopper.signal,
        onEvent: (name, data, id) => {
          if (name === "run.started") this.run.id = data.id;
          this.run.lastId = id;
          if (this.run.id) $("#cancel").disabled = false;
          this.chat.apply(name, data);
        },
        onLink: (state) => {
          if (state === "live") this.say("The model is replying…");
          else if (state === "offline")
            this.say(
              "Offline: the reply goes on at the service and resumes here when the network is back",
              "warn",
            );
          else this.say("Connection lost: reconnecting (the reply goes on at the service)…", "warn");
        },
      });
      this.run = {
        id: end.runId,
        lastId: end.lastId,
        status: end.data?.status,
        required_action: end.data?.required_action,
      };
      this.setBusy(end.event === "run.requires_action" ? "requires_action" : null);
      await this.refresh();
      const messages = {
        "run.completed": "Reply complete",
        "run.cancelled": "Cancelled",
        "run.failed": `The run failed: ${end.data?.error?.message || "unknown error"}`,
        "run.requires_action": `The model called ${end.data?.required_action?.tool_uses?.map((t) => t.name).join(", ")}: answer it in the conversation`,
      };
      this.say(messages[end.event], end.event === "run.failed" ? "error" : "");
      if (end.event === "run.requires_action") $("#chat-log form.answer textarea")?.focus();
      return true;
    } catch (err) {
      if (err instanceof Stopped) return false;
      this.error(err);
      this.run = null;
      this.setBusy(null);
      await this.refresh().catch(() => {});
      return false;
    } finally {
      if (this.stopper === stopper) this.stopper = null;
    }
  }

  async cancel() {
    if (!this.run?.id) return;
    await api("POST", `/sessions/${this.session.id}/runs/${this.run.id}/cancel`);
    if (this.busy === "requires_action") {
      // Nothing streams while a run waits for client tools: redraw from the service.
      this.run = null;
      this.setBusy(null);
      this.chat.notes = [];
      this.chat.note("Cancelled.");
      await this.refresh();
      this.say("Cancelled");
    }
  }

  async moveHead(uuid, message) {
    await api("PUT", `/sessions/${this.session.id}/head`, { json: { uuid } }).catch((err) => this.error(err));
    await this.refresh();
    this.say(message);
  }

  async sibling(msg, step) {
    const info = this.tree.siblings(msg);
    if (!info) return;
    const target = info.list[info.index - 1 + step];
    if (!target) return;
    await this.moveHead(this.tree.leaf(target.uuid), `Showing version ${info.index + step} of ${info.count}`);
  }

  async compact() {
    const instructions = $("#compact-instructions").value.trim();
    this.setBusy("compacting");
    this.say("Compacting…");
    try {
      const result = await api("POST", `/sessions/${this.session.id}/compact`, {
        json: instructions ? { instructions } : {},
      });
      $("#compact-instructions").value = "";
      this.setBusy(null);
      await this.refresh();
      this.say(
        `Compacted ${result.messages_compacted} messages: ${num(result.pre_tokens)} → ${num(result.post_tokens)} tokens`,
      );
    } catch (err) {
      this.setBusy(null);
      this.error(err);
    }
  }
}

function newId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}
