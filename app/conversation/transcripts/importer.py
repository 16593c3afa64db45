"""Transcript import, last step: the drafts inserted into a new, empty session, each
with a fresh uuid (the source one kept as `metadata.source_uuid`) and a `seq` in file
order."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.conversation import sessions
from app.conversation.records import MessageRecord, new_message
from app.conversation.store import messages_t
from app.conversation.transcripts.reader import read_transcript
from app.conversation.transcripts.tree import Draft, build_tree
from app.models import AgentSession, utcnow
from app.schemas import SessionCreate

INSERT_BATCH = 1_000


def _draft_meta(draft: Draft) -> dict[str, Any]:
    first = draft.lines[0]
    meta: dict[str, Any] = dict(first.meta or {})
    meta["source_uuid"] = first.uuid
    if len(draft.lines) > 1:
        meta["source_uuids"] = [line.uuid for line in draft.lines]
    if first.message_id:
        meta["source_message_id"] = first.message_id
    return meta


def _record(draft: Draft, drafts: list[Draft], session_id: uuid.UUID, seq: int) -> MessageRecord:
    first, last = draft.lines[0], draft.lines[-1]
    content = (
        first.content
        if len(draft.lines) == 1
        else [block for line in draft.lines for block in line.content]
    )
    return new_message(
        session_id=session_id,
        uuid_=draft.uuid,
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
        metadata=_draft_meta(draft),
        created_at=first.created_at,
    ).with_(seq=seq)


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
            _record(drafts[i], drafts, session.id, seqs[i]).values()
            for i in range(start, min(start + INSERT_BATCH, len(drafts)))
        ]
        await db.execute(insert(messages_t), batch)
    session.message_seq = len(drafts)
    session.head_uuid = head.uuid
    session.updated_at = utcnow()
    await db.flush()


async def import_session(
    db: AsyncSession,
    tenant: str,
    settings: Settings,
    chunks: AsyncIterable[bytes],
    *,
    title: str | None,
    model: str | None,
) -> AgentSession:
    """A new session holding the transcript read from `chunks`, ready to be continued."""
    transcript = await read_transcript(chunks)
    drafts, head = build_tree(transcript)
    body = SessionCreate(
        title=title or transcript.title,
        model=model or transcript.model() or settings.model,
        metadata={"imported": {"source_session_id": transcript.source_session_id}},
    )
    session = await sessions.create(db, tenant, body, settings)
    await store_tree(db, session, drafts, head)
    return session
