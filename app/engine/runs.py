"""The run row and its event log outside the loop: looking runs up, claiming a session,
ending a run that no task is executing (paused, queued, remote or dead), and answering
open tool uses so the history stays valid whatever stopped the run.

A run is active while `running` or `requires_action`; the database allows one active run
per session (a unique partial index), so a claim holds across processes. Each claim
(`own`) and each ending from outside (`end`) bumps the run's epoch, which fences off the
process that owned it before (events.LostOwnership).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, and_, func, insert, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app.context.blocks import as_blocks
from app.conversation import store
from app.conversation.payloads import message_payload, run_json
from app.conversation.records import MessageRecord, new_message
from app.domain import ACTIVE_RUN_STATUSES, RunStatus, ToolResult
from app.engine.events import EventHub, StoredEvent, dumps, event_rows
from app.engine.webhooks import outbox
from app.errors import Conflict, NotFound
from app.models import AgentSession, Run, RunEvent
from app.pagination import as_datetime, decode_cursor, page

run_events_t = cast(Table, RunEvent.__table__)

CANCELLED_TOOL_TEXT = "[Tool use was cancelled before it returned a result]"
EXPIRED_TOOL_TEXT = "[No result: the client did not answer this tool call in time]"
INTERRUPTED_TOOL_TEXT = "[Tool use was interrupted: the run stopped before a result arrived]"


def now() -> datetime:
    return datetime.now(UTC)


def lease_deadline(seconds: float) -> datetime:
    return now() + timedelta(seconds=seconds)


def own(run: Run, *, worker_id: str, lease_seconds: float) -> None:
    """Make this process the run's owner under a new epoch."""
    run.epoch = (run.epoch or 0) + 1
    run.worker_id = worker_id
    run.lease_expires_at = lease_deadline(lease_seconds)


def conflict_for(run: Run) -> Conflict:
    return Conflict(
        f"Session {run.session_id} already has an active run {run.id} ({run.status})",
        extra={"run_id": str(run.id)},
    )


async def load(db: AsyncSession, session_id: uuid.UUID, run_id: uuid.UUID) -> Run:
    run = await db.get(Run, run_id)
    if run is None or run.session_id != session_id:
        raise NotFound(f"Run {run_id} not found in this session")
    return run


async def active(db: AsyncSession, session_id: uuid.UUID) -> Run | None:
    return await db.scalar(
        select(Run).where(Run.session_id == session_id, Run.status.in_(ACTIVE_RUN_STATUSES))
    )


async def status_of(db: AsyncSession, run_id: uuid.UUID) -> RunStatus | None:
    return await db.scalar(select(Run.status).where(Run.id == run_id))


async def list_page(
    db: AsyncSession, session_id: uuid.UUID, *, after: str | None, limit: int
) -> tuple[list[Run], str | None]:
    """Runs of the session, newest first."""
    query = select(Run).where(Run.session_id == session_id)
    if after:
        created, run_id = decode_cursor(after, as_datetime, uuid.UUID)
        query = query.where(
            or_(Run.created_at < created, and_(Run.created_at == created, Run.id < run_id))
        )
    rows = list(
        await db.scalars(query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit + 1))
    )
    return page(rows, limit, lambda r: (r.created_at, r.id))


async def by_idempotency_key(db: AsyncSession, session_id: uuid.UUID, key: str) -> Run | None:
    return await db.scalar(
        select(Run).where(Run.session_id == session_id, Run.idempotency_key == key)
    )


async def has_queued(db: AsyncSession, session_id: uuid.UUID) -> bool:
    queued = select(Run.id).where(Run.session_id == session_id, Run.status == RunStatus.QUEUED)
    return await db.scalar(queued.limit(1)) is not None


