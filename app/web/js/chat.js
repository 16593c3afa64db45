// The conversation: messages of the chain as the service stores them, and the reply
// being streamed. Thinking and tool calls are folded (<details>); a tool call shows its
// input and result, and a form while the run waits for the page to answer it.

import { h, fill, num, pretty, when } from "./dom.js";

const CLEARED = "[Old tool result content cleared]";

export class ChatView {
  /** actions: edit(msg, text), regenerate(msg), rewind(msg), forkAt(msg), sibling(msg, step),
   * answer(results) */
  constructor(root, actions) {
    this.root = root;
    this.actions = actions;
    this.reset();
  }

  reset() {
    this.messages = [];
    this.results = new Map(); // tool_use_id -> {content, is_error}
    this.pending = new Map(); // tool_use_id -> {id, name, input}
    this.answers = new Map(); // tool_use_id -> {content, is_error}, until all are answered
    this.partials = new Map(); // uuid -> {el, blocks: Map(index -> {kind, node, text})}
    this.toolUseIds = new Set(); // tool calls on show: their results are drawn inside them
    this.view = "full";
    this.cleared = new Set();
    this.siblings = () => null;
    this.busy = false;
    this.notes = []; // what the last run reported (discarded, compacted, failed), kept across redraws
  }

  /** Draw the chain. state: {messages, view, cleared, siblings, pending, busy} */
  render(state) {
    this.partials.clear();
    Object.assign(this, state);
    this.results = new Map();
    this.toolUseIds = new Set();
    for (const msg of this.messages) this.collectResults(msg);
    const items = [];
    if (this.view === "api" && this.messages.length) {
      items.push(
        h(
          "div",
          { class: "divider view-note", role: "note" },
          "The model's view: what the next request sends (compaction applied)",
        ),
      );
    }
    for (const msg of this.messages) {
      const el = this.messageEl(msg);
      if (el) items.push(el);
    }
    items.push(...this.notes.map((n) => noteEl(n)));
    if (!items.length) items.push(h("p", { class: "empty" }, "No messages yet. Say something below."));
    fill(this.root, items);
    this.scroll(true);
  }

  collectResults(msg) {
    for (const block of msg.content || []) {
      if (block.type === "tool_use") this.toolUseIds.add(block.id);
      else if (block.type === "tool_result")
        this.results.set(block.tool_use_id, { content: block.content, is_error: block.is_error });
    }
  }

  // --- one message ----------------------------------------------------------------

  messageEl(msg) {
    if (msg.subtype === "compact_boundary") return boundaryEl(msg);
    if (msg.subtype === "compact_summary") return summaryEl(msg);
    if (msg.subtype === "collapsed") return collapsedEl(msg);
    const blocks = msg.content || [];
    const shown = blocks.filter((b) => b.type !== "tool_result" || !this.toolUseIds.has(b.tool_use_id));
    if (msg.role === "user" && !shown.length) return null; // results shown in their tool calls
    if (msg.type !== "user" && msg.type !== "assistant") {
      return h(
        "div",
        { class: "note-row", role: "note", dataset: { uuid: msg.uuid } },
        `${msg.type}${msg.subtype ? " · " + msg.subtype : ""}`,
      );
    }
    const assistant = msg.role === "assistant";
    const body = h(
      "div",
      { class: "blocks" },
      shown.map((b) => this.blockEl(b)),
    );
    const article = h(
      "article",
      {
        class: `msg ${assistant ? "assistant" : "user"}${msg.is_meta ? " meta-msg" : ""}`,
        dataset: { uuid: msg.uuid },
        "aria-label": assistant ? "Assistant" : "You",
      },
      h(
        "header",
        {},
        h("span", { class: "who" }, assistant ? "Assistant" : "You"),
        this.siblingNav(msg),
        h("span", { class: "when" }, assistant && msg.model ? `${msg.model} · ` : "", when(msg.created_at)),
      ),
      body,
      this.actionsEl(msg, body),
    );
    return article;
  }

  siblingNav(msg) {
    const info = this.siblings(msg);
    if (!info || info.count < 2) return null;
    return h(
      "span",
      { class: "siblings", role: "group", "aria-label": "Versions" },
      h(
        "button",
        {
          type: "button",
          class: "icon",
          "aria-label": "Previous version",
          disabled: this.busy || info.index === 1,
          onclick: () => this.actions.sibling(msg, -1),
        },
        "‹",
      ),
      h("span", { class: "count" }, `${info.index} of ${info.count}`),
      h(
        "button",
        {
          type: "button",
          class: "icon",
          "aria-label": "Next version",
          disabled: this.busy || info.index === info.count,
          onclick: () => this.actions.sibling(msg, +1),
        },
        "›",
      ),
    );
  }

