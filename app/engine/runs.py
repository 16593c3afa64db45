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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import instance_dict, instance_state, set_committed_value

from app.context.blocks import as_blocks
from app.conversation import store
from app.conversation.payloads import message_payload, run_json
from app.conversation.records import MessageRecord, new_message
from app.db import Database
from app.domain import ACTIVE_RUN_STATUSES, RunKind, RunStatus, ToolResult
from app.engine.events import (
    INSERT_EVENTS,
    RESERVE_BLOCK,
    EventHub,
    StoredEvent,
    dumps,
    event_arrays,
    event_rows,
    numbered,
)
from app.engine.webhooks import outbox
from app.errors import Conflict, NotFound
from app.models import AgentSession, Run, RunEvent
from app.pagination import dated_key, newest_first, page

run_events_t = cast(Table, RunEvent.__table__)

CANCELLED_TOOL_TEXT = "[Tool use was cancelled before it returned a result]"
EXPIRED_TOOL_TEXT = "[No result: the client did not answer this tool call in time]"
INTERRUPTED_TOOL_TEXT = "[Tool use was interrupted: the run stopped before a result arrived]"


def now() -> datetime:
    return datetime.now(UTC)


def lease_deadline(seconds: float) -> datetime:
    return now() + timedelta(seconds=seconds)


def new_run(**values: Any) -> Run:
    """A new run holding `values`, filled the way the ORM fills a row it loads rather
    than attribute by attribute (a turn's hot path); `db.add` inserts it as usual."""
    run = cast(Run, Run.__mapper__.class_manager.new_instance())
    instance_dict(run).update(values)
    return run


def _set(run: Run, **values: Any) -> None:
    """Set `values` on `run`: into its dict while it is transient (no session has held
    it: its INSERT takes them from there and nothing else tracks it; a new turn's hot
    path), else through the ORM, which tracks the change for the session's flush."""
    if instance_state(run).transient:
        instance_dict(run).update(values)
    else:
        for name, value in values.items():
            setattr(run, name, value)


def own(run: Run, *, worker_id: str, lease_seconds: float) -> None:
    """Make this process the run's owner under a new epoch."""
    _set(
        run,
        epoch=(run.epoch or 0) + 1,
        worker_id=worker_id,
        lease_expires_at=lease_deadline(lease_seconds),
    )


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
    query = newest_first(select(Run).where(Run.session_id == session_id), Run, after, limit)
    return page(list(await db.scalars(query)), limit, dated_key)


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
    db: AsyncSession, hub: EventHub, run: Run, items: list[tuple[str, Any]]
) -> None:
    """Store events of a run that has no live channel here (paused, queued, remote or
    dead), in the caller's transaction, after the last one stored and after any id an
    owner reserved (never reused), and tell followers elsewhere."""
    stored = await db.scalar(select(func.max(RunEvent.seq)).where(RunEvent.run_id == run.id))
    batch = numbered(max(int(stored or 0), run.reserved_seq or 0), items)
    await db.execute(INSERT_EVENTS, event_rows(run.id, batch))
    await outbox.enqueue(db, run.id, ((e.event, e.data) for e in batch))
    run.last_event_seq = run.reserved_seq = batch[-1].seq
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


@dataclass(slots=True)
class Claimed:
    """What a claim stored: the user's message (if the run has one) and the events that
    report the claim."""

    record: MessageRecord | None
    events: list[StoredEvent]
    # The session row's version (`xmin`) as a claim guarded on the version left it: set
    # when its statement returns (a run launched while it is sent reads it once the
    # claim is confirmed).
    version: str | None = None


