"""Transcript export: a session's full chain (root to head, across compact boundaries)
as Claude Code transcript lines, one per message, oldest first, rendered as JSONL a few
lines at a time."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY
from app.conversation import store
from app.conversation.records import MessageRecord
from app.models import AgentSession

BOUNDARY_TEXT = "Conversation compacted"  # what Claude Code writes on its boundary lines
EXPORT_BATCH = 64  # lines per streamed chunk


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


def _message(row: MessageRecord) -> dict[str, Any]:
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


def _system_fields(row: MessageRecord) -> dict[str, Any]:
    if row.subtype != COMPACT_BOUNDARY:
        return {"subtype": row.subtype, "content": _text_of(row.content), "level": "info"}
    meta = row.metadata or {}
    return {
        "subtype": COMPACT_BOUNDARY,
        "content": BOUNDARY_TEXT,
        "level": "info",
        "compactMetadata": {"trigger": meta.get("trigger"), "preTokens": meta.get("pre_tokens")},
    }


def export_line(row: MessageRecord, session_id: str) -> dict[str, Any]:
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


async def export_rows(db: AsyncSession, session: AgentSession) -> list[MessageRecord]:
    """The session's full chain, root to head, oldest first."""
    return await store.chain(db, session.head_uuid, full=True)


async def render(rows: Iterable[MessageRecord], session_id: uuid.UUID) -> AsyncIterator[bytes]:
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