  actionsEl(msg, body) {
    if (msg.is_meta || this.view === "api") return null;
    const assistant = msg.role === "assistant";
    const text = (msg.content || [])
      .filter((b) => b.type === "text")
      .map((b) => b.text)
      .join("\n");
    const disabled = this.busy;
    return h(
      "footer",
      { class: "actions" },
      assistant
        ? h("button", { type: "button", disabled, onclick: () => this.actions.regenerate(msg) }, "Regenerate")
        : h(
            "button",
            { type: "button", disabled: disabled || !text, onclick: () => this.editForm(msg, body, text) },
            "Edit",
          ),
      h(
        "button",
        {
          type: "button",
          disabled,
          "aria-label": "Rewind to here",
          title: "Make this message the head",
          onclick: () => this.actions.rewind(msg),
        },
        "Rewind here",
      ),
      h("button", { type: "button", disabled, onclick: () => this.actions.forkAt(msg) }, "Fork from here"),
    );
  }

  editForm(msg, body, text) {
    const area = h("textarea", { rows: 3, "aria-label": "Edited message" });
    area.value = text;
    const original = [...body.childNodes];
    const form = h(
      "form",
      {
        class: "edit",
        onsubmit: (event) => {
          event.preventDefault();
          if (area.value.trim()) this.actions.edit(msg, area.value);
        },
      },
      area,
      h(
        "div",
        { class: "row" },
        h("button", { type: "submit", class: "primary" }, "Save and send"),
        h("button", { type: "button", onclick: () => fill(body, original) }, "Discard edit"),
      ),
    );
    area.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    fill(body, form);
    area.focus();
  }

  // --- blocks ---------------------------------------------------------------------

  blockEl(block) {
    switch (block.type) {
      case "text":
        return h("div", { class: "text" }, block.text);
      case "thinking":
        return fold("thinking", "Thinking", h("div", { class: "text" }, block.thinking));
      case "redacted_thinking":
        return fold(
          "thinking",
          "Thinking (redacted by the provider)",
          h("p", { class: "note" }, "Encrypted; sent back to the model as is."),
        );
      case "tool_use":
        return this.toolEl(block);
      case "tool_result":
        return fold("tool", "Tool result", resultEl({ content: block.content, is_error: block.is_error }));
      case "image":
      case "document":
        return h("p", { class: "badge" }, `[${block.type}]`);
      default:
        return fold("other", block.type, h("pre", {}, pretty(block)));
    }
  }

  toolEl(block) {
    const details = h("details", { class: "fold tool", dataset: { toolUseId: block.id } });
    this.fillTool(details, block);
    return details;
  }

  fillTool(details, block) {
    const result = this.results.get(block.id);
    const pending = this.pending.get(block.id);
    const cleared = this.cleared.has(block.id) || (result && resultText(result.content) === CLEARED);
    let state = "running";
    if (pending) state = "waiting for your answer";
    else if (result) state = result.is_error ? "error" : "done";
    details.open = details.open || Boolean(pending);
    fill(
      details,
      h(
        "summary",
        {},
        h("span", { class: "kind" }, "Tool call"),
        " ",
        h("strong", {}, block.name),
        " ",
        h("span", { class: `state ${state.split(" ")[0]}` }, state),
        cleared ? h("span", { class: "badge cleared" }, "cleared from the model's view") : null,
      ),
      h("h4", {}, "Input"),
      h("pre", { class: "json" }, pretty(block.input)),
      result ? [h("h4", {}, "Result"), resultEl(result)] : null,
      pending ? this.answerForm(block) : null,
    );
  }

