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

from collections.abc import Sequence
from dataclasses import dataclass

from app.context.blocks import is_model_visible, tool_use_ids
from app.context.tokens import BLOCK_OVERHEAD_TOKENS, chars_to_tokens, estimate_block
from app.context.types import ASSISTANT, CLEARED_TOOL_RESULT, USER, Block, Node


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


def _scan(
    nodes: Sequence[Node], compactable: frozenset[str], protected: frozenset[str]
) -> list[tuple[int, list[int], int]]:
    """Every node holding compactable results not cleared already: its index, the
    positions of the clearable ones, and how many it holds that answer `protected`
    uses (never cleared). Tool uses are learnt going forward, so a result matches only
    a tool_use before it; a reused id keeps the name of its first use (normalize_for_api
    keeps only that one). This runs on every request: one pass, few calls per block."""
    names: dict[str, str] = {}  # id -> name of the first tool_use with that id
    found: list[tuple[int, list[int], int]] = []
    for i, node in enumerate(nodes):
        content = node.content
        if isinstance(content, str) or not content:
            continue
        if node.role == ASSISTANT:
            for block in content:
                if block.get("type") == "tool_use":
                    names.setdefault(block.get("id", ""), block.get("name", ""))
        elif node.role == USER:
            hits: list[int] = []
            guarded = 0
            for k, block in enumerate(content):
                if (
                    block.get("type") == "tool_result"
                    and names.get(block.get("tool_use_id", "")) in compactable
                    and block.get("content") != CLEARED_TOOL_RESULT
                ):
                    if block["tool_use_id"] in protected:
                        guarded += 1
                    else:
                        hits.append(k)
            if hits or guarded:
                found.append((i, hits, guarded))
    return found


def plan_micro(
    nodes: Sequence[Node],
    *,
    watermark: int | None,
    compactable: frozenset[str],
    keep_recent: int,
    batch_tokens: int,
    cache_cold: bool,
) -> MicroPlan | None:
    """The next watermark, or None when moving it is not worth a cache miss.

    The new watermark is the furthest node holding compactable results such that the
    newest `keep_recent` compactable results and every result answering the newest
    assistant message stay after it; it is strictly greater than `watermark`. A plan is
    returned when it frees at least `batch_tokens`, or anything at all when
    `cache_cold` (the prefix will be written afresh in any case); never for a move
    that frees nothing. Tokens are estimates relative to the projection at `watermark`,
    exactly the drop in `estimate_messages` between the two projections."""
    every = _scan(nodes, compactable, _newest_assistant_uses(nodes))
    # The watermark stays below the node of the oldest result that must stay: the
    # keep_recent-th newest one, and any answer to the newest assistant message.
    limit = len(nodes)
    kept = 0
    for i, hits, guarded in reversed(every):
        if guarded or kept < keep_recent:
            limit = i
        kept += len(hits) + guarded
    start = -1 if watermark is None else watermark
    candidates = [(i, hits) for i, hits, _ in every if start < i < limit]
    if not candidates:
        return None
    cleared_tokens = chars_to_tokens(len(CLEARED_TOOL_RESULT))
    freed = 0
    count = 0
    for i, hits in candidates:
        content = nodes[i].content
        for k in hits:
            freed += _saving(content[k], cleared_tokens)
            count += 1
    if freed > 0 and (freed >= batch_tokens or cache_cold):
        return MicroPlan(watermark=candidates[-1][0], tokens_freed=freed, results_cleared=count)
    return None


def apply_micro(
    nodes: Sequence[Node], watermark: int | None, compactable: frozenset[str]
) -> list[Node]:
    """The view with every compactable result at or before `watermark` shown as
    `CLEARED_TOOL_RESULT` (is_error and the other keys kept; the node's token estimate
    lowered by the saving). Untouched nodes are the same objects."""
    out = list(nodes)
    if watermark is None or watermark < 0:
        return out
    head = nodes[: watermark + 1]
    protected = _newest_assistant_uses(nodes)
    cleared_tokens = chars_to_tokens(len(CLEARED_TOOL_RESULT))
    for i, hits, _ in _scan(head, compactable, protected):
        if not hits:
            continue
        node = nodes[i]
        content = list(node.content)
        saved = 0
        for k in hits:
            block = content[k]
            saved += _saving(block, cleared_tokens)
            content[k] = {**block, "content": CLEARED_TOOL_RESULT}
        estimate = max(node.token_estimate - saved, 1) if node.token_estimate > 0 else 0
        out[i] = node.with_content(content, estimate)
    return out
