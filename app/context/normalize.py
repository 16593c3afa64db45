"""Turn a view of stored messages into a `messages` array the Messages API accepts.

History is append-only (invariant 1): an interrupted run leaves a tool_use without a
result, a fork or a head move can end a view on an open tool call, a retried step can
store a result twice, compaction and snips leave views that start mid-conversation. The
stored rows keep all of that as it happened; this module is the one place that repairs
it, on every request (invariant 4), so the API never answers 400 for a shape the
service itself produced. What it does, in order:

1. Internal rows are left out: no role, type "system" (compact boundaries and other
   markers), subtype "api_error".
2. Blocks the API rejects are dropped: empty or whitespace-only text, tool_result blocks
   in assistant messages, tool_use blocks in user messages, tool_use ids seen before.
   A stored `cache_control` key is removed (cache.py places its own). A tool_result
   whose content is blank gets a short text, since the API refuses an empty error
   result. Everything else is passed verbatim and *shared*, not copied: thinking blocks
   keep their signatures byte for byte.
3. Same-role neighbours are merged (the API would merge them anyway, and pairing is
   defined on merged messages); in a user message tool_result blocks go first.
4. Each tool_use is answered by exactly one tool_result in the next message: the first
   result for an id is kept, duplicates and orphans (no tool_use of that id in the
   previous assistant message) are dropped, and a missing one gets an error placeholder
   (`MISSING_TOOL_RESULT`), appended after the stored results in tool_use order. A view
   ending on an assistant message with tool uses gets a user message of placeholders.
5. A user message left empty disappears and its neighbours merge.
6. A view that starts with an assistant message gets `EARLIER_CONVERSATION_OMITTED`
   as a user message in front. A final assistant message without tool uses (prefill)
   is kept without its thinking blocks (the API refuses them there: with thinking off,
   as the last block, and a prefill is not taken with thinking on) and with trailing
   whitespace stripped from its last text block (API rule); left empty, it is dropped.

The output is a fresh list of message dicts with fresh content lists; the block dicts
inside are the stored ones unless changed, so treat them as read-only. The result is
a fixed point: normalising it again changes nothing. One pass, linear in the number of
blocks; with a `MergeMemo`, linear in the blocks new since the view the memo last saw,
when the view extends it (the next turn of a conversation): the messages before them
are the ones the last result holds (read-only too), and what remains proportional to
the whole view is a comparison of row identities and list copies, done in C.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.context.blocks import is_blank_text, is_internal
from app.context.types import (
    ASSISTANT,
    CACHEABLE_BLOCK_TYPES,
    EARLIER_CONVERSATION_OMITTED,
    MISSING_TOOL_RESULT,
    USER,
    ApiMessage,
    Block,
    Node,
    extends,
)

# The content given to a tool_result that was stored with no content at all.
EMPTY_TOOL_RESULT = "[Tool returned no output]"

MAX_CACHE_BREAKPOINTS = 4


def missing_result(tool_use_id: str) -> Block:
    """The error result that answers a tool_use with no stored result."""
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "is_error": True,
        "content": MISSING_TOOL_RESULT,
    }


class _Group:
    """One API message being built: merged rows of the same role. Only `_merge_rows`
    extends one, while it is the last; after that a change makes a new group (a memo
    may share it with later views)."""

    __slots__ = ("other", "results", "role", "uses", "uuids")

    def __init__(self, role: str) -> None:
        self.role = role
        self.results: list[Block] = []  # user: tool_result blocks
        self.other: list[Block] = []  # every other block, in order
        self.uses: list[str] = []  # assistant: tool_use ids, in order
        self.uuids: list[str] = []

    def copy(self, **lists: list[Any]) -> _Group:
        """A new group with the same lists copied, or replaced by `lists`."""
        group = _Group(self.role)
        group.results = lists.get("results", list(self.results))
        group.other = lists.get("other", list(self.other))
        group.uses = lists.get("uses", list(self.uses))
        group.uuids = lists.get("uuids", list(self.uuids))
        return group

    def content(self) -> list[Block]:
        return [*self.results, *self.other]


@dataclass
class MergeMemo:
    """Where the last view normalised with this memo left off, so that normalising a
    view that extends it (the same rows, then more: the next turn of a conversation)
    goes on from there instead of from the first row: its rows merged (steps 1-3),
    every group but the last paired (steps 4-5: the last may still grow) and the
    messages of those. Any other view is normalised from the start and becomes the
    memo's. Holds references, not copies: the rows' blocks, groups that are never
    changed once kept, and messages that the results share (read-only)."""

    nodes: tuple[Node, ...] = ()
    groups: list[_Group] = field(default_factory=list)
    seen_uses: frozenset[str] = frozenset()
    paired: list[_Group] = field(default_factory=list)  # steps 4-5 over groups[:-1]
    messages: list[ApiMessage] = field(default_factory=list)  # one per `paired` group

    def resumes(self, nodes: Sequence[Node]) -> bool:
        return bool(self.nodes) and extends(nodes, self.nodes)


def _without_cache_control(block: Block) -> Block:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _blank_result_content(content: Any) -> bool:
    if content is None:
        return True
    if isinstance(content, str):
        return not content or content.isspace()
    return isinstance(content, list) and not content


def _clean_result(block: Block) -> Block:
    """Drop blank nested text and nested cache_control; give blank content a text."""
    content = block.get("content")
    if type(content) is str and content and not content.isspace():
        # The common case: a plain string result.
        return _without_cache_control(block) if "cache_control" in block else block
    if isinstance(content, list):
        kept: list[Any] = []
        changed = False
        for nested in content:
            if not isinstance(nested, dict) or (
                nested.get("type") == "text" and is_blank_text(nested)
            ):
                changed = True
                continue
            if "cache_control" in nested:
                nested = _without_cache_control(nested)
                changed = True
            kept.append(nested)
        if changed:
            block = {**block, "content": kept}
            content = kept
    if _blank_result_content(content):
        block = {**block, "content": EMPTY_TOOL_RESULT}
    if "cache_control" in block:
        block = _without_cache_control(block)
    return block


def _add_blocks(group: _Group, content: Any, seen_uses: set[str]) -> bool:
    """Step 2 for one row: append its sendable blocks to the group (tool_use ids seen
    before are dropped). True when the row contributed anything. This is the per-block
    loop of every request, so it makes no calls for the common blocks."""
    if isinstance(content, str):
        content = [{"type": "text", "text": content}] if content else ()
    assistant = group.role == ASSISTANT
    other = group.other
    added = False
    for block in content or ():
        kind = block.get("type")
        if kind == "text":
            value = block.get("text")
            if not value or not isinstance(value, str) or value.isspace():
                continue
        elif kind == "tool_use":
            use_id = block.get("id")
            if not assistant or not use_id or use_id in seen_uses:
                continue
            seen_uses.add(use_id)
            group.uses.append(use_id)
        elif kind == "tool_result":
            if not assistant and block.get("tool_use_id"):
                group.results.append(_clean_result(block))
                added = True
            continue
        other.append(_without_cache_control(block) if "cache_control" in block else block)
        added = True
    return added


def _merge_rows(nodes: Sequence[Node], groups: list[_Group], seen_uses: set[str]) -> None:
    """Steps 1-3 without pairing: visible rows, cleaned, same-role runs merged, appended
    to `groups` (whose last group the first rows may extend: it must be the caller's)."""
    last: _Group | None = groups[-1] if groups else None
    for node in nodes:
        if is_internal(node):
            continue
        role = node.role or USER
        group = last if last is not None and last.role == role else _Group(role)
        if _add_blocks(group, node.content, seen_uses):
            group.uuids.append(node.uuid)
            if group is not last:
                groups.append(group)
                last = group


def _answered(group: _Group, uses: list[str]) -> _Group:
    """The user group with the first result for each of `uses` kept, the rest dropped
    and placeholders added (`group` itself when that changes nothing)."""
    if not uses:
        return group.copy(results=[]) if group.results else group
    wanted = set(uses)
    answered: set[str] = set()
    kept: list[Block] = []
    for block in group.results:
        use_id = block["tool_use_id"]
        if use_id in wanted and use_id not in answered:
            answered.add(use_id)
            kept.append(block)
    if len(answered) < len(wanted):
        kept.extend(missing_result(u) for u in uses if u not in answered)
    return group.copy(results=kept)


def _pair(out: list[_Group], group: _Group) -> None:
    """Steps 4-5 for the next group: answer every tool_use of the message before it,
    drop it if that empties a user message, and merge the assistant messages that then
    touch (into a new group: the groups are left as they are). Only `out`'s last entry
    is ever replaced."""
    last = out[-1] if out else None
    if group.role == ASSISTANT:
        if last is not None and last.role == ASSISTANT:
            out[-1] = last.copy(
                other=last.other + group.other,
                uses=last.uses + group.uses,
                uuids=last.uuids + group.uuids,
            )
        else:
            out.append(group)
        return
    answered = _answered(group, last.uses if last is not None else [])
    if answered.results or answered.other:
        out.append(answered)


def _answer_open_uses(out: list[_Group]) -> None:
    """Step 4 at the end: a final assistant message with tool uses gets a user message
    of placeholders."""
    if out and out[-1].role == ASSISTANT and out[-1].uses:
        answer = _Group(USER)
        answer.results = [missing_result(u) for u in out[-1].uses]
        out.append(answer)


THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})


