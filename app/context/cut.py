"""Where a compaction may cut a view: `nodes[:index]` is summarised, `nodes[index:]`
stays verbatim.

A cut must leave both sides sendable (invariant 4): it never separates a tool_use from
its tool_result (the kept side would start with an orphan result, the API answers 400)
and never falls between two assistant rows that the request merges into one message.
The safest cut is at a clean user turn: everything after it is a fresh request. Those
are rare in agent sessions (in real Claude Code transcripts about one message in 30,
sometimes one in 200), so the common cut is at the start of an API round: an assistant
message whose previous model-visible message is a user message, with every tool call
before it answered before it. The kept side then starts with an assistant message and
the caller puts the summary (a user message) in front of it.

Indices are positions in the list given; rows the model never sees (boundaries, API
errors) may sit anywhere and count for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.context.blocks import is_clean_user_turn, is_internal, is_model_visible, tool_use_ids
from app.context.tokens import node_tokens
from app.context.types import ASSISTANT, COMPACT_SUMMARY, Node

# find_cut never compacts fewer model-visible messages than this.
MIN_COMPACTED_MESSAGES = 2
# A clean cut is preferred unless it keeps less than this share of what the best
# API-round cut would keep (a clean turn far back in a long tool loop would otherwise
# throw away almost all recent work).
MIN_CLEAN_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Cut:
    """`nodes[:index]` is compacted, `nodes[index:]` kept. `clean`: the kept part starts
    with a clean user turn (False: it starts with an assistant message, or is empty)."""

    index: int
    clean: bool


def split_pairs(nodes: Sequence[Node]) -> list[bool]:
    """`split[i]` (for i in 0..len) is True when a cut at i would separate some tool_use
    before i from a tool_result at or after i. Linear: each id marks the interval from
    its first use to its last result."""
    first_use: dict[str, int] = {}
    last_result: dict[str, int] = {}
    for i, node in enumerate(nodes):
        content = node.content
        if is_internal(node) or isinstance(content, str) or not content:
            continue
        if node.role == ASSISTANT:
            for block in content:
                if block.get("type") == "tool_use":
                    use_id = block.get("id")
                    if use_id and use_id not in first_use:
                        first_use[use_id] = i
        else:
            for block in content:
                if block.get("type") == "tool_result":
                    use_id = block.get("tool_use_id")
                    if use_id in first_use:
                        last_result[use_id] = i
    delta = [0] * (len(nodes) + 2)
    for use_id, end in last_result.items():
        delta[first_use[use_id] + 1] += 1
        delta[end + 1] -= 1
    split: list[bool] = []
    depth = 0
    for i in range(len(nodes) + 1):
        depth += delta[i]
        split.append(depth > 0)
    return split


def _previous_visible(nodes: Sequence[Node]) -> list[int | None]:
    """`prev[i]`: index of the last model-visible node before i (None when none)."""
    prev: list[int | None] = []
    last: int | None = None
    for i, node in enumerate(nodes):
        prev.append(last)
        if is_model_visible(node):
            last = i
    return prev


def _ends_open(nodes: Sequence[Node]) -> bool:
    """The last model-visible message is an assistant message with tool uses: its
    results may still come, so it cannot be compacted away."""
    for node in reversed(nodes):
        if is_model_visible(node):
            return node.role == ASSISTANT and bool(tool_use_ids(node.content))
    return False


def _role(nodes: Sequence[Node], index: int | None) -> str | None:
    return None if index is None else nodes[index].role


def _kind(node: Node, previous_role: str | None) -> bool | None:
    """True: a clean start; False: an API-round start; None: no cut before this node."""
    if is_clean_user_turn(node):
        return True
    if node.role == ASSISTANT and previous_role != ASSISTANT and is_model_visible(node):
        return False
    return None


def is_valid_cut(nodes: Sequence[Node], index: int) -> bool:
    """Whether `nodes[:index]` can be compacted with `nodes[index:]` kept verbatim: no
    pair split, and nodes[index] is a clean user turn or an assistant message that
    starts an API round; `index == len(nodes)` is valid when the view does not end on
    an open tool call."""
    if index < 0 or index > len(nodes):
        return False
    if split_pairs(nodes)[index]:
        return False
    if index == len(nodes):
        return not _ends_open(nodes)
    previous_role: str | None = None
    for node in reversed(nodes[:index]):
        if is_model_visible(node):
            previous_role = node.role
            break
    return _kind(nodes[index], previous_role) is not None


def cut_kinds(nodes: Sequence[Node]) -> list[bool | None]:
    """For each index 0..len: True (valid clean cut), False (valid API-round cut, or the
    total cut at len), None (not a valid cut). Linear."""
    split = split_pairs(nodes)
    prev = _previous_visible(nodes)
    kinds: list[bool | None] = [
        None if split[i] else _kind(node, _role(nodes, prev[i])) for i, node in enumerate(nodes)
    ]
    kinds.append(None if split[-1] or _ends_open(nodes) else False)
    return kinds


def find_cut(
    nodes: Sequence[Node], keep_tokens: int, *, min_clean_share: float = MIN_CLEAN_SHARE
) -> Cut | None:
    """The cut keeping the most of the newest messages within `keep_tokens` (estimates),
    with at least `MIN_COMPACTED_MESSAGES` model-visible messages compacted.

    A clean cut is preferred: the earliest valid clean cut that fits is taken when it
    keeps at least `min_clean_share` of what the earliest fitting API-round cut keeps
    (0 prefers any clean cut); else that API-round cut; else, when nothing else fits,
    the total cut `len(nodes)` if the view does not end on an open tool call. None when
    nothing can be compacted safely."""
    n = len(nodes)
    kinds = cut_kinds(nodes)
    suffix = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + node_tokens(nodes[i])
    visible = 0
    clean: int | None = None
    round_start: int | None = None
    for i in range(n + 1):
        if i > 0 and is_model_visible(nodes[i - 1]):
            visible += 1
        if visible < MIN_COMPACTED_MESSAGES or suffix[i] > keep_tokens or kinds[i] is None:
            continue
        if kinds[i] and clean is None:
            clean = i
        elif not kinds[i] and round_start is None:
            round_start = i
        if clean is not None and round_start is not None:
            break
    if clean is not None and (
        round_start is None
        or round_start == n
        or suffix[clean] >= min_clean_share * suffix[round_start]
    ):
        return Cut(clean, clean=True)
    if round_start is not None:
        return Cut(round_start, clean=False)
    return None


def api_rounds(nodes: Sequence[Node]) -> list[tuple[int, int]]:
    """The view split into API rounds, `(start, end)` inclusive, covering every index
    in order: an assistant response with the user message answering it; a clean user
    turn starts the round of the response that follows it. Every start but the first
    is a valid cut, so `nodes[start:]` of any round is a sendable view (normalize puts a
    user note in front of a leading assistant message). Dropping the oldest rounds is
    how a summary request that is itself too long is shortened."""
    if not nodes:
        return []
    kinds = cut_kinds(nodes)
    prev = _previous_visible(nodes)
    starts = [0]
    for i in range(1, len(nodes)):
        kind = kinds[i]
        if kind is False:
            # A clean user turn right before this response leads its round (that turn
            # is a valid cut itself, or index 0).
            p = prev[i]
            if p is not None and is_clean_user_turn(nodes[p]):
                continue
        if kind is not None:
            starts.append(i)
    starts.append(len(nodes))
    return [(starts[k], starts[k + 1] - 1) for k in range(len(starts) - 1)]


def newest_round_cut(nodes: Sequence[Node]) -> Cut | None:
    """The cut that keeps only the newest API round (with the clean user turn that
    leads it, if any), when at least `MIN_COMPACTED_MESSAGES` model-visible messages
    come before it; None otherwise. For when that round alone is larger than the kept
    budget: it is kept (its tool results shrunk) rather than summarised away."""
    rounds = api_rounds(nodes)
    if len(rounds) < 2:
        return None
    start = rounds[-1][0]
    if sum(1 for node in nodes[:start] if is_model_visible(node)) < MIN_COMPACTED_MESSAGES:
        return None
    kind = cut_kinds(nodes)[start]
    return None if kind is None else Cut(start, clean=kind)


def no_cut_reason(nodes: Sequence[Node]) -> str:
    """Why no cut can compact `nodes`, in the caller's terms."""
    visible = sum(1 for node in nodes if is_model_visible(node))
    if visible < MIN_COMPACTED_MESSAGES + 1:
        compacted = any(node.subtype == COMPACT_SUMMARY for node in nodes[:1])
        since = "since the last compaction " if compacted else ""
        waiting = " (the newest still waits for its tool results)" if _ends_open(nodes) else ""
        return (
            f"Nothing to compact: the conversation {since}holds only {visible} "
            f"message{'s' if visible != 1 else ''}{waiting}"
        )
    if _ends_open(nodes):
        return (
            "Nothing to compact: every earlier point would separate the open tool calls of "
            "the newest reply from their results"
        )
    return "Nothing can be compacted without splitting a tool call from its result"
