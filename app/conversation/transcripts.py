"""Transcripts in Claude Code's session JSONL shape: export and import.

Export writes a session's full chain (root to head, across compact boundaries), one
line per message, oldest first.

Import reads such a file into a new session:
- kept: `user` and `assistant` lines, `system` lines of subtype `compact_boundary`, and
  `attachment` lines that carry a `message` (Parley's own export). Everything else
  (summaries, file-history snapshots, progress, hooks, other system lines) and every
  `isSidechain` line (subagent transcripts) is skipped; a kept line whose parent was
  skipped hangs under that line's nearest kept ancestor, so the tree stays connected.
- Claude Code writes one line per content block of a streamed response, chained by
  parentUuid and sharing `message.id`: those lines become one message. Its tool results
  are written one line each, under the line of their own tool_use (so siblings), or
  even between two block lines of the response (A1, R1, A2, R2): they are chained one
  under the other after the merged message, in file order, so that no result falls off
  the chain (see `_TreeBuilder`).
- Every node gets a fresh uuid, the source one kept as `metadata.source_uuid`, so a
  file can be imported twice; `seq` follows file order; the head is where the file's
  last kept line sits.

The whole file must be read before anything is inserted (a parent may come after its
child), so each line is reduced at once to the few fields that will be stored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY
from app.conversation.store import chain_rows, new_row
from app.errors import Invalid
from app.models import AgentSession, Message, utcnow

BOUNDARY_TEXT = "Conversation compacted"  # what Claude Code writes on its boundary lines
SYNTHETIC_MODEL = "<synthetic>"  # Claude Code's model name for locally made replies
INSERT_BATCH = 1_000
EXPORT_BATCH = 64  # lines per streamed chunk
MERGE_SEARCH_DEPTH = 64  # how far up a response's earlier lines are looked for
MAX_SUBTYPE = 64  # the column's length
MAX_MODEL = 200
# The Core table: SQLAlchemy types `__table__` as a FromClause, which insert() refuses.
MESSAGES = cast(Table, Message.__table__)

# --- export ----------------------------------------------------------------------------


def _timestamp(value: datetime) -> str:
    """Claude Code's form: RFC 3339 UTC with milliseconds, e.g. 2026-01-02T03:04:05.678Z."""
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        block["text"]
        for block in content or ()
        if isinstance(block, dict) and isinstance(block.get("text"), str)
    )


def _message(row: Any) -> dict[str, Any]:
    role = row.role or "user"
    if role != "assistant":
        return {"role": role, "content": row.content}
    meta = row.metadata or {}
    return {
        # The source id survives a round trip; a Parley reply gets a stable one of its own.
        "id": meta.get("source_message_id") or f"msg_parley_{row.uuid.hex}",
        "type": "message",
        "role": role,
        "model": row.model,
        "content": row.content,
        "stop_reason": row.stop_reason,
        "usage": row.usage,
    }


def _system_fields(row: Any) -> dict[str, Any]:
    if row.subtype != COMPACT_BOUNDARY:
        return {"subtype": row.subtype, "content": _text_of(row.content), "level": "info"}
    meta = row.metadata or {}
    return {
        "subtype": COMPACT_BOUNDARY,
        "content": BOUNDARY_TEXT,
        "level": "info",
        "compactMetadata": {"trigger": meta.get("trigger"), "preTokens": meta.get("pre_tokens")},
    }


def export_line(row: Any, session_id: str) -> dict[str, Any]:
    """One stored message as a Claude Code transcript line."""
    line: dict[str, Any] = {
        "type": row.type,
        "uuid": str(row.uuid),
        "parentUuid": str(row.parent_uuid) if row.parent_uuid else None,
    }
    if row.logical_parent_uuid:
        line["logicalParentUuid"] = str(row.logical_parent_uuid)
    line.update(sessionId=session_id, timestamp=_timestamp(row.created_at), isSidechain=False)
    if row.is_meta:
        line["isMeta"] = True
    if row.type == "system":
        line.update(_system_fields(row))
        return line
    if row.subtype == COMPACT_SUMMARY:
        line.update(isCompactSummary=True, isVisibleInTranscriptOnly=True)
    elif row.subtype:
        line["subtype"] = row.subtype  # Parley's own (interrupted, file, ...), read back on import
    line["message"] = _message(row)
    return line


async def export_rows(db: AsyncSession, session: AgentSession) -> Sequence[Any]:
    """The session's full chain, root to head, oldest first."""
    return await chain_rows(db, session.head_uuid, full=True)


