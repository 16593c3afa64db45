"""Micro-compaction: old results of re-runnable tools shown as a short placeholder.

Tool output is most of a long agent session, and the results of Read, Glob, Grep,
Write and Edit can be had again by calling the tool again. Clearing them frees a lot
of context without a model call. It is a projection (docs/architecture.md, invariant 3): stored
rows never change; a persisted watermark says "every compactable result up to this
node is shown as `CLEARED_TOOL_RESULT`", and `apply_micro` draws that picture on every
request. Because the watermark only moves forward and everything before it is drawn
the same way each time, the request prefix stays byte-identical between turns and the
prompt cache stays warm; moving it rewrites the prefix from the first newly cleared
result on, which costs a cache miss, so `plan_micro` moves it only in batches worth
that miss (or when the cache has gone cold anyway).

Results are matched to their tool_use by id (the name decides whether they are
compactable). Results answering the newest assistant message's tool uses are never
cleared: the model has not seen them yet.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.context.blocks import is_model_visible, tool_use_ids
from app.context.tokens import BLOCK_OVERHEAD_TOKENS, chars_to_tokens, estimate_block
from app.context.types import ASSISTANT, CLEARED_TOOL_RESULT, USER, Block, Node, extends


@dataclass(frozen=True, slots=True)
class MicroPlan:
    """Where to move the watermark and what that frees."""

    watermark: int  # index in the planned nodes of the node holding the last cleared result
    tokens_freed: int  # estimated, relative to the old watermark's projection
    results_cleared: int  # results newly shown as cleared


def _newest_assistant_uses(nodes: Sequence[Node]) -> frozenset[str]:
    """Tool use ids of the newest assistant message the model sees."""
    for node in reversed(nodes):
        if node.role == ASSISTANT and is_model_visible(node):
            return frozenset(tool_use_ids(node.content))
    return frozenset()


def _saving(block: Block, cleared_tokens: int) -> int:
    """Tokens freed by clearing the block. Negative for a result shorter than the
    placeholder: the figures stay exact, and such results alone never justify a move."""
    content = block.get("content")
    if type(content) is str:  # the common case, without building the cleared block
        return chars_to_tokens(len(content)) - cleared_tokens
    return estimate_block(block) - BLOCK_OVERHEAD_TOKENS - cleared_tokens


@dataclass
class ScanMemo:
    """The compactable results not cleared already of the last view scanned with this
    memo, so that a view that extends it (the next turn's) is scanned only in its new
    rows: per node holding some, its index and each result's block index and tool use
    id, in order (`found`), with the nodes that answer each id (`by_id`) and the tool
    names learnt (`names`). Tool uses are learnt going forward, so a result matches
    only a tool_use before it; a reused id keeps the name of its first use
    (normalize_for_api keeps only that one). Holds references to the rows (compared by
    identity), not copies."""

    nodes: tuple[Node, ...] = ()
    compactable: frozenset[str] = frozenset()
    names: dict[str, str] = field(default_factory=dict)
    found: list[tuple[int, list[tuple[int, str]]]] = field(default_factory=list)
    by_id: dict[str, list[int]] = field(default_factory=dict)  # id -> positions in `found`

    def resumes(self, nodes: Sequence[Node], compactable: frozenset[str]) -> bool:
        return compactable == self.compactable and extends(nodes, self.nodes)


def _scan(nodes: Sequence[Node], compactable: frozenset[str], memo: ScanMemo) -> ScanMemo:
    """`memo` brought up to `nodes`: scanned from where it left off when `nodes` extends
    its view, else afresh. This runs on every request: few calls per block."""
    if not memo.resumes(nodes, compactable):
        memo.nodes, memo.compactable = (), compactable
        memo.names, memo.found, memo.by_id = {}, [], {}
    names, found, by_id = memo.names, memo.found, memo.by_id
    for i in range(len(memo.nodes), len(nodes)):
        node = nodes[i]
        content = node.content
        if isinstance(content, str) or not content:
            continue
        if node.role == ASSISTANT:
            for block in content:
                if block.get("type") == "tool_use":
                    names.setdefault(block.get("id", ""), block.get("name", ""))
        elif node.role == USER:
            results = [
                (k, block["tool_use_id"])
                for k, block in enumerate(content)
                if block.get("type") == "tool_result"
                and names.get(block.get("tool_use_id", "")) in compactable
                and block.get("content") != CLEARED_TOOL_RESULT
            ]
            if results:
                for _, use_id in results:
                    by_id.setdefault(use_id, []).append(len(found))
                found.append((i, results))
    memo.nodes = tuple(nodes)
    return memo


def plan_micro(
    nodes: Sequence[Node],
    *,
    watermark: int | None,
    compactable: frozenset[str],
    keep_recent: int,
    batch_tokens: int,
    cache_cold: bool,
    memo: ScanMemo | None = None,
) -> MicroPlan | None:
    """The next watermark, or None when moving it is not worth a cache miss.

    The new watermark is the furthest node holding compactable results such that the
    newest `keep_recent` compactable results and every result answering the newest
    assistant message stay after it; it is strictly greater than `watermark`. A plan is
    returned when it frees at least `batch_tokens`, or anything at all when
    `cache_cold` (the prefix will be written afresh in any case); never for a move
    that frees nothing. Tokens are estimates relative to the projection at `watermark`,
    exactly the drop in `estimate_messages` between the two projections.

    `memo`: the caller's, kept from the last view it planned (the result is the same
    with or without one). With it a plan costs the view's new rows, the newest results
    (up to `keep_recent` and the protected ones) and those between the watermark and
    the plan's."""
    found = _scan(nodes, compactable, memo or ScanMemo())
    entries = found.found
    # Entries answering the newest assistant message's uses: never cleared.
    protected = _newest_assistant_uses(nodes)
    guarded: dict[int, int] = {}  # position in `entries` -> its protected results
    for use_id in protected:
        for position in found.by_id.get(use_id, ()):
            guarded[position] = guarded.get(position, 0) + 1
    # The watermark stays below the node of the oldest result that must stay: the
    # keep_recent-th newest one, and any answer to the newest assistant message.
    limit = len(nodes)
    kept = 0
    oldest_guarded = min(guarded, default=len(entries))
    for position in range(len(entries) - 1, -1, -1):
        i, results = entries[position]
        if position in guarded or kept < keep_recent:
            limit = i
        kept += len(results)
        if kept >= keep_recent and position <= oldest_guarded:
            break  # nothing older can lower the limit
    start = -1 if watermark is None else watermark
    first = bisect.bisect_right(entries, start, key=lambda entry: entry[0])
    cleared_tokens = chars_to_tokens(len(CLEARED_TOOL_RESULT))
    freed = count = 0
    last = None
    for i, results in entries[first:]:
        if i >= limit:
            break
        content = nodes[i].content
        for k, _ in results:
            freed += _saving(content[k], cleared_tokens)
            count += 1
        last = i
    if last is not None and freed > 0 and (freed >= batch_tokens or cache_cold):
        return MicroPlan(watermark=last, tokens_freed=freed, results_cleared=count)
    return None


