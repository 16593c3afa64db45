"""Context marks: snips, micro-compaction watermarks and collapse spans. Each is a row
tied to a message, so it stays right after a head move, a fork or a compaction's
verbatim copies (which take copies of the marks of the rows they copy).

Every writer here bumps the session's `marks_version` in the same transaction, so a
copy of the marks read at a version (the view cache keeps one) is known to be current
when the session row shows that version: the hot path then skips the marks query."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    DateTime,
    Integer,
    Table,
    Text,
    Uuid,
    bindparam,
    literal,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.context.projection import CollapseSpan
from app.models import AgentSession, Collapse, MicroWatermark, Snip

sessions_t = cast(Table, AgentSession.__table__)


@dataclass
class Marks:
    snipped: set[str] = field(default_factory=set)
    watermark_anchors: list[str] = field(default_factory=list)
    collapses: list[CollapseSpan] = field(default_factory=list)


def _marks_query() -> Any:
    """Snips, micro watermarks and collapses of a session in one round trip (built once)."""
    sid = bindparam("sid", type_=Uuid)
    no_uuid, no_time = null().cast(Uuid), null().cast(DateTime(timezone=True))
    no_text, no_int = null().cast(Text), null().cast(Integer)
    c = Collapse.__table__.c
    return union_all(
        select(
            literal("snip").label("kind"),
            Snip.message_uuid.label("a"),
            no_uuid.label("b"),
            no_uuid.label("id"),
            no_time.label("applied_at"),
            no_time.label("created_at"),
            no_text.label("summary"),
            no_int.label("tokens_saved"),
            no_text.label("model"),
        ).where(Snip.session_id == sid),
        select(
            literal("micro"),
            MicroWatermark.anchor_uuid,
            no_uuid,
            no_uuid,
            no_time,
            no_time,
            no_text,
            no_int,
            no_text,
        ).where(MicroWatermark.session_id == sid),
        select(
            literal("collapse"),
            c.start_uuid,
            c.end_uuid,
            c.id,
            c.applied_at,
            c.created_at,
            c.summary,
            c.tokens_saved,
            c.model,
        ).where(c.session_id == sid),
    )


MARKS_QUERY = _marks_query()


async def load(db: AsyncSession, session_id: uuid.UUID) -> Marks:
    marks = Marks()
    for mark in await db.execute(MARKS_QUERY, {"sid": session_id}):
        if mark.kind == "snip":
            marks.snipped.add(str(mark.a))
        elif mark.kind == "micro":
            marks.watermark_anchors.append(str(mark.a))
        else:
            marks.collapses.append(
                CollapseSpan(
                    id=mark.id,
                    start_uuid=mark.a,
                    end_uuid=mark.b,
                    summary=mark.summary,
                    tokens_saved=mark.tokens_saved,
                    model=mark.model,
                    applied_at=mark.applied_at,
                    created_at=mark.created_at,
                )
            )
    return marks


async def snipped_among(db: AsyncSession, uuids: list[uuid.UUID]) -> set[uuid.UUID]:
    return set(await db.scalars(select(Snip.message_uuid).where(Snip.message_uuid.in_(uuids))))


async def bump(db: AsyncSession, session_id: uuid.UUID) -> None:
    """The session's marks change in this transaction: copies read before are stale."""
    await db.execute(
        update(sessions_t)
        .where(sessions_t.c.id == session_id)
        .values(marks_version=sessions_t.c.marks_version + 1)
    )


async def add_snips(db: AsyncSession, session_id: uuid.UUID, uuids: list[uuid.UUID]) -> None:
    if uuids:
        await bump(db, session_id)
    for message_uuid in uuids:
        db.add(Snip(session_id=session_id, message_uuid=message_uuid))


async def add_watermark(
    db: AsyncSession, session_id: uuid.UUID, anchor_uuid: uuid.UUID, tokens_freed: int
) -> None:
    db.add(
        MicroWatermark(session_id=session_id, anchor_uuid=anchor_uuid, tokens_freed=tokens_freed)
    )
    await bump(db, session_id)


async def mark_applied(
    db: AsyncSession, session_id: uuid.UUID, spans: list[CollapseSpan], when: datetime
) -> None:
    await db.execute(
        update(Collapse).where(Collapse.id.in_([span.id for span in spans])).values(applied_at=when)
    )
    await bump(db, session_id)


async def add_collapse(
    db: AsyncSession,
    session_id: uuid.UUID,
    *,
    start_uuid: uuid.UUID,
    end_uuid: uuid.UUID,
    summary: str,
    tokens_saved: int,
    model: str | None,
) -> None:
    await bump(db, session_id)
    db.add(
        Collapse(
            session_id=session_id,
            start_uuid=start_uuid,
            end_uuid=end_uuid,
            summary=summary,
            tokens_saved=tokens_saved,
            model=model,
        )
    )


async def copy_marks(
    db: AsyncSession,
    source_id: uuid.UUID,
    target_id: uuid.UUID,
    new_ids: dict[uuid.UUID, uuid.UUID],
) -> None:
    """Marks anchored on copied messages follow them to their copies (`new_ids`:
    original uuid -> copy), so a fork or a compaction's verbatim copies show the model
    the same projection."""
    snips = await db.scalars(select(Snip).where(Snip.session_id == source_id))
    for snip in snips:
        if snip.message_uuid in new_ids:
            db.add(Snip(session_id=target_id, message_uuid=new_ids[snip.message_uuid]))
    watermarks = await db.scalars(
        select(MicroWatermark).where(MicroWatermark.session_id == source_id)
    )
    for mark in watermarks:
        if mark.anchor_uuid in new_ids:
            db.add(
                MicroWatermark(
                    session_id=target_id,
                    anchor_uuid=new_ids[mark.anchor_uuid],
                    tokens_freed=mark.tokens_freed,
                    created_at=mark.created_at,
                )
            )
    spans = await db.scalars(select(Collapse).where(Collapse.session_id == source_id))
    for span in spans:
        if span.start_uuid in new_ids and span.end_uuid in new_ids:
            db.add(
                Collapse(
                    session_id=target_id,
                    start_uuid=new_ids[span.start_uuid],
                    end_uuid=new_ids[span.end_uuid],
                    summary=span.summary,
                    tokens_saved=span.tokens_saved,
                    model=span.model,
                    applied_at=span.applied_at,
                    created_at=span.created_at,
                )
            )
    await bump(db, target_id)