async def render(rows: Iterable[Any], session_id: uuid.UUID) -> AsyncIterator[bytes]:
    """The rows as JSONL, a few lines per chunk (never the whole file as one string)."""
    sid = str(session_id)
    batch: list[str] = []
    for row in rows:
        batch.append(json.dumps(export_line(row, sid), ensure_ascii=False, separators=(",", ":")))
        if len(batch) >= EXPORT_BATCH:
            yield ("\n".join(batch) + "\n").encode()
            batch = []
    if batch:
        yield ("\n".join(batch) + "\n").encode()


# --- import: reading lines -------------------------------------------------------------


def line_error(number: int, message: str) -> Invalid:
    return Invalid(
        f"line {number}: {message}",
        errors=[{"loc": ["body", "line", number], "msg": message, "type": "value_error"}],
    )


async def numbered_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[tuple[int, bytes]]:
    """Split a byte stream into (1-based number, line) without holding more than a line."""
    pending = bytearray()
    number = 0
    async for chunk in chunks:
        scan = len(pending)  # what is pending holds no newline: search only the new bytes
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", scan)) != -1:
            number += 1
            yield number, bytes(pending[start:end])
            start = scan = end + 1
        del pending[:start]
    if pending:
        yield number + 1, bytes(pending)


@dataclass(slots=True)
class SourceLine:
    """What is stored of one kept line (the rest of the line is dropped at once)."""

    number: int
    uuid: str
    parent: str | None
    logical_parent: str | None
    type: str  # user | assistant | attachment | system (a compact boundary)
    subtype: str | None
    role: str | None
    content: list[Any]
    message_id: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    usage: dict[str, int] | None = None
    is_meta: bool = False
    created_at: datetime | None = None
    meta: dict[str, Any] | None = None


def _kept_type(obj: dict[str, Any]) -> str | None:
    if obj.get("isSidechain") is True:
        return None
    kind = obj.get("type")
    if kind in ("user", "assistant"):
        return str(kind)
    if kind == "system" and obj.get("subtype") == COMPACT_BOUNDARY:
        return "system"
    if kind == "attachment" and isinstance(obj.get("message"), dict):
        return "attachment"
    return None


def _optional_str(obj: dict[str, Any], key: str, number: int) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise line_error(number, f"{key} must be a string or null")


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def _content(message: dict[str, Any], number: int) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise line_error(number, "message.content must be a string or a list of blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise line_error(number, f"message.content[{i}] is not a content block")
    return content


def _usage(message: dict[str, Any], number: int) -> dict[str, int] | None:
    usage = message.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise line_error(number, "message.usage must be an object")
    # Parley stores the integer counters only, as the agent loop does.
    return {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}


def _subtype(obj: dict[str, Any], kind: str) -> str | None:
    if kind == "system":
        return COMPACT_BOUNDARY
    if obj.get("isCompactSummary") is True:
        return COMPACT_SUMMARY
    if kind == "assistant" and obj.get("isApiErrorMessage") is True:
        return "api_error"  # a local error shown as a reply: never sent to the model
    own = obj.get("subtype")  # Parley's export writes its subtypes back
    return own if isinstance(own, str) and 0 < len(own) <= MAX_SUBTYPE else None


def _boundary_meta(obj: dict[str, Any]) -> dict[str, Any]:
    compact = obj.get("compactMetadata")
    compact = compact if isinstance(compact, dict) else {}
    return {"trigger": compact.get("trigger"), "pre_tokens": compact.get("preTokens")}


def _message_fields(obj: dict[str, Any], kind: str, number: int) -> dict[str, Any]:
    message = obj.get("message")
    if not isinstance(message, dict):
        raise line_error(number, "message must be an object")
    fields: dict[str, Any] = {
        "role": "assistant" if kind == "assistant" else "user",
        "content": _content(message, number),
    }
    if kind == "assistant":
        model = _optional_str(message, "model", number)
        fields.update(
            message_id=_optional_str(message, "id", number),
            model=model[:MAX_MODEL] if model else None,
            stop_reason=_optional_str(message, "stop_reason", number),
            usage=_usage(message, number),
        )
    return fields


def parse_line(number: int, obj: dict[str, Any], kind: str) -> SourceLine:
    """A kept line, checked: 422 naming the line when its shape is wrong."""
    source = obj.get("uuid")
    if not isinstance(source, str) or not source:
        raise line_error(number, "uuid is missing")
    common: dict[str, Any] = {
        "number": number,
        "uuid": source,
        "parent": _optional_str(obj, "parentUuid", number),
        "logical_parent": _optional_str(obj, "logicalParentUuid", number),
        "type": kind,
        "subtype": _subtype(obj, kind),
        "is_meta": obj.get("isMeta") is True,
        "created_at": _parse_time(obj.get("timestamp")),
    }
    if kind == "system":
        return SourceLine(**common, role=None, content=[], meta=_boundary_meta(obj))
    return SourceLine(**common, **_message_fields(obj, kind, number))


@dataclass
class Transcript:
    """The kept lines of a file and the links of the skipped ones."""

    lines: list[SourceLine] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)  # source uuid -> position in lines
    skipped: dict[str, str | None] = field(default_factory=dict)  # skipped uuid -> its parent
    title: str | None = None  # Claude Code's own session title (a `summary` line)
    source_session_id: str | None = None

    def feed(self, number: int, raw: bytes) -> None:
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            return
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            raise line_error(number, "not valid JSON") from None
        if not isinstance(obj, dict):
            raise line_error(number, "not a JSON object")
        kind = _kept_type(obj)
        if kind is None:
            self._skip(obj)
            return
        line = parse_line(number, obj, kind)
        if line.uuid in self.index or line.uuid in self.skipped:
            return  # a line written twice (a resumed session): the first one counts
        self.index[line.uuid] = len(self.lines)
        self.lines.append(line)
        if self.source_session_id is None and isinstance(obj.get("sessionId"), str):
            self.source_session_id = obj["sessionId"]

    def _skip(self, obj: dict[str, Any]) -> None:
        source = obj.get("uuid")
        if isinstance(source, str) and source not in self.index:
            parent = obj.get("parentUuid") or obj.get("logicalParentUuid")
            self.skipped.setdefault(source, parent if isinstance(parent, str) else None)
        if obj.get("type") == "summary" and isinstance(obj.get("summary"), str):
            self.title = obj["summary"][:500] or None

    def model(self) -> str | None:
        """The model of the last real reply (not one Claude Code made up locally)."""
        for line in reversed(self.lines):
            if line.type == "assistant" and line.model and line.model != SYNTHETIC_MODEL:
                return line.model
        return None


