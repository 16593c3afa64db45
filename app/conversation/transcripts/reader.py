"""Transcript import, first step: the byte stream split into numbered lines, each line
parsed and checked, the kept ones reduced to a `SourceLine`, the skipped ones to their
links (see the package's docstring for which lines are kept).

The whole file must be read before anything is inserted (a parent may come after its
child), so each line is reduced at once to the few fields that will be stored.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.context.shapes import ShapeError, check_content, check_storable, unstorable
from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY
from app.errors import Invalid

SYNTHETIC_MODEL = "<synthetic>"  # Claude Code's model name for locally made replies
MAX_SUBTYPE = 64  # the column's length
MAX_MODEL = 200
MAX_STOP_REASON = 64  # the column's length
MAX_COUNTER = 2**53  # a usage counter above this is no count of tokens


def line_error(number: int, message: str, field: str | None = None) -> Invalid:
    """422 naming the line, and in the message the field of it (`message.content[0].id`)."""
    if field:
        message = f"{field} {message}"
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


def _parse_time(value: Any, number: int) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    try:  # stored in UTC: year 1 with a positive offset falls before year 1
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError:
        raise line_error(number, "is out of range", "timestamp") from None


def _content(message: dict[str, Any], number: int, role: str) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise line_error(number, "message.content must be a string or a list of blocks")
    try:  # what the model API would refuse on every later turn is refused now
        check_content(content, "message.content", str(message.get("role") or role))
    except ShapeError as exc:
        raise line_error(number, exc.message, exc.where) from None
    return content


def _usage(message: dict[str, Any], number: int) -> dict[str, int] | None:
    usage = message.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise line_error(number, "message.usage must be an object")
    # Parley stores the integer counters only, as the agent loop does.
    return {
        k: v
        for k, v in usage.items()
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNTER
    }


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
        "content": _content(message, number, "assistant" if kind == "assistant" else "user"),
    }
    if kind == "assistant":
        model = _optional_str(message, "model", number)
        stop_reason = _optional_str(message, "stop_reason", number)
        if stop_reason is not None and len(stop_reason) > MAX_STOP_REASON:
            raise line_error(number, f"is longer than {MAX_STOP_REASON}", "message.stop_reason")
        fields.update(
            message_id=_optional_str(message, "id", number),
            model=model[:MAX_MODEL] if model else None,
            stop_reason=stop_reason,
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
        "created_at": _parse_time(obj.get("timestamp"), number),
    }
    if kind == "system":
        line = SourceLine(**common, role=None, content=[], meta=_boundary_meta(obj))
    else:
        line = SourceLine(**common, **_message_fields(obj, kind, number))
    stored = {
        "uuid": line.uuid,
        "parentUuid": line.parent,
        "logicalParentUuid": line.logical_parent,
        "subtype": line.subtype,
        "message.id": line.message_id,
        "message.model": line.model,
        "message.stop_reason": line.stop_reason,
        "compactMetadata": line.meta,
    }
    for name, value in stored.items():
        try:
            check_storable(value, name)
        except ShapeError as exc:
            raise line_error(number, exc.message, exc.where) from None
    return line


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
        session_id = obj.get("sessionId")
        if self.source_session_id is None and isinstance(session_id, str):
            self.source_session_id = None if unstorable(session_id) else session_id[:200]

    def _skip(self, obj: dict[str, Any]) -> None:
        source = obj.get("uuid")
        if isinstance(source, str) and source not in self.index:
            parent = obj.get("parentUuid") or obj.get("logicalParentUuid")
            self.skipped.setdefault(source, parent if isinstance(parent, str) else None)
        summary = obj.get("summary")
        if obj.get("type") == "summary" and isinstance(summary, str) and not unstorable(summary):
            self.title = summary[:500] or None

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