def _as_prefill(out: list[_Group]) -> None:
    """A final assistant message: thinking blocks out (dropped when nothing else is
    left), trailing whitespace stripped (in a new group)."""
    other = out[-1].other
    if any(block.get("type") in THINKING_TYPES for block in other):
        other = [b for b in other if b.get("type") not in THINKING_TYPES]
        if not other:
            out.pop()
            return
    last = other[-1] if other else None
    if last is not None and last.get("type") == "text":
        text = last["text"]
        stripped = text.rstrip()
        if stripped != text:
            other = [*other[:-1], {**last, "text": stripped}]
    if other is not out[-1].other:
        out[-1] = out[-1].copy(other=other)


def _normalized(
    nodes: Sequence[Node], memo: MergeMemo | None = None, resume: bool = False
) -> tuple[list[_Group], bool]:
    """The messages as groups, and whether the omission note must lead them. With a
    `memo` (`resume`: of a view that `nodes` extends), from where that view ended (its
    last group copied: the new rows may extend it); the memo then holds `nodes`."""
    groups: list[_Group] = []
    seen_uses: set[str] = set()
    out: list[_Group] = []
    start = paired = 0  # the first row to merge, the first group to pair
    if memo is not None and resume:
        start = len(memo.nodes)
        if memo.groups:
            groups = [*memo.groups[:-1], memo.groups[-1].copy()]
            paired = len(groups) - 1
        seen_uses = set(memo.seen_uses)
        out = list(memo.paired)
    _merge_rows(nodes[start:], groups, seen_uses)
    for group in groups[paired:-1]:
        _pair(out, group)
    if memo is not None:
        memo.nodes, memo.groups, memo.seen_uses = tuple(nodes), groups, frozenset(seen_uses)
        memo.paired = list(out)
    if groups:
        _pair(out, groups[-1])
    _answer_open_uses(out)
    if out and out[-1].role == ASSISTANT:
        _as_prefill(out)
    return out, bool(out) and out[0].role == ASSISTANT