async def oldest_queued(db: AsyncSession, session_id: uuid.UUID) -> Run | None:
    """The next queued run to start, locked until the caller's transaction ends: one
    that another transaction is starting right now is skipped (it starts once)."""
    return await db.scalar(
        select(Run)
        .where(Run.session_id == session_id, Run.status == RunStatus.QUEUED)
        .order_by(Run.created_at, Run.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )


async def append_events(
    db: AsyncSession,
    hub: EventHub,
    run: Run,
    items: list[tuple[str, Any]],
    *,
    after: int | None,
    notify: bool = True,
) -> None:
    """Store events of a run that has no live channel here (being claimed, paused,
    queued, remote or dead), in the caller's transaction, after event `after` (None:
    after the last one stored) and after any id an owner reserved (never reused)."""
    if after is None:
        stored = await db.scalar(select(func.max(RunEvent.seq)).where(RunEvent.run_id == run.id))
        after = int(stored or 0)
    after = max(after, run.reserved_seq or 0)
    batch = [StoredEvent(after + i, name, dumps(data)) for i, (name, data) in enumerate(items, 1)]
    await db.execute(insert(run_events_t), event_rows(run.id, batch))
    await outbox.enqueue(db, run.id, ((e.event, e.data) for e in batch))
    run.last_event_seq = run.reserved_seq = batch[-1].seq
    if notify:
        await hub.notify(db, run.id, batch[-1].seq)


async def answer_open_tool_uses(
    db: AsyncSession,
    session_id: uuid.UUID,
    head: uuid.UUID | None,
    run_id: uuid.UUID,
    text: str,
    known: dict[str, ToolResult] | None = None,
) -> MessageRecord | None:
    """If `head` is an assistant message with tool uses, store their results (known ones
    as computed, the rest as the placeholder `text`) so the history stays valid."""
    if head is None:
        return None
    record = await store.get_message(db, session_id, head)
    if record is None or record.role != "assistant":
        return None
    uses = [b for b in record.content if b.get("type") == "tool_use"]
    if not uses:
        return None
    known = known or {}
    blocks = []
    for use in uses:
        result = known.get(use["id"]) or ToolResult(content=text, is_error=True)
        blocks.append(
            {
                "type": "tool_result",
                "tool_use_id": use["id"],
                "content": result.content,
                "is_error": result.is_error,
            }
        )
    return await store.append(
        db,
        new_message(
            session_id=session_id,
            parent_uuid=record.uuid,
            type="user",
            role="user",
            content=blocks,
            run_id=run_id,
        ),
    )


async def claim(
    db: AsyncSession,
    hub: EventHub,
    session: AgentSession,
    run: Run,
    *,
    worker_id: str,
    lease_seconds: float,
) -> MessageRecord | None:
    """Make `run` the session's active run, store its user message and report both
    (`run.started`, `message.completed`) in the same transaction; the message stored,
    if any. A conflict rolls the whole transaction back: nothing of the turn is stored."""
    content = run.params.content
    parent_uuid = run.params.parent_uuid or session.head_uuid
    head = parent_uuid
    record = None
    if content is not None:
        record = await store.append(
            db,
            new_message(
                session_id=session.id,
                parent_uuid=parent_uuid,
                type="user",
                role="user",
                content=as_blocks(content),
                run_id=run.id,
            ),
        )
        head = record.uuid
        run.user_message_uuid = head
    else:  # a regeneration or a compaction: the run starts from the given node
        await store.set_head(db, session.id, parent_uuid)
    set_committed_value(session, "head_uuid", head)
    run.status = RunStatus.RUNNING
    run.started_at = now()
    own(run, worker_id=worker_id, lease_seconds=lease_seconds)
    db.add(run)
    try:
        await db.flush()
    except IntegrityError:
        session_id = run.session_id  # read before the rollback expires the objects
        await db.rollback()
        holder = await active(db, session_id)
        if holder is not None:
            raise conflict_for(holder) from None
        raise
    events: list[tuple[str, Any]] = [("run.started", run_json(run))]
    if record is not None:
        events.append(("message.completed", message_payload(record)))
    # No notification: until this commits nobody can know the run is running.
    await append_events(db, hub, run, events, after=run.last_event_seq, notify=False)
    await db.flush()
    return record


async def end(
    db: AsyncSession,
    hub: EventHub,
    run: Run,
    status: RunStatus,
    error: dict[str, Any] | None = None,
    *,
    answered: MessageRecord | None = None,
) -> None:
    """Finish a run no task here is executing and report it, with the message that
    answered its open tool uses (`answer_open_tool_uses`), if one was stored."""
    run.status = status
    run.error = error
    run.required_action = None
    run.finished_at = now()
    run.lease_expires_at = None
    run.streaming_uuid = None
    run.cancel_requested_at = None
    run.epoch = (run.epoch or 0) + 1  # a process still executing it may not write now
    events: list[tuple[str, Any]] = []
    if answered is not None:
        events.append(("message.completed", message_payload(answered)))
    events.append((f"run.{status}", run_json(run)))
    await append_events(db, hub, run, events, after=None)
    await db.flush()


async def unfinished(db: AsyncSession, session_id: uuid.UUID) -> list[Run]:
    """The session's active and queued runs."""
    statuses = (*ACTIVE_RUN_STATUSES, RunStatus.QUEUED)
    return list(
        await db.scalars(select(Run).where(Run.session_id == session_id, Run.status.in_(statuses)))
    )


async def outcome(
    db: AsyncSession, run_id: uuid.UUID, *, messages_from: int = 0
) -> tuple[Run, list[MessageRecord]]:
    """A settled run and the messages it stored (from a seq on)."""
    run = await db.get(Run, run_id)
    if run is None:
        raise NotFound(f"Run {run_id} not found")
    return run, await store.messages_of_run(db, run_id, from_seq=messages_from)
