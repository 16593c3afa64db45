"""Transcript import, second step: the message tree built from the kept lines (`Draft`s,
parents first): skipped parents resolved to the nearest kept ancestor, the block lines
of one streamed response merged, its tool results chained, and the head found."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from app.conversation.transcripts.reader import SourceLine, Transcript

MERGE_SEARCH_DEPTH = 64  # how far up a response's earlier lines are looked for


class _Resolver:
    """The nearest kept ancestor-or-self of a source uuid, walking through skipped lines
    (memoised: progress lines often form long runs)."""

    def __init__(self, transcript: Transcript) -> None:
        self.index = transcript.index
        self.skipped = transcript.skipped
        self.memo: dict[str, int | None] = {}

    def __call__(self, source: str | None) -> int | None:
        path: list[str] = []
        result: int | None = None
        while source is not None:
            if source in self.index:
                result = self.index[source]
                break
            if source in self.memo:
                result = self.memo[source]
                break
            if source in path:
                break  # a cycle of skipped lines: treat as a root
            path.append(source)
            source = self.skipped.get(source)  # a uuid not in the file: a root
        for seen in path:
            self.memo[seen] = result
        return result


def _topological(deps: list[tuple[int | None, int | None]]) -> list[int]:
    """Positions ordered parents first, otherwise in file order. A cycle is left for the
    caller, who sees the late parent missing and makes the line a root."""
    if all(all(d is None or d < i for d in pair) for i, pair in enumerate(deps)):
        return list(range(len(deps)))  # the usual file: every parent comes first
    entered = [False] * len(deps)
    order: list[int] = []
    for root in range(len(deps)):
        stack = [(root, False)]
        while stack:
            i, expanded = stack.pop()
            if expanded:
                order.append(i)
            elif not entered[i]:
                entered[i] = True
                stack.append((i, True))
                stack.extend((d, False) for d in deps[i] if d is not None and not entered[d])
    return order


@dataclass(slots=True)
class Draft:
    """One message to insert: a line, or every line of one streamed response."""

    lines: list[SourceLine]
    parent: int | None  # draft positions
    logical_parent: int | None
    uuid: uuid.UUID = field(default_factory=uuid.uuid4)


def _result_ids(line: SourceLine) -> set[str] | None:
    """The tool_use ids a user line answers, when it holds nothing but tool results."""
    if line.type != "user" or not line.content:
        return None
    ids = {str(b.get("tool_use_id")) for b in line.content if b.get("type") == "tool_result"}
    return ids if len(ids) == len(line.content) else None


class _TreeBuilder:
    """Drafts from lines given parents first.

    Two shapes of Claude Code's files are straightened here. The block lines of one
    response merge into one draft (`responses`). The tool results of a response are
    written one line each, every one under the block line of its own tool_use, so they
    are siblings in the file; here they form a run, each under the previous one
    (`tip`), and whatever hangs under any of them hangs under the run's last one. The
    chain then holds the response, all its results in file order, and what followed.
    """

    def __init__(self) -> None:
        self.drafts: list[Draft] = []
        self.anchor: dict[int, int] = {}  # line position -> draft its children hang under
        self.responses: dict[str, int] = {}  # assistant message.id -> draft
        self.owner: dict[int, int] = {}  # tool-result draft -> the response it answers
        self.tip: dict[int, int] = {}  # response draft -> the last result draft of its run
        self.answered: dict[int, set[str]] = {}  # response draft -> tool_use ids answered

    def add(self, pos: int, line: SourceLine, parent: int | None, logical: int | None) -> None:
        under = self._position(parent)
        if line.type == "system":
            # Invariant 1: a boundary has no parent; it names the last message it covers.
            covered = self._position(logical) if logical is not None else under
            self._new(pos, line, None, covered)
            return
        merged = self.responses.get(line.message_id) if line.message_id else None
        if under is not None and merged is not None and self._descends(under, merged):
            self.drafts[merged].lines.append(line)
            self.anchor[pos] = under
            return
        ids = _result_ids(line)
        response = self._response_of(under) if ids is not None else None
        if ids is not None and response is not None and not ids & self.answered[response]:
            draft = self._new(pos, line, self.tip.get(response, under), None)
            self.owner[draft] = response
            self.tip[response] = draft
            self.answered[response] |= ids
            return
        draft = self._new(pos, line, under, self._position(logical))
        if line.message_id:
            self.responses[line.message_id] = draft
            self.answered[draft] = set()

    def _position(self, pos: int | None) -> int | None:
        """The draft a child of the line at `pos` hangs under."""
        if pos is None or pos not in self.anchor:
            return None  # no parent, or one not made yet (a cycle): a root
        draft = self.anchor[pos]
        owner = self.owner.get(draft)
        return self.tip[owner] if owner is not None else draft

    def _response_of(self, draft: int | None) -> int | None:
        if draft is None:
            return None
        if draft in self.answered:
            return draft
        return self.owner.get(draft)

    def _new(self, pos: int, line: SourceLine, parent: int | None, logical: int | None) -> int:
        self.drafts.append(Draft([line], parent, logical))
        self.anchor[pos] = len(self.drafts) - 1
        return len(self.drafts) - 1

    def _descends(self, start: int, ancestor: int) -> bool:
        """`start` is `ancestor` or below it, a few steps down (drafts are made parents
        first, so an ancestor has a lower position)."""
        node: int | None = start
        for _ in range(MERGE_SEARCH_DEPTH):
            if node is None or node < ancestor:
                return False
            if node == ancestor:
                return True
            node = self.drafts[node].parent
        return False


def _links(transcript: Transcript) -> list[tuple[int | None, int | None]]:
    """(parent, logical parent) of each kept line, as kept-line positions."""
    resolve = _Resolver(transcript)
    links: list[tuple[int | None, int | None]] = []
    for pos, line in enumerate(transcript.lines):
        logical = resolve(line.logical_parent)
        if logical is None and line.logical_parent and line.type == "system" and pos:
            # Real files have boundaries naming a message that was never written: the
            # boundary then covers what came before it in the file.
            logical = pos - 1
        links.append((resolve(line.parent), logical))
    return links


def build_tree(transcript: Transcript) -> tuple[list[Draft], Draft]:
    """The messages to insert (parents first) and the head."""
    lines = transcript.lines
    deps = _links(transcript)
    builder = _TreeBuilder()
    for pos in _topological(deps):
        parent, logical = deps[pos]
        builder.add(pos, lines[pos], parent, logical)
    return builder.drafts, _head(builder.drafts, builder.anchor[len(lines) - 1])


def _head(drafts: list[Draft], last: int) -> Draft:
    """Where the last line of the file sits; when a parent came after its children that
    is no leaf, and the leaf written last is the head instead."""
    parents = {d.parent for d in drafts} | {d.logical_parent for d in drafts}
    if last not in parents:
        return drafts[last]
    leaves = [d for i, d in enumerate(drafts) if i not in parents]
    return max(leaves, key=lambda d: d.lines[-1].number) if leaves else drafts[last]