  answerForm(block) {
    const saved = this.answers.get(block.id);
    const area = h("textarea", { rows: 2, name: "content", "aria-label": `Result for ${block.name}` });
    area.value = saved?.content ?? "";
    const error = h("input", { type: "checkbox", name: "is_error", checked: Boolean(saved?.is_error) });
    const note = h("span", { class: "note", role: "status" });
    return h(
      "form",
      {
        class: "answer",
        "aria-label": `Answer ${block.name}`,
        onsubmit: (event) => {
          event.preventDefault();
          this.answers.set(block.id, { tool_use_id: block.id, content: area.value, is_error: error.checked });
          const missing = [...this.pending.keys()].filter((id) => !this.answers.has(id));
          if (missing.length) {
            note.textContent = `Saved; ${missing.length} more to answer.`;
            return;
          }
          const results = [...this.pending.keys()].map((id) => this.answers.get(id));
          this.answers.clear();
          this.actions.answer(results);
        },
      },
      h("label", {}, `Result for ${block.name}`, area),
      h("label", { class: "inline" }, error, " Report as an error"),
      h("div", { class: "row" }, h("button", { type: "submit", class: "primary" }, "Send result"), note),
    );
  }

  setPending(toolUses) {
    this.pending = new Map((toolUses || []).map((use) => [use.id, use]));
    for (const use of this.pending.values()) this.refreshTool(use.id);
  }

  refreshTool(id) {
    for (const details of this.root.querySelectorAll("details.tool[data-tool-use-id]")) {
      if (details.dataset.toolUseId !== id) continue;
      const use = this.findToolUse(id);
      if (use) this.fillTool(details, use);
    }
  }

  findToolUse(id) {
    for (const msg of this.messages) {
      for (const block of msg.content || []) if (block.type === "tool_use" && block.id === id) return block;
    }
    for (const partial of this.partials.values()) {
      for (const part of partial.blocks.values())
        if (part.kind === "tool_use" && part.block.id === id) return part.block;
    }
    return null;
  }

  // --- the live reply ---------------------------------------------------------------

  /** Forget the messages after `uuid` (null: all), before a turn continues from it. */
  truncateAfter(uuid) {
    const index = uuid ? this.messages.findIndex((m) => m.uuid === uuid) : -1;
    const drop = this.messages.slice(index + 1);
    this.messages = this.messages.slice(0, index + 1);
    for (const msg of drop) this.root.querySelector(`[data-uuid="${msg.uuid}"]`)?.remove();
    this.root.querySelector(".empty")?.remove();
  }

  apply(event, data) {
    switch (event) {
      case "message.started":
        this.partial(data.uuid);
        break;
      case "text.delta":
      case "thinking.delta":
        this.delta(data, event === "text.delta" ? "text" : "thinking");
        break;
      case "tool_use": {
        const partial = this.partial(data.message_uuid);
        if (!partial) break;
        const block = { type: "tool_use", id: data.id, name: data.name, input: data.input };
        this.toolUseIds.add(data.id);
        const el = this.toolEl(block);
        partial.blocks.set(`tool:${data.id}`, { kind: "tool_use", block, node: el });
        partial.body.append(el);
        break;
      }
      case "tool_result":
        this.results.set(data.tool_use_id, { content: data.content, is_error: data.is_error });
        this.refreshTool(data.tool_use_id);
        break;
      case "message.completed":
        this.completed(data);
        break;
      case "message.discarded": {
        const partial = this.partials.get(data.uuid);
        partial?.el.remove();
        this.partials.delete(data.uuid);
        this.note(`A partial reply was discarded (${data.reason || "retrying"}); the model is asked again.`);
        break;
      }
      case "compaction.started":
        this.root.append(
          noteEl({
            text: `Compacting the context (${data.trigger}, ${num(data.pre_tokens)} tokens)…`,
            kind: "compacting",
          }),
        );
        break;
      case "compaction.completed":
        this.root.querySelector(".note-row.compacting")?.remove();
        this.note(
          `Compacted the context (${data.trigger}): ${num(data.pre_tokens)} → ${num(data.post_tokens)} tokens.`,
        );
        break;
      case "run.requires_action":
        this.setPending(data.required_action?.tool_uses);
        break;
      case "run.failed":
        this.note(`The run failed: ${data.error?.message || "unknown error"}`, "error", "alert");
        break;
      case "run.cancelled":
        this.note("Cancelled.");
        break;
      default:
        break;
    }
    this.scroll();
  }

  partial(uuid) {
    if (this.partials.has(uuid)) return this.partials.get(uuid);
    if (this.messages.some((m) => m.uuid === uuid)) return null; // replayed: already complete
    const body = h("div", { class: "blocks" });
    const el = h(
      "article",
      { class: "msg assistant streaming", dataset: { uuid }, "aria-label": "Assistant", "aria-busy": "true" },
      h("header", {}, h("span", { class: "who" }, "Assistant"), h("span", { class: "when" }, "writing…")),
      body,
    );
    this.root.querySelector(".empty")?.remove();
    this.root.append(el);
    const partial = { el, body, blocks: new Map() };
    this.partials.set(uuid, partial);
    return partial;
  }

