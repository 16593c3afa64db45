"""Token figures of a request: anchored on real usage when the usage measured this
request's prefix (invariant 8), estimated from content otherwise, in the session model's
tokens.

The anchoring rule. A reply's `usage` says how many tokens the request that produced it
had; it is worth more than any estimate, but only for *that* request. So a reply anchors
the figure of a later view only when the reply records the estimate of its own request
(`metadata.request_estimate`, written by the loop when it stores a reply Parley asked
for): Claude Code's replies in an imported transcript were measured against requests
Parley never sends (another system prompt, other tools), and the verbatim copies a
compaction leaves behind its boundary were measured against the whole conversation
before it, so neither carries the mark (compaction drops it from the copies) and
neither anchors anything.

The anchored figure is the reply's real input tokens, plus the change since then of the
estimate of the prefix it answered (zero when the prefix is the same rows projected the
same way; negative when micro-compaction, a collapse or a snip has since taken something
out of it; the change of the system prompt and tools too), plus its output tokens, plus
the estimates of what came after it. Only the part that changed is estimated, so the
figure stays close to the truth after a projection. When most of the measured prefix
has changed (the change is larger than what the prefix still holds), the anchor says
little any more and the whole view is estimated from content. Only the newest anchoring
reply is considered. Rows the model never sees count for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.context.blocks import is_internal, tool_use_ids
from app.context.models import model_info
from app.context.session import SessionConfig
from app.context.tokens import estimate_block, estimate_system, estimate_tools, node_tokens
from app.context.types import ASSISTANT, Node, extends

# The metadata key of a reply Parley stored: the estimate (calibration tokens, system
# and tools included) of the request that produced it.
REQUEST_ESTIMATE = "request_estimate"


@dataclass
class TokenMemo:
    """The rows of the last view summed with this memo and their total, so that a view
    that extends it (the next turn's, or the same view again) sums only the rows it
    adds. Holds references to the rows (compared by identity), not copies."""

    nodes: tuple[Node, ...] = ()
    total: int = 0


def visible_tokens(nodes: Sequence[Node], memo: TokenMemo | None = None) -> int:
    """The stored estimates of the rows the model sees, summed; from where `memo` left
    off when `nodes` extends its view (the result is the same without one)."""
    start = total = 0
    if memo is not None and extends(nodes, memo.nodes):
        start, total = len(memo.nodes), memo.total
    total += sum(node_tokens(node) for node in nodes[start:] if not is_internal(node))
    if memo is not None:
        memo.nodes, memo.total = tuple(nodes), total
    return total


def definitions_estimate(config: SessionConfig) -> int:
    """The system prompt and the tool definitions, in calibration tokens."""
    return estimate_system(config.system) + estimate_tools(config.tool_definitions)


def request_estimate(
    config: SessionConfig, nodes: Sequence[Node], memo: TokenMemo | None = None
) -> int:
    """The estimate of a request built from `nodes`, system and tools included, in
    calibration tokens: what a reply records as `REQUEST_ESTIMATE`. A final reply's
    thinking is not part of it (a prefill is sent without, `normalize_for_api`).
    `memo`: see `visible_tokens`."""
    return definitions_estimate(config) + visible_tokens(nodes, memo) - prefill_thinking(nodes)


def prefill_thinking(nodes: Sequence[Node]) -> int:
    """The estimate of the thinking blocks of the final assistant message, when the
    view ends with one that calls no tool (those blocks are not sent)."""
    total = 0
    for node in reversed(nodes):
        if is_internal(node):
            continue
        if node.role != ASSISTANT:
            break
        if tool_use_ids(node.content):
            return 0
        total += sum(
            estimate_block(block)
            for block in node.content
            if block.get("type") in ("thinking", "redacted_thinking")
        )
    return total


def view_estimate(config: SessionConfig, nodes: Sequence[Node]) -> int:
    """A pure estimate of a request built from `nodes` (system and tools included), in
    the session model's tokens."""
    return int(request_estimate(config, nodes) * model_info(config.model).tokens_per_char_factor)


def usage_input(usage: Mapping[str, Any]) -> int:
    """The input tokens a usage reports: plain, read from the cache and written to it."""
    return sum(
        int(usage.get(key) or 0)
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )


def anchor_of(node: Node) -> tuple[int, int, int] | None:
    """`(input tokens, output tokens, recorded request estimate)` of a reply whose usage
    may anchor an estimate; None for every other row (see the module doc)."""
    if node.role != ASSISTANT or not node.usage or not node.meta:
        return None
    recorded = node.meta.get(REQUEST_ESTIMATE)
    if not isinstance(recorded, int) or isinstance(recorded, bool):
        return None
    measured = usage_input(node.usage)
    if measured <= 0:
        return None
    return measured, int(node.usage.get("output_tokens") or 0), recorded


def without_anchor(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The metadata of a row copied behind a compact boundary: its usage measured
    another view, so the copy never anchors an estimate."""
    if not metadata or REQUEST_ESTIMATE not in metadata:
        return metadata
    return {key: value for key, value in metadata.items() if key != REQUEST_ESTIMATE}


def _anchor(
    config: SessionConfig, nodes: Sequence[Node], memo: TokenMemo | None = None
) -> tuple[int, int, int, int, int] | None:
    """The anchoring reply of a view, as `(index, measured input, output, change of its
    prefix's estimate, estimates after it)`; None when no reply anchors (module doc)."""
    total = definitions_estimate(config) + visible_tokens(nodes, memo)
    after = 0
    for i in range(len(nodes) - 1, -1, -1):
        node = nodes[i]
        if is_internal(node):
            continue
        tokens = node_tokens(node)
        anchor = anchor_of(node)
        if anchor is not None:
            measured, output, recorded = anchor
            prefix = total - after - tokens
            changed = prefix - recorded
            if abs(changed) > prefix:
                return None  # most of what it measured is gone
            return i, measured, output, changed, after
        after += tokens
    return None


def anchored_estimate(
    config: SessionConfig, nodes: Sequence[Node], memo: TokenMemo | None = None
) -> int:
    """The figure of the request built from `nodes` (the view as projected now):
    anchored on the newest reply whose usage measured this view's prefix, estimated
    from content otherwise (module doc). `memo`: see `visible_tokens`."""
    factor = model_info(config.model).tokens_per_char_factor
    found = _anchor(config, nodes, memo)
    if found is None:
        return int(request_estimate(config, nodes, memo) * factor)
    i, measured, output, changed, after = found
    rest = after - prefill_thinking(nodes[i + 1 :]) if after else 0
    return max(int(measured + output + (changed + rest) * factor), 0)


def prefix_sent(config: SessionConfig, nodes: Sequence[Node]) -> bool:
    """Whether Parley has sent a prefix of this view (a reply in it anchors): what a
    prompt cache can hold of it. An imported transcript, or the view a compaction just
    left, holds none: whatever the session sent before, this prefix was never sent."""
    return _anchor(config, nodes) is not None