def _message(group: _Group) -> ApiMessage:
    return {"role": group.role, "content": group.content()}


def _messages(
    groups: list[_Group], known: list[_Group], messages: list[ApiMessage]
) -> list[ApiMessage]:
    """The messages of `groups`, reusing `messages` (those of `known`) for the groups
    the two share at the start. Only the tail can differ (`_pair`, `_as_prefill`)."""
    shared = min(len(groups), len(known))
    while shared and groups[shared - 1] is not known[shared - 1]:
        shared -= 1
    return messages[:shared] + [_message(group) for group in groups[shared:]]


def _omission_note() -> ApiMessage:
    return {"role": USER, "content": [{"type": "text", "text": EARLIER_CONVERSATION_OMITTED}]}


def normalize_for_api(nodes: Sequence[Node], memo: MergeMemo | None = None) -> list[ApiMessage]:
    """The `messages` array for a model request built from a view (see module doc).
    An empty list when nothing in the view is visible to the model. `memo`: the
    caller's, kept from the last view it normalised (the result is the same with or
    without one; with one, results share the message dicts of what they have in
    common: read-only, like the blocks)."""
    if memo is None:
        groups, lead = _normalized(nodes)
        messages = [_message(group) for group in groups]
    else:
        resume = memo.resumes(nodes)
        known, known_messages = (memo.paired, memo.messages) if resume else ([], [])
        groups, lead = _normalized(nodes, memo, resume)
        messages = _messages(groups, known, known_messages)
        memo.messages = _messages(memo.paired, groups, messages)
    return [_omission_note(), *messages] if lead else messages


def normalize_with_uuids(nodes: Sequence[Node]) -> list[tuple[ApiMessage, list[str]]]:
    """`normalize_for_api`, each message with the uuids of the stored rows it was built
    from (empty for synthetic messages: the leading omission note, a placeholder-only
    answer to an open tool call)."""
    groups, lead = _normalized(nodes)
    pairs = [(_message(g), list(g.uuids)) for g in groups]
    if lead:
        pairs.insert(0, (_omission_note(), []))
    return pairs


# ---------------------------------------------------------------------------
# Validation: the rules the API enforces, as a list of problems.


def _text_problem(block: Block, where: str) -> str | None:
    text = block.get("text")
    if not isinstance(text, str) or not text:
        return f"{where}: text content blocks must be non-empty"
    if text.isspace():
        return f"{where}: text content blocks must contain non-whitespace text"
    return None


