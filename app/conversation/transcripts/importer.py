"""Transcript import, last step: the drafts inserted into a new, empty session, each
with a fresh uuid (the source one kept as `metadata.source_uuid`) and a `seq` in file
order."""

from __future__ import annotations

import uuid
from typing import Any, cast

from sqlalchemy import Table, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.conversation.store import new_row
from app.conversation.transcripts.tree import Draft
from app.models import AgentSession, Message, utcnow

INSERT_BATCH = 1_000
# The Core table: SQLAlchemy types `__table__` as a FromClause, which insert() refuses.
MESSAGES = cast(Table, Message.__table__)


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