@dataclass
class ClearMemo:
    """The rows up to the watermark as the last projection with this memo drew them, so
    that the next view with the same rows there, the same watermark and the same
    results spared draws them from here: the same objects again, which the memos of the
    steps after it (normalisation, estimates) compare by identity."""

    head: tuple[Node, ...] = ()  # the view's rows up to the watermark
    compactable: frozenset[str] = frozenset()
    ids: frozenset[str] = frozenset()  # the tool use ids of the results it could clear
    spared: frozenset[str] = frozenset()  # those left as answers to the newest call
    drawn: list[Node] = field(default_factory=list)  # `head` as projected

    def redraws(
        self, head: Sequence[Node], compactable: frozenset[str], protected: frozenset[str]
    ) -> bool:
        return (
            compactable == self.compactable
            and len(head) == len(self.head)
            and protected & self.ids == self.spared
            and extends(head, self.head)
        )


def apply_micro(
    nodes: Sequence[Node],
    watermark: int | None,
    compactable: frozenset[str],
    memo: ClearMemo | None = None,
) -> list[Node]:
    """The view with every compactable result at or before `watermark` shown as
    `CLEARED_TOOL_RESULT` (is_error and the other keys kept; the node's token estimate
    lowered by the saving). Untouched nodes are the same objects; with `memo`, so are
    the cleared ones of the view it last drew, when nothing up to the watermark changed
    (the result is the same with or without one)."""
    out = list(nodes)
    if watermark is None or watermark < 0:
        return out
    head = nodes[: watermark + 1]
    protected = _newest_assistant_uses(nodes)
    if memo is not None and memo.redraws(head, compactable, protected):
        out[: watermark + 1] = memo.drawn
        return out
    cleared_tokens = chars_to_tokens(len(CLEARED_TOOL_RESULT))
    ids: set[str] = set()
    for i, results in _scan(head, compactable, ScanMemo()).found:
        node = nodes[i]
        content = list(node.content)
        saved = cleared = 0
        for k, use_id in results:
            ids.add(use_id)
            if use_id in protected:
                continue
            block = content[k]
            saved += _saving(block, cleared_tokens)
            content[k] = {**block, "content": CLEARED_TOOL_RESULT}
            cleared += 1
        if cleared:
            estimate = max(node.token_estimate - saved, 1) if node.token_estimate > 0 else 0
            out[i] = node.with_content(content, estimate)
    if memo is not None:
        memo.head, memo.compactable, memo.drawn = tuple(head), compactable, out[: watermark + 1]
        memo.ids = frozenset(ids)
        memo.spared = protected & memo.ids
    return out