async def claim(
    db: AsyncSession,
    session: AgentSession,
    run: Run,
    *,
    worker_id: str,
    lease_seconds: float,
) -> Claimed:
    """Make `run` the session's active run, store its user message and report both
    (`run.started`, `message.completed`) in the same transaction. A conflict rolls the
    whole transaction back: nothing of the turn is stored."""
    content = run.params.content
    parent_uuid = run.params.parent_uuid or session.head_uuid
    record = None
    if content is not None:
        record = await store.append(db, _user_message(session, run, parent_uuid))
    else:  # a regeneration or a compaction: the run starts from the given node
        await store.set_head(db, session.id, parent_uuid)
    claimed = _start(session, run, record, parent_uuid, worker_id, lease_seconds)
    db.add(run)
    try:
        await db.flush()
    except IntegrityError:
        await _lost_race(db, session.id)
        raise
    # No notification: until this commits nobody can know the run is running.
    await db.execute(INSERT_EVENTS, event_rows(run.id, claimed.events))
    await outbox.enqueue(db, run.id, ((e.event, e.data) for e in claimed.events))
    return claimed


async def claim_at_once(
    db: AsyncSession,
    database: Database,
    session: AgentSession,
    run: Run,
    *,
    worker_id: str,
    lease_seconds: float,
    version: str | None = None,
    sending: Callable[[Claimed], None] | None = None,
) -> Claimed | None:
    """`claim` of a new turn as one statement (Postgres), guarded on the session as it
    was read (`session`: its head and message count, and its row version when given)
    with no active run and no run of the turn's idempotency key. The statement is its
    own transaction (`Database.execute_once`): when this returns a claim, it is stored.
    None when the guard fails (something changed since the read, another run is active,
    a retry): nothing is written, and the caller takes the careful path (`claim`, after
    looking) in `db`. With `version`, the claim carries the row's new one. `sending` is
    called with the claim as it will be stored just before the statement is sent (to
    start the run meanwhile); the same object is returned when it was."""
    assert run.params.content is not None
    assert run.params.parent_uuid is None
    seen_head, seen_seq, epoch = session.head_uuid, session.message_seq, run.epoch
    record = _user_message(session, run, seen_head, seq=seen_seq + 1)
    claimed = _start(session, run, record, seen_head, worker_id, lease_seconds)
    params = {
        "session_id": session.id,
        "seen_head": seen_head,
        "seen_seq": seen_seq,
        "seen_version": version,
        "key": run.idempotency_key,
        "now": record.created_at,
        "m_uuid": record.uuid,
        "m_seq": record.seq,
        "m_content": dumps(record.content),
        "m_tokens": record.token_estimate,
        "run_id": run.id,
        "kind": run.kind.value,
        "status": run.status.value,
        "params": dumps(run.params.model_dump(mode="json", exclude_defaults=True)),
        "state": dumps(run.state.model_dump(mode="json", exclude_defaults=True)),
        "hash": run.request_hash,
        "last_seq": run.last_event_seq,
        "worker_id": run.worker_id,
        "lease": run.lease_expires_at,
        "epoch": run.epoch,
        "reserved": run.reserved_seq,
        "streaming": run.streaming_uuid,
        "created_at": run.created_at,
        "started_at": run.started_at,
        **event_arrays(claimed.events),
    }
    if sending is not None:
        sending(claimed)
    try:
        rows = await database.execute_once(CLAIM_AT_ONCE, params)
    except IntegrityError:  # an active run the statement's snapshot could not see yet
        await _lost_race(db, session.id)
        raise
    if not rows:
        set_committed_value(session, "head_uuid", seen_head)
        _set(run, status=RunStatus.QUEUED, epoch=epoch, started_at=None)
        return None
    set_committed_value(session, "message_seq", record.seq)
    if version is not None:
        claimed.version = rows[0][1]
    return claimed


