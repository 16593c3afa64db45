"""Tool results cut to their head and tail, so the newest API round fits a budget.

A compaction keeps the newest messages verbatim within a budget. When the newest API
round alone is larger (one Read of a big file, a long build log), summarising it away
would take the very results the model needs for its next step; instead it is kept with
each long result cut to its beginning and its end around a marker saying how much was
left out. Only the text of tool results is cut (a string content, or the text blocks
nested in it); tool calls, the assistant's own words and media stay whole, so the round
is the same valid request, only shorter.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.context.tokens import CHARS_PER_TOKEN, estimate_content, estimate_messages
from app.context.types import USER, Block, Node

SHRUNK_MARKER = (
    "\n[... {omitted} characters of this tool result were left out when the conversation "
    "was compacted ...]\n"
)
MIN_RESULT_CHARS = 1_000  # a cut result keeps at least this much of its text
HEAD_SHARE = 0.7  # of what is kept, the share taken from the beginning


MARKER_CHARS = len(SHRUNK_MARKER) + 8  # the marker with its number filled in, at most


def shrink_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters (head and tail) around `SHRUNK_MARKER`; as it
    is when that would not make it shorter."""
    if len(text) <= limit + MARKER_CHARS:
        return text
    head = int(limit * HEAD_SHARE)
    tail = limit - head
    marker = SHRUNK_MARKER.format(omitted=len(text) - limit)
    return text[:head] + marker + text[len(text) - tail :]


def _texts(block: Block) -> list[str]:
    """The strings of a tool_result that may be cut."""
    content = block.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            str(nested["text"])
            for nested in content
            if isinstance(nested, dict)
            and nested.get("type") == "text"
            and isinstance(nested.get("text"), str)
        ]
    return []


def _cut_block(block: Block, limit: int) -> Block:
    content = block.get("content")
    if isinstance(content, str):
        return {**block, "content": shrink_text(content, limit)}
    cut: list[object] = []
    for nested in content or []:
        if isinstance(nested, dict) and nested.get("type") == "text":
            nested = {**nested, "text": shrink_text(str(nested.get("text") or ""), limit)}
        cut.append(nested)
    return {**block, "content": cut}


def _freed(lengths: list[int], limit: int) -> int:
    """Characters that cutting every text to `limit` frees (markers counted)."""
    return sum(max(length - limit - MARKER_CHARS, 0) for length in lengths)


def _limit(lengths: list[int], excess_chars: int) -> int | None:
    """The largest per-text limit (at least MIN_RESULT_CHARS) that takes at least
    `excess_chars` out of `lengths`; the floor itself when nothing larger does; None
    when cutting frees nothing."""
    if _freed(lengths, MIN_RESULT_CHARS) <= 0:
        return None
    low, high = MIN_RESULT_CHARS, max(lengths)
    while low < high:  # the largest limit whose cut still frees enough
        mid = (low + high + 1) // 2
        if _freed(lengths, mid) >= excess_chars:
            low = mid
        else:
            high = mid - 1
    return low


def shrink_results(nodes: Sequence[Node], budget: int) -> list[Node]:
    """`nodes` with their tool results cut to head and tail so that their estimate
    fits `budget`, as nearly as `MIN_RESULT_CHARS` per text allows. Nodes left as they
    were are the same objects; nothing changes when they already fit."""
    total = estimate_messages(nodes)
    if total <= budget:
        return list(nodes)
    lengths = [
        len(text)
        for node in nodes
        if node.role == USER
        for block in node.content
        if block.get("type") == "tool_result"
        for text in _texts(block)
    ]
    limit = _limit(lengths, int((total - budget) * CHARS_PER_TOKEN))
    if limit is None:
        return list(nodes)
    out: list[Node] = []
    for node in nodes:
        if node.role != USER or not any(
            block.get("type") == "tool_result"
            and any(len(t) > limit + MARKER_CHARS for t in _texts(block))
            for block in node.content
        ):
            out.append(node)
            continue
        content = [
            _cut_block(block, limit) if block.get("type") == "tool_result" else block
            for block in node.content
        ]
        out.append(node.with_content(content, estimate_content(content)))
    return out
