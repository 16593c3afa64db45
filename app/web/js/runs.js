// The runs of a session (status, usage) and the event inspector: a run's raw
// Server-Sent Events as the service stores and replays them, from any event id on.

import { api, headers, problemOf } from "./api.js";
import { $, h, fill, num, short, when } from "./dom.js";

export class RunsPanel {
  constructor({ onError }) {
    this.root = $("#runs-body");
    this.viewer = $("#events-view");
    this.onError = onError;
    this.sessionId = null;
    this.items = [];
    this.cursor = null;
    this.inspecting = null; // {runId, controller}
  }

  async load(sessionId) {
    if (sessionId !== this.sessionId) this.closeInspector();
    this.sessionId = sessionId;
    if (!sessionId) {
      fill(this.root, h("p", { class: "note" }, "No session."));
      return;
    }
    const page = await api("GET", `/sessions/${sessionId}/runs?limit=20`);
    this.items = page.data;
    this.cursor = page.next_cursor;
    this.draw();
  }

  async more() {
    const page = await api(
      "GET",
      `/sessions/${this.sessionId}/runs?limit=20&after=${encodeURIComponent(this.cursor)}`,
    );
    this.items.push(...page.data);
    this.cursor = page.next_cursor;
    this.draw();
  }

  latest() {
    return this.items[0] || null;
  }

  draw() {
    if (!this.items.length) {
      fill(this.root, h("p", { class: "note" }, "No runs yet."));
      return;
    }
    const rows = this.items.map((run) =>
      h(
        "tr",
        { dataset: { runId: run.id } },
        h(
          "td",
          {},
          h("span", { class: "kind" }, run.kind),
          " ",
          h(
            "button",
            {
              type: "button",
              title: `Events of run ${run.id}`,
              "aria-label": `Events of run ${short(run.id)}`,
              onclick: () => this.inspect(run.id, 0).catch(this.onError),
            },
            short(run.id),
          ),
        ),
        h(
          "td",
          {},
          h("span", { class: `status ${run.status}` }, run.status.replace("_", " ")),
          run.error ? h("div", { class: "error" }, run.error.message) : null,
        ),
        h("td", { class: "num" }, num(run.usage.input_tokens)),
        h("td", { class: "num" }, num(run.usage.output_tokens)),
        h("td", { class: "num" }, num(run.usage.cache_read_input_tokens)),
      ),
    );
    fill(
      this.root,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "runs" },
          h("caption", { class: "sr-only" }, "Runs, newest first"),
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              ["Run (events)", "Status", "Input", "Output", "Cache reads"].map((t) =>
                h("th", { scope: "col" }, t),
              ),
            ),
          ),
          h("tbody", {}, rows),
        ),
      ),
      this.cursor
        ? h("button", { type: "button", onclick: () => this.more().catch(this.onError) }, "More runs")
        : null,
    );
  }

  closeInspector() {
    this.inspecting?.controller.abort();
    this.inspecting = null;
    fill(this.viewer);
  }

  /** The run's raw events after `after`, read as they arrive (live while it runs). */
  async inspect(runId, after) {
    this.closeInspector();
    const controller = new AbortController();
    this.inspecting = { runId, controller };
    const raw = h("pre", { class: "raw-events", tabindex: "0", "aria-label": "Raw events" });
    const count = h("span", { class: "note", role: "status" }, "loading…");
    const from = h("input", {
      type: "number",
      min: "0",
      value: String(after),
      class: "narrow",
      "aria-label": "Replay after event id",
    });
    const run = this.items.find((r) => r.id === runId);
    fill(
      this.viewer,
      h(
        "section",
        { class: "inspector-view", "aria-label": `Events of run ${short(runId)}` },
        h(
          "header",
          { class: "row" },
          h("strong", {}, `Run ${short(runId)}`),
          run ? h("span", { class: "note" }, `${run.kind} · ${when(run.created_at)}`) : null,
          count,
        ),
        h(
          "div",
          { class: "row" },
          h("label", { class: "inline" }, "Replay after event ", from),
          h(
            "button",
            {
              type: "button",
              onclick: () => this.inspect(runId, Number(from.value) || 0).catch(this.onError),
            },
            "Replay",
          ),
          h("button", { type: "button", onclick: () => this.closeInspector() }, "Close events"),
        ),
        raw,
      ),
    );
    this.viewer.scrollIntoView({ block: "nearest" });
    const response = await fetch(`/sessions/${this.sessionId}/runs/${runId}/events?after=${after}`, {
      headers: headers({ Accept: "text/event-stream" }),
      signal: controller.signal,
    });
    if (!response.ok) throw await problemOf(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    const events = () => (text.match(/^id: /gm) || []).length;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += value;
        raw.append(value);
        count.textContent = `${events()} events`;
      }
      count.textContent = `${events()} events (the run has settled)`;
    } catch (err) {
      if (err?.name !== "AbortError") throw err;
    }
  }
}
