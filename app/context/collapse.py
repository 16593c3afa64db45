"""Context collapse: finished sub-tasks shown to the model as their summaries.

Between micro-compaction (free, but it only clears tool output) and auto-compaction
(a model call that forgets everything before the cut at once), a long session can
give up detail gradually: after a run, older completed spans are summarised in the
background, and once the estimate nears the threshold the model sees each such span
as one short user message instead of its messages. Like micro-compaction this is a
projection over the same stored rows; the spans and their summaries are rows of their
own, tied to positions on the chain.

A span is one or more whole turns: it starts at a clean user turn and ends just before
a later one, so it holds whole tool loops and never separates a tool_use from its
result or the rows of one response. The newest turns are never collapsed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from app.context.cut import cut_kinds
from app.context.tokens import estimate_content, node_tokens
from app.context.types import COLLAPSED, USER, Block, Node

DEFAULT_MIN_SPAN_TOKENS = 2_000  # smaller spans are merged with the next turns
COLLAPSED_TEMPLATE = "[Summary of earlier work: {summary}]"


def plan_collapse_spans(
    nodes: Sequence[Node],
    *,
    keep_recent_turns: int = 2,
    min_span_tokens: int = DEFAULT_MIN_SPAN_TOKENS,
    skip: Sequence[tuple[int, int]] = (),
) -> list[tuple[int, int]]:
    """Completed spans `(start, end)` (inclusive indices), oldest first, that could be
    collapsed. Turns are taken whole and in order; consecutive turns are merged until a
    span holds at least `min_span_tokens` (a remainder below it is not returned). The
    newest `keep_recent_turns` turns (at least the current, unfinished one) stay out.
    `skip` holds spans already collapsed or planned (indices into `nodes`): a turn
    overlapping one is left out and ends the merge. Planned over a projected view, a
    collapsed node is a turn of its own that is left out the same way. The
    result is deterministic, so planning again after more turns returns the same
    older spans."""
    n = len(nodes)
    kinds = cut_kinds(nodes)
    # A collapsed node (when planning over a projected view) ends the turn before it
    # and is a turn of its own, never collapsed again.
    starts = [i for i in range(n) if kinds[i] is True or nodes[i].subtype == COLLAPSED]
    completed = len(starts) - max(keep_recent_turns, 1)
    if completed <= 0:
        return []
    tokens = [0] * (n + 1)
    taken = [0] * (n + 1)  # prefix counts of nodes that may not be collapsed again
    marks = [0] * (n + 1)
    for start, end in skip:
        if start <= end and start < n and end >= 0:
            marks[max(start, 0)] += 1
            marks[min(end, n - 1) + 1] -= 1
    depth = 0
    for i, node in enumerate(nodes):
        depth += marks[i]
        tokens[i + 1] = tokens[i] + node_tokens(node)
        taken[i + 1] = taken[i] + (1 if depth > 0 or node.subtype == COLLAPSED else 0)
    spans: list[tuple[int, int]] = []
    open_start: int | None = None
    for k in range(completed):
        start, end = starts[k], starts[k + 1] - 1
        if taken[end + 1] - taken[start]:
            open_start = None
            continue
        if open_start is None:
            open_start = start
        if tokens[end + 1] - tokens[open_start] >= min_span_tokens:
            spans.append((open_start, end))
            open_start = None
    return spans


@functools.lru_cache(maxsize=1024)
def collapsed_node(summary: str, collapse_id: str) -> Node:
    """The synthetic user message that stands for a collapsed span: the same object each
    time a view draws it (kept for the most recent spans), so the rows after it keep
    being compared by identity (`normalize.MergeMemo` and the other memos). Read-only."""
    content: list[Block] = [
        {"type": "text", "text": COLLAPSED_TEMPLATE.format(summary=summary.strip())}
    ]
    return Node(
        uuid=collapse_id,
        type=USER,
        role=USER,
        content=content,
        subtype=COLLAPSED,
        token_estimate=estimate_content(content),
    )


def apply_collapses(
    nodes: Sequence[Node], spans: Sequence[tuple[int, int, str, str]]
) -> list[Node]:
    """The view with each `(start, end, summary_text, collapse_id)` span replaced by one
    `collapsed_node`. Spans may come in any order; overlapping or out-of-range spans
    raise ValueError. Nodes outside the spans are the same objects."""
    out: list[Node] = []
    position = 0
    for start, end, summary, collapse_id in sorted(spans, key=lambda span: span[0]):
        if start < position or end < start or end >= len(nodes):
            raise ValueError(f"collapse span ({start}, {end}) overlaps or is out of range")
        out.extend(nodes[position:start])
        out.append(collapsed_node(summary, collapse_id))
        position = end + 1
    out.extend(nodes[position:])
    return out