async def read_transcript(chunks: AsyncIterable[bytes]) -> Transcript:
    transcript = Transcript()
    async for number, raw in numbered_lines(chunks):
        transcript.feed(number, raw)
    if not transcript.lines:
        raise Invalid(
            "The transcript holds no user or assistant message (sidechain lines, such as "
            "a subagent's file, are skipped)",
            errors=[{"loc": ["body"], "msg": "no messages", "type": "value_error"}],
        )
    return transcript


# --- import: building the tree ---------------------------------------------------------


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


# --- import: storing -------------------------------------------------------------------


def _draft_meta(draft: Draft) -> dict[str, Any]:
    first = draft.lines[0]
    meta: dict[str, Any] = dict(first.meta or {})
    meta["source_uuid"] = first.uuid
    if len(draft.lines) > 1:
        meta["source_uuids"] = [line.uuid for line in draft.lines]
    if first.message_id:
        meta["source_message_id"] = first.message_id
    return meta


def _row(draft: Draft, drafts: list[Draft], session_id: uuid.UUID, seq: int) -> dict[str, Any]:
    first, last = draft.lines[0], draft.lines[-1]
    content = (
        first.content
        if len(draft.lines) == 1
        else [block for line in draft.lines for block in line.content]
    )
    row = new_row(
        session_id=session_id,
        seq=seq,
        message_uuid=draft.uuid,
        parent_uuid=drafts[draft.parent].uuid if draft.parent is not None else None,
        logical_parent_uuid=(
            drafts[draft.logical_parent].uuid if draft.logical_parent is not None else None
        ),
        type=first.type,
        subtype=first.subtype,
        role=first.role,
        content=content,
        model=first.model,
        stop_reason=last.stop_reason,
        usage=last.usage,
        is_meta=first.is_meta,
        meta=_draft_meta(draft),
    )
    row["created_at"] = first.created_at or row["created_at"]
    return row


def _seqs(drafts: list[Draft]) -> list[int]:
    """Seq numbers in file order (drafts are in parents-first order, nearly the same)."""
    ranked = sorted(range(len(drafts)), key=lambda i: drafts[i].lines[0].number)
    seqs = [0] * len(drafts)
    for seq, i in enumerate(ranked, start=1):
        seqs[i] = seq
    return seqs


async def store_tree(
    db: AsyncSession, session: AgentSession, drafts: list[Draft], head: Draft
) -> None:
    """Insert the drafts into a new, empty session, parents first, in batches."""
    seqs = _seqs(drafts)
    for start in range(0, len(drafts), INSERT_BATCH):
        batch = [
            _row(drafts[i], drafts, session.id, seqs[i])
            for i in range(start, min(start + INSERT_BATCH, len(drafts)))
        ]
        # The Core table, not the ORM class: an ORM bulk insert maps keys to attribute
        # names and would drop the `metadata` column (attribute `meta`) silently.
        await db.execute(insert(MESSAGES), batch)
    session.message_seq = len(drafts)
    session.head_uuid = head.uuid
    session.updated_at = utcnow()
    await db.flush()