  delta(data, kind) {
    const partial = this.partial(data.message_uuid);
    if (!partial) return;
    const key = `${kind}:${data.index}`;
    let part = partial.blocks.get(key);
    if (!part) {
      const node = document.createTextNode("");
      const holder = h("div", { class: "text" }, node);
      partial.body.append(kind === "thinking" ? fold("thinking", "Thinking…", holder) : holder);
      part = { kind, node, text: "" };
      partial.blocks.set(key, part);
    }
    const piece = kind === "text" ? data.text : data.thinking;
    part.text += piece;
    part.node.appendData(piece);
  }

  completed(msg) {
    const partial = this.partials.get(msg.uuid);
    if (partial) {
      const streamed = [...partial.blocks.values()]
        .filter((p) => p.kind === "text")
        .map((p) => p.text)
        .join("");
      const stored = (msg.content || [])
        .filter((b) => b.type === "text")
        .map((b) => b.text)
        .join("");
      if (streamed !== stored)
        console.error("stream mismatch: the streamed text differs from the stored message", msg.uuid);
      this.partials.delete(msg.uuid);
    }
    const index = this.messages.findIndex((m) => m.uuid === msg.uuid);
    if (index >= 0) this.messages[index] = msg;
    else this.messages.push(msg);
    this.collectResults(msg);
    const el = this.messageEl(msg);
    const old = partial?.el || this.root.querySelector(`[data-uuid="${msg.uuid}"]`);
    this.root.querySelector(".empty")?.remove();
    if (old && el) old.replaceWith(el);
    else if (old) old.remove();
    else if (el) this.root.append(el);
    for (const block of msg.content || [])
      if (block.type === "tool_result") this.refreshTool(block.tool_use_id);
  }

  /** A line about the run, kept (after the messages) until the next run starts. */
  note(text, kind = "", role = "note") {
    const note = { text, kind, role };
    this.notes.push(note);
    this.root.append(noteEl(note));
  }

  scroll(force = false) {
    const near = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 160;
    if (force || near) this.root.scrollTop = this.root.scrollHeight;
  }
}

function noteEl({ text, kind = "", role = "note" }) {
  return h("div", { class: `note-row ${kind}`, role }, text);
}

function fold(kind, title, ...body) {
  return h("details", { class: `fold ${kind}` }, h("summary", {}, title), ...body);
}

function resultText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content))
    return content.map((b) => (b.type === "text" ? b.text : `[${b.type}]`)).join("\n");
  return pretty(content);
}

function resultEl(result) {
  const text = resultText(result.content);
  return h(
    "pre",
    { class: `result${result.is_error ? " error" : ""}${text === CLEARED ? " cleared" : ""}` },
    text,
  );
}

function boundaryEl(msg) {
  const meta = msg.metadata || {};
  const covered = meta.covered?.messages;
  return h(
    "div",
    {
      class: "divider boundary",
      role: "separator",
      dataset: { uuid: msg.uuid },
      "aria-label": "Compaction boundary",
    },
    h(
      "span",
      {},
      `Compacted (${meta.trigger || "?"})`,
      covered ? ` · ${covered} messages summarised` : "",
      meta.pre_tokens != null ? ` · ${num(meta.pre_tokens)} → ${num(meta.post_tokens)} tokens` : "",
      meta.instructions ? ` · instructions: “${meta.instructions}”` : "",
    ),
  );
}

function summaryEl(msg) {
  const text = (msg.content || []).map((b) => (b.type === "text" ? b.text : "")).join("\n");
  return h(
    "details",
    { class: "fold summary", dataset: { uuid: msg.uuid } },
    h("summary", {}, "Summary of the earlier conversation"),
    h("div", { class: "text" }, text),
  );
}

function collapsedEl(msg) {
  const info = msg.metadata?.collapse || {};
  const text = (msg.content || []).map((b) => (b.type === "text" ? b.text : "")).join("\n");
  return h(
    "details",
    { class: "fold summary collapsed", dataset: { uuid: msg.uuid } },
    h("summary", {}, `Collapsed span (${num(info.tokens_saved)} tokens saved)`),
    h("div", { class: "text" }, text),
  );
}