# `claim_at_once`: the session row moves to the new message only while it is as it was
# read, with no active run and no run of the key; the message, the run and its first
# events are inserted only when it did (FROM claimed).
CLAIM_AT_ONCE = text(
    """
    WITH claimed AS (
        UPDATE agent_sessions
        SET message_seq = message_seq + 1, head_uuid = :m_uuid, updated_at = :now
        WHERE id = :session_id
          AND message_seq = :seen_seq
          AND head_uuid IS NOT DISTINCT FROM CAST(:seen_head AS uuid)
          AND (CAST(:seen_version AS text) IS NULL OR xmin::text = :seen_version)
          AND NOT EXISTS (
              SELECT 1 FROM runs
              WHERE session_id = :session_id AND status IN ('running', 'requires_action')
          )
          AND NOT EXISTS (
              SELECT 1 FROM runs
              WHERE session_id = :session_id AND idempotency_key = CAST(:key AS varchar)
          )
        RETURNING id, xmin::text AS version
    ), message AS (
        INSERT INTO messages (
            uuid, session_id, seq, parent_uuid, type, role, content, is_meta,
            token_estimate, run_id, created_at
        )
        SELECT :m_uuid, id, :m_seq, :seen_head, 'user', 'user', CAST(:m_content AS jsonb),
               false, :m_tokens, :run_id, :now
        FROM claimed
    ), new_run AS (
        INSERT INTO runs (
            id, session_id, kind, status, user_message_uuid, usage, params, state,
            idempotency_key, request_hash, last_event_seq, worker_id, lease_expires_at,
            epoch, reserved_seq, takeovers, streaming_uuid, created_at, started_at
        )
        SELECT :run_id, id, :kind, :status, :m_uuid, '{}', CAST(:params AS jsonb),
               CAST(:state AS jsonb), :key, :hash, :last_seq, :worker_id, :lease, :epoch,
               :reserved, 0, :streaming, :created_at, :started_at
        FROM claimed
    ), events AS (
        INSERT INTO run_events (run_id, seq, event, data, created_at)
        SELECT :run_id, e.seq, e.event, e.data, :now
        FROM claimed, unnest(
            CAST(:e_seqs AS bigint[]), CAST(:e_names AS text[]), CAST(:e_data AS text[])
        ) AS e(seq, event, data)
    )
    SELECT id, version FROM claimed
    """
)


async def _lost_race(db: AsyncSession, session_id: uuid.UUID) -> None:
    """After a claim failed on a unique index: roll the whole transaction back (nothing
    of the turn is stored) and raise the 409 for the run that won, if it is active."""
    await db.rollback()
    holder = await active(db, session_id)
    if holder is not None:
        raise conflict_for(holder) from None


def _user_message(
    session: AgentSession, run: Run, parent: uuid.UUID | None, seq: int = 0
) -> MessageRecord:
    assert run.params.content is not None
    return new_message(
        session_id=session.id,
        parent_uuid=parent,
        type="user",
        role="user",
        content=as_blocks(run.params.content),
        run_id=run.id,
        seq=seq,
    )


def _start(
    session: AgentSession,
    run: Run,
    record: MessageRecord | None,
    parent: uuid.UUID | None,
    worker_id: str,
    lease_seconds: float,
) -> Claimed:
    """Set the run running under this owner from the claim on (in memory), and the
    events that report the claim."""
    head = record.uuid if record is not None else parent
    set_committed_value(session, "head_uuid", head)
    _set(
        run,
        user_message_uuid=record.uuid if record is not None else None,
        status=RunStatus.RUNNING,
        started_at=now(),
    )
    own(run, worker_id=worker_id, lease_seconds=lease_seconds)
    items: list[tuple[str, Any]] = [("run.started", run_json(run))]
    if record is not None:
        items.append(("message.completed", message_payload(record)))
    batch = numbered(max(run.last_event_seq, run.reserved_seq or 0), items)
    # The owner's first block of ids, and the uuid its first reply streams under, are
    # reserved with the claim: the model is called without another write first.
    reserved: dict[str, Any] = {"reserved_seq": batch[-1].seq + RESERVE_BLOCK}
    if run.kind == RunKind.TURN:
        reserved["streaming_uuid"] = uuid.uuid4()
    _set(run, last_event_seq=batch[-1].seq, **reserved)
    return Claimed(record, batch)


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
    await append_events(db, hub, run, events)
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
