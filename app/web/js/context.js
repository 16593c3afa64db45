// How full the context is: the estimate against the auto-compaction threshold, split by
// what fills it (system, tools, messages, tool results), and the last compaction.

import { h, fill, num, when } from "./dom.js";

const PARTS = [
  ["system", "System"],
  ["tools", "Tools"],
  ["messages", "Messages"],
  ["tool_results", "Tool results"],
];

export function renderContext(root, ctx, session) {
  if (!ctx) {
    fill(root, h("p", { class: "note" }, "No session."));
    return;
  }
  const threshold = ctx.auto_compact_threshold;
  const share = Math.min(1, ctx.estimated_tokens / threshold);
  const parts = ctx.breakdown;
  const total = PARTS.reduce((sum, [key]) => sum + parts[key], 0) || 1;
  const bar = h("div", { class: "bar" });
  for (const [key, label] of PARTS) {
    const seg = h("span", { class: `seg ${key}`, title: `${label}: ${num(parts[key])} tokens` });
    // Proportions of the breakdown, scaled to the (usage-anchored) estimate.
    seg.style.width = `${(100 * share * parts[key]) / total}%`;
    bar.append(seg);
  }
  const warn = h("span", { class: "mark warning", title: `Warning at ${num(ctx.warning_threshold)} tokens` });
  warn.style.left = `${Math.max(0, Math.min(100, (100 * ctx.warning_threshold) / threshold))}%`;
  if (ctx.warning_threshold > 0 && ctx.warning_threshold < threshold) bar.append(warn);
  const percent = (100 * ctx.estimated_tokens) / threshold;
  const auto = session?.compaction?.auto !== false;
  const last = ctx.last_compaction;
  fill(
    root,
    h(
      "div",
      {
        class: "meter",
        role: "meter",
        "aria-label": "Context used before auto-compaction",
        "aria-valuemin": 0,
        "aria-valuemax": threshold,
        "aria-valuenow": ctx.estimated_tokens,
        "aria-valuetext": `${num(ctx.estimated_tokens)} of ${num(threshold)} tokens (${percent.toFixed(1)}%)`,
      },
      bar,
    ),
    h(
      "p",
      { class: "meter-text" },
      h("strong", {}, num(ctx.estimated_tokens)),
      ` of ${num(threshold)} tokens before auto-compaction`,
      auto ? "" : " (auto-compaction is off)",
      ` · ${percent < 0.1 && percent > 0 ? "<0.1" : percent.toFixed(1)}%`,
    ),
    h(
      "dl",
      { class: "breakdown" },
      PARTS.map(([key, label]) => [
        h("dt", {}, h("span", { class: `swatch ${key}`, "aria-hidden": "true" }), label),
        h("dd", {}, num(parts[key])),
      ]),
    ),
    h(
      "p",
      { class: "note" },
      `Window ${num(ctx.context_window)} · output up to ${num(ctx.max_output_tokens)}`,
      ctx.warning_threshold > 0 ? ` · warning at ${num(ctx.warning_threshold)}` : "",
    ),
    last
      ? h(
          "p",
          { class: "note last-compaction" },
          `Last compaction (${last.trigger}) ${when(last.created_at)}: ${num(last.pre_tokens)} → ${num(last.post_tokens)} tokens, ${last.covered?.messages ?? "?"} messages summarised`,
        )
      : h("p", { class: "note" }, "Not compacted yet."),
  );
}