def _result_problems(block: Block, where: str) -> list[str]:
    problems: list[str] = []
    content = block.get("content")
    if _blank_result_content(content):
        problems.append(f"{where}: tool_result content is empty")
    if isinstance(content, list):
        for k, nested in enumerate(content):
            if isinstance(nested, dict) and nested.get("type") == "text":
                problem = _text_problem(nested, f"{where}.content.{k}")
                if problem:
                    problems.append(problem)
    return problems


def _message_problems(
    i: int, message: ApiMessage, previous_uses: set[str], seen_uses: set[str]
) -> tuple[list[str], list[str], int]:
    """Problems of one message, the tool_use ids it opens and its cache_control count."""
    problems: list[str] = []
    role = message.get("role")
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        return [f"messages.{i}: content must be a string or a list of blocks"], [], 0
    uses: list[str] = []
    answered: set[str] = set()
    results_done = False
    cache_marks = 0
    for j, block in enumerate(content):
        where = f"messages.{i}.content.{j}"
        kind = block.get("type")
        if "cache_control" in block:
            cache_marks += 1
            if kind not in CACHEABLE_BLOCK_TYPES:
                problems.append(f"{where}: {kind} blocks cannot carry cache_control")
        if kind == "text":
            problem = _text_problem(block, where)
            if problem:
                problems.append(problem)
        if kind == "tool_result":
            use_id = block.get("tool_use_id")
            if role != USER:
                problems.append(f"{where}: tool_result blocks belong in user messages")
            elif results_done:
                problems.append(f"{where}: tool_result blocks must come first")
            elif use_id not in previous_uses:
                problems.append(
                    f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: {use_id}"
                )
            elif use_id in answered:
                problems.append(f"{where}: duplicate tool_result for {use_id}")
            answered.add(str(use_id))
            problems.extend(_result_problems(block, where))
        else:
            results_done = True
        if kind == "tool_use":
            use_id = block.get("id")
            if role != ASSISTANT:
                problems.append(f"{where}: tool_use blocks belong in assistant messages")
            elif not use_id or use_id in seen_uses:
                problems.append(f"{where}: `tool_use` ids must be unique: {use_id}")
            else:
                seen_uses.add(use_id)
                uses.append(use_id)
    missing = previous_uses - answered
    if missing:
        problems.append(
            f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
            f"immediately after: {', '.join(sorted(missing))}"
        )
    return problems, uses, cache_marks


def validate_api_messages(messages: Sequence[ApiMessage]) -> list[str]:
    """Every rule of the Messages API that a history can break, checked on a `messages`
    array: at least one message, first role user, roles alternating, non-empty content
    (except a final assistant message), non-blank text, tool_result blocks first in user
    messages and each answering a tool_use of the previous assistant message exactly
    once, every tool_use answered in the next message unless it is the final one,
    unique tool_use ids, no trailing whitespace at the end of a final assistant message,
    at most 4 cache_control marks among the messages, none on a thinking block. Two
    rules are stricter than the API's: a tool_result's content must not be blank (the
    API refuses that only for an error result), and a final assistant message holds no
    thinking (refused with thinking off; with thinking on a prefill is refused anyway);
    normalize_for_api never sends either. An empty list means valid."""
    if not messages:
        return ["messages: at least one message is required"]
    problems: list[str] = []
    if messages[0].get("role") != USER:
        problems.append('messages: first message must use the "user" role')
    seen_uses: set[str] = set()
    previous_uses: set[str] = set()
    cache_marks = 0
    last = len(messages) - 1
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in (USER, ASSISTANT):
            problems.append(f"messages.{i}: role must be user or assistant")
        elif i and messages[i - 1].get("role") == role:
            problems.append(f"messages.{i}: roles must alternate")
        content = message.get("content")
        if not content and not (i == last and role == ASSISTANT):
            problems.append(
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        found, uses, marks = _message_problems(
            i, message, previous_uses if role == USER else set(), seen_uses
        )
        if role == ASSISTANT and previous_uses:
            found.append(
                f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(sorted(previous_uses))}"
            )
        problems.extend(found)
        cache_marks += marks
        previous_uses = set(uses)
    if messages[last].get("role") == ASSISTANT:
        content = messages[last].get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in THINKING_TYPES for b in content
        ):
            problems.append(
                f"messages.{last}: a final assistant message (a prefill) cannot hold thinking"
            )
        tail = content[-1] if isinstance(content, list) and content else None
        if isinstance(content, str):
            tail = {"type": "text", "text": content}
        if tail is not None and tail.get("type") == "text":
            text = tail.get("text") or ""
            if text != text.rstrip():
                problems.append(
                    f"messages.{last}: final assistant content cannot end with trailing whitespace"
                )
    if cache_marks > MAX_CACHE_BREAKPOINTS:
        problems.append(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
            f"provided. Found {cache_marks}."
        )
    return problems
