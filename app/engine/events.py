"""The run event log: a growing sequence per run, stored as the exact text sent, replayed
from the store and then followed live (invariant 7).

A run executing in this process has a channel. Deltas (`emit_nowait`) are published at
once and written to the table in small batches off the hot path, so a process that
dies leaves a stored prefix. Events that report a finished step are written in the
step's own transaction (`step`), together with any deltas not yet written, and are
published only after the commit: a client never hears of a step that is not stored.
One task emits for a run, so publication follows the sequence.

Followers in this process subscribe to the channel; followers elsewhere read the
table, woken by Postgres LISTEN/NOTIFY (the notification carries ids, not payloads)
or, on SQLite, by polling. Either way a follower first catches up from the table and
the channel's unwritten events, then follows live, so it never skips an id.

Runs outlive processes (architecture: "Runs across processes"). Every write of the
owner is fenced by its epoch (`LostOwnership` when another process took the run over),
and an id is sent only once it is stored or reserved in the run row (`reserved_seq`),
so a later owner, which starts after the reserved block, never reuses one. The ids an
owner reserved but never stored form a lost range; a follower goes on with the next
stored id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Protocol, cast

import orjson
from sqlalchemy import (
    String,
    Table,
    Update,
    Uuid,
    bindparam,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import Database
from app.domain import FINAL_RUN_STATUSES
from app.engine.webhooks import outbox
from app.models import Run, RunEvent

runs_t = cast(Table, Run.__table__)
run_events_t = cast(Table, RunEvent.__table__)

log = logging.getLogger("parley.events")

NOTIFY_CHANNEL = "parley_run_events"
# Run control between processes: `cancel:<run id>` (stop it), `released:<run id>` (take
# it over now).
CONTROL_CHANNEL = "parley_run_control"
# Event ids an owner reserves at a time before sending them.
RESERVE_BLOCK = 256
# The deltas of a flush window, for every run at once: each run's row is fenced by its
# epoch, the events of the runs still owned are inserted, and followers elsewhere are
# told (one notification per run). Deltas are never webhook events: no outbox rows.
BATCH_FLUSH = text(
    """
    WITH v AS (
        SELECT * FROM unnest(
            CAST(:ids AS uuid[]), CAST(:epochs AS integer[]), CAST(:lasts AS bigint[])
        ) AS v(id, epoch, last_seq)
    ), fenced AS (
        UPDATE runs SET last_event_seq = v.last_seq FROM v
        WHERE runs.id = v.id AND runs.epoch = v.epoch
        RETURNING runs.id, v.last_seq
    ), stored AS (
        INSERT INTO run_events (run_id, seq, event, data, created_at)
        SELECT e.run_id, e.seq, e.event, e.data, now()
        FROM unnest(
            CAST(:e_runs AS uuid[]), CAST(:e_seqs AS bigint[]),
            CAST(:e_names AS text[]), CAST(:e_data AS text[])
        ) AS e(run_id, seq, event, data)
        WHERE e.run_id IN (SELECT id FROM fenced)
    )
    SELECT id, pg_notify(:channel, id::text || ':' || last_seq::text) FROM fenced
    """
)
# Events a run's channel keeps for followers to catch up from memory.
RECENT_EVENTS = 4096
TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled"})
PAUSE_EVENT = "run.requires_action"


# Built once: constructing a statement costs more CPU than running it.
INSERT_EVENTS = insert(run_events_t)


@lru_cache(maxsize=64)
def fenced_statement(columns: tuple[str, ...], notify: bool) -> Update:
    """The UPDATE that sets `columns` on a run row while the owner's epoch still holds
    it (the row lock orders it against a take-over), returning its id and, with
    `notify`, sending the followers' notification (Postgres: when the transaction
    commits). Its parameters come from `EventHub.fenced_update`; built once per shape."""
    c = runs_t.c
    values: dict[str, Any] = {
        name: bindparam(f"set_{name}", type_=c[name].type) for name in columns
    } or {"epoch": c.epoch}
    returning: list[Any] = [c.id]
    if notify:
        returning.append(
            func.pg_notify(
                bindparam("notify_channel", type_=String), bindparam("notify_payload", type_=String)
            )
        )
    return (
        update(runs_t)
        .where(c.id == bindparam("fence_run", type_=Uuid), c.epoch == bindparam("fence_epoch"))
        .values(values)
        .returning(*returning)
    )


class Waitable(Protocol):
    """An event to wait for (asyncio's or anyio's)."""

    async def wait(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class StoredEvent:
    seq: int
    event: str
    data: str  # JSON text, byte-for-byte what is sent


# Told to a follower when the server shuts down: not part of the run's log (no id).
SHUTDOWN = StoredEvent(
    0,
    "error",
    '{"type":"unavailable","title":"Service Unavailable","status":503,'
    '"detail":"The server is shutting down; reconnect with Last-Event-ID"}',
)


@dataclass(frozen=True, slots=True)
class Batch:
    """Events a follower sends together; whether its stream ends with them, or goes
    back to catching up (a gap, or the channel closed)."""

    events: list[StoredEvent]
    ends: bool = False
    interrupted: bool = False


class LostOwnership(Exception):
    """The run has another owner now (taken over, or ended elsewhere): this process must
    not write for it any more."""


# Datetimes and dataclasses to `default` (str), as `json.dumps` writes them.
_AS_JSON_DUMPS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def dumps(data: Any) -> str:
    """Compact JSON text. orjson: every event and stored message goes through here."""
    try:
        return orjson.dumps(data, default=str, option=_AS_JSON_DUMPS).decode()
    except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a lone surrogate
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


def numbered(after: int, items: list[tuple[str, Any]]) -> list[StoredEvent]:
    """Events (name, data) as stored, with the ids after `after`."""
    return [StoredEvent(after + i, name, dumps(data)) for i, (name, data) in enumerate(items, 1)]


def event_arrays(events: Iterable[StoredEvent]) -> dict[str, list[Any]]:
    """Events as the array parameters of the statements that insert them beside other
    rows with `unnest` (`BATCH_FLUSH`, the one-statement claim and end of a turn):
    `e_seqs`, `e_names`, `e_data`."""
    batch = list(events)
    return {
        "e_seqs": [e.seq for e in batch],
        "e_names": [e.event for e in batch],
        "e_data": [e.data for e in batch],
    }


def event_rows(run_id: uuid.UUID, events: list[StoredEvent]) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "seq": e.seq, "event": e.event, "data": e.data} for e in events]


@dataclass
class RunChannel:
    """The live side of one run executing in this process."""

    run_id: uuid.UUID
    next_seq: int
    epoch: int = 0  # the owner's fencing epoch
    reserved: int = 0  # ids up to this one may be sent before they are stored
    unwritten: list[StoredEvent] = field(default_factory=list)  # taken, not stored yet
    held: list[StoredEvent] = field(default_factory=list)  # unwritten, beyond `reserved`
    # What was sent (or stored by the claim), for followers to catch up from: the last
    # `RECENT_EVENTS` at most.
    recent: list[StoredEvent] = field(default_factory=list)
    subscribers: set[asyncio.Queue[StoredEvent | None]] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Set once the claim that made this owner is stored: at once, unless the run was
    # launched while its claim commits (`open(pending=True)`); until then nothing is
    # sent or written.
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    claim_reserved: int = 0  # what a pending claim reserved (released by `confirm`)
    reserving: asyncio.Task[None] | None = None
    lost: bool = False
    flush_failing: bool = False  # logged once per outage

    def take_seq(self, event: str, data: Any) -> StoredEvent:
        stored = StoredEvent(self.next_seq, event, dumps(data))
        self.next_seq += 1
        return stored

    def publish(self, event: StoredEvent | None) -> None:
        if event is not None:
            self.recent.append(event)
            if len(self.recent) > RECENT_EVENTS:
                del self.recent[: RECENT_EVENTS // 2]
        for subscriber in self.subscribers:
            subscriber.put_nowait(event)

    def since(self, last: int) -> list[StoredEvent] | None:
        """The events sent after id `last`, from memory; None when memory does not reach
        back that far (the table has them)."""
        recent = self.recent
        if not recent or recent[0].seq > last + 1:
            return None
        return [event for event in recent if event.seq > last]

    def release_held(self, upto: int) -> None:
        """Send the held events whose ids are now stored or reserved (in order)."""
        self.reserved = max(self.reserved, upto)
        while self.held and self.held[0].seq <= self.reserved:
            self.publish(self.held.pop(0))


class Step:
    """Events added inside a step transaction; published after its commit."""

    def __init__(self, hub: EventHub, channel: RunChannel, db: AsyncSession) -> None:
        self.hub = hub
        self.channel = channel
        self.db = db
        self.events: list[StoredEvent] = []
        self.run_values: dict[str, Any] = {}  # set on the run row with its last event seq
        # The owner's last step (a pause, the end) writes the run row itself
        # (`final_update`, `final_events`); the hub writes it no more.
        self.run_written = False
        self.webhooks = True  # False when its events are known to have no receiver
        self.written: list[StoredEvent] | None = None  # stored by the caller (`final_events`)

    def add(self, event: str, data: Any) -> None:
        self.events.append(self.channel.take_seq(event, data))

    def final_update(self, **values: Any) -> tuple[Update, dict[str, Any]]:
        """The UPDATE of the run row for the owner's last step (a pause, the end) and its
        parameters, to be run by the caller and followed by exactly one event, the one
        reporting it: fenced by the owner's epoch, with the step's `run_values`, that
        event's id as the last (the ids reserved beyond it go back) and the followers'
        notification. The step then writes no other UPDATE of the row: the caller's is
        the fence (no row means the run is no longer this owner's)."""
        channel = self.channel
        last = channel.next_seq  # the id of the event reported next
        self.run_written = True
        values = {**self.run_values, **values, "last_event_seq": last, "reserved_seq": last}
        return self.hub.fenced_update(channel, values, last)

    def final_events(self) -> list[StoredEvent]:
        """For an owner's last step that stores its events and settles the run row in
        its own statement (`finishing.finish_turn`): the events to store, the deltas not
        written yet and then the step's own. The hub then writes nothing more."""
        self.run_written = True
        self.written = [*self.channel.unwritten, *self.events]
        return self.written


class EventHub:
    def __init__(self, db: Database, flush_seconds: float) -> None:
        self.db = db
        self.flush_seconds = flush_seconds
        self.channels: dict[uuid.UUID, RunChannel] = {}
        self._wakeups: dict[uuid.UUID, set[asyncio.Event]] = {}
        self._flushes: set[asyncio.Task[None]] = set()
        # Runs with deltas to store at the end of the current flush window (all of them
        # in one statement, `_flush_batch`).
        self._dirty: dict[uuid.UUID, RunChannel] = {}
        self._flush_timer: asyncio.TimerHandle | None = None
        self._listener: Any = None
        self._listen_task: asyncio.Task[None] | None = None
        # Told of `CONTROL_CHANNEL` messages (kind, run id) and of runs this process lost.
        self.on_control: Callable[[str, uuid.UUID], None] | None = None
        self.on_lost: Callable[[uuid.UUID], None] | None = None

    # --- writing -------------------------------------------------------------------

    def open(
        self,
        run_id: uuid.UUID,
        last_seq: int,
        epoch: int = 0,
        *,
        reserved: int | None = None,
        history: list[StoredEvent] | None = None,
        pending: bool = False,
    ) -> RunChannel:
        """Start (or resume) the live channel of a run that executes here, owned with
        `epoch`; its ids start after `last_seq` (the last id stored or reserved by an
        owner before). A claim made here passes the ids it reserved for this owner
        (`reserved`) and the events it stored (`history`, kept for followers); while
        that claim is still committing (`pending`), the channel holds every event and
        write until `confirm` (or `abort`)."""
        channel = self.channels.get(run_id)
        if channel is None:
            reserved = max(last_seq, reserved or 0)
            channel = self.channels[run_id] = RunChannel(
                run_id=run_id,
                next_seq=last_seq + 1,
                epoch=epoch,
                reserved=last_seq if pending else reserved,
                claim_reserved=reserved,
                recent=list(history or ()),
            )
            if not pending:
                channel.ready.set()
                self.wake(run_id)  # followers polling the table can switch to the channel
        return channel

    def confirm(self, run_id: uuid.UUID) -> None:
        """The pending claim of a run executing here is committed: send what it held."""
        channel = self.channels.get(run_id)
        if channel is None or channel.ready.is_set():
            return
        channel.ready.set()
        channel.release_held(channel.claim_reserved)
        self.wake(run_id)

    def abort(self, run_id: uuid.UUID) -> None:
        """The pending claim of a run executing here rolled back: the run does not
        exist, nothing of it may be written (its task is stopped by the caller)."""
        channel = self.channels.pop(run_id, None)
        if channel is not None:
            channel.lost = True
            channel.ready.set()
            channel.publish(None)

    async def close(self, run_id: uuid.UUID) -> None:
        """Write what is left and end the channel (followers go on from the table)."""
        channel = self.channels.get(run_id)
        if channel is None:
            return
        if channel.reserving is not None:
            channel.reserving.cancel()
        if not channel.lost and channel.ready.is_set():
            await self._flush(channel)
        self.channels.pop(run_id, None)
        channel.publish(None)

    def emit_nowait(self, run_id: uuid.UUID, event: str, data: Any) -> bool:
        """A delta: published at once (or once its id is reserved), stored within
        `flush_seconds`. Whether it was handed to a follower now."""
        channel = self.channels[run_id]
        stored = channel.take_seq(event, data)
        channel.unwritten.append(stored)
        handed = False
        if stored.seq <= channel.reserved and not channel.held:
            channel.publish(stored)
            handed = bool(channel.subscribers)
        else:
            channel.held.append(stored)
        if (
            channel.reserved - stored.seq < RESERVE_BLOCK // 2
            and channel.reserving is None
            and channel.ready.is_set()  # a pending claim's block is released on `confirm`
        ):
            channel.reserving = asyncio.create_task(self._reserve_ahead(channel))
        self._dirty[run_id] = channel
        self._arm_flush()
        return handed

    async def reserve(self, run_id: uuid.UUID, **run_values: Any) -> None:
        """Reserve the next block of ids in the run row (with `run_values`) before they
        are sent: a later owner starts after it."""
        channel = await self.ready(run_id)
        async with channel.lock, self.db.transaction() as db:
            target = max(channel.reserved, channel.next_seq - 1) + RESERVE_BLOCK
            await self._fence(db, channel, {**run_values, "reserved_seq": target})
        channel.release_held(target)

    async def _reserve_ahead(self, channel: RunChannel) -> None:
        try:
            await self.reserve(channel.run_id)
        except LostOwnership:
            self._lose(channel)
        except Exception as exc:  # the next delta tries again; held ones wait
            log.warning("could not reserve event ids of run %s: %s", channel.run_id, exc)
        finally:
            channel.reserving = None

    def _lose(self, channel: RunChannel) -> None:
        channel.lost = True
        if self.on_lost is not None:
            self.on_lost(channel.run_id)

    @contextlib.asynccontextmanager
    async def step(self, run_id: uuid.UUID) -> AsyncIterator[Step]:
        """A transaction for one finished step and the events that report it."""
        channel = await self.ready(run_id)
        async with channel.lock, self.db.sessionmaker() as db:
            step = Step(self, channel, db)
            try:
                yield step
                if step.written is not None:
                    written = step.written
                else:
                    written = [*channel.unwritten, *step.events]
                    await self._write(
                        db,
                        channel,
                        written,
                        None if step.run_written else step.run_values,
                        webhooks=step.webhooks,
                    )
                await db.commit()
            except BaseException as exc:
                await db.rollback()
                # The step did not happen: give its ids back (none of them was sent).
                if step.events:
                    channel.next_seq = step.events[0].seq
                if isinstance(exc, LostOwnership):
                    channel.lost = True
                raise
            del channel.unwritten[: len(written) - len(step.events)]
            if written:
                channel.release_held(written[-1].seq)
        for event in step.events:
            channel.publish(event)

    async def ready(self, run_id: uuid.UUID) -> RunChannel:
        """The run's channel once its claim is stored; `LostOwnership` if it was not."""
        channel = self.channels[run_id]
        await channel.ready.wait()
        if channel.lost:
            raise LostOwnership(f"run {run_id} was not claimed")
        return channel

    async def hand_over(self, run_id: uuid.UUID) -> None:
        """Store what is left, release the run's lease (its ids up to the last one
        taken) and tell the other processes to take it over now."""
        channel = self.channels.get(run_id)
        if channel is None:
            return
        await channel.ready.wait()  # a pending claim commits (or not) first
        if channel.lost:
            return
        async with channel.lock, self.db.transaction() as db:
            # Every id taken so far is stored after this: the next owner starts right after.
            values: dict[str, Any] = {
                "lease_expires_at": datetime.now(UTC),
                "worker_id": None,
                "reserved_seq": channel.next_seq - 1,
            }
            await self._write(db, channel, list(channel.unwritten), values)
            await self.control(db, "released", run_id)
            channel.lost = True  # no write of this process after this
        channel.unwritten.clear()

    async def emit(self, run_id: uuid.UUID, event: str, data: Any) -> None:
        """An event of its own: returns once it is stored (and published)."""
        async with self.step(run_id) as step:
            step.add(event, data)

    def _arm_flush(self) -> None:
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(
                self.flush_seconds, self._schedule_flush
            )

    def _schedule_flush(self) -> None:
        self._flush_timer = None
        task = asyncio.create_task(self._flush_batch())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush_batch(self) -> None:
        """Store the deltas of every run of this process that has some, in one statement
        (one transaction, one round trip on Postgres), each run's fenced by its epoch. A
        run whose lock is held (a step, which stores its deltas too, or a reservation)
        waits for the next window."""
        dirty, self._dirty = self._dirty, {}
        taken: list[tuple[RunChannel, list[StoredEvent]]] = []
        for run_id, channel in dirty.items():
            if channel.lost or not channel.unwritten or self.channels.get(run_id) is not channel:
                continue
            if channel.lock.locked() or not channel.ready.is_set():
                self._dirty[run_id] = channel
                continue
            await channel.lock.acquire()  # free: taken at once, no suspension
            taken.append((channel, list(channel.unwritten)))
        if self._dirty:
            self._arm_flush()
        try:
            if taken:
                await self._store_batch(taken)
        finally:
            for channel, _batch in taken:
                channel.lock.release()

    async def _store_batch(self, taken: list[tuple[RunChannel, list[StoredEvent]]]) -> None:
        try:
            if self.db.is_sqlite:
                stored = await self._store_batch_steps(taken)
            else:
                stored = await self._store_batch_statement(taken)
        except Exception as exc:  # kept: the next window or step writes them
            for channel, _batch in taken:
                level = logging.DEBUG if channel.flush_failing else logging.WARNING
                log.log(level, "could not store events of run %s: %s", channel.run_id, exc)
                channel.flush_failing = True
                self._dirty[channel.run_id] = channel
            self._arm_flush()
            return
        for channel, batch in taken:
            if channel.run_id not in stored:
                self._lose(channel)
                continue
            channel.flush_failing = False
            # Dropped only after the commit: a follower finds each event in one place or
            # the other.
            del channel.unwritten[: len(batch)]
            channel.release_held(batch[-1].seq)

    async def _store_batch_statement(
        self, taken: list[tuple[RunChannel, list[StoredEvent]]]
    ) -> set[uuid.UUID]:
        """Postgres: fence, insert and notify in one autocommitted statement (no
        connection waits idle in a transaction for this loop); the runs still owned."""
        events = [(channel.run_id, e) for channel, batch in taken for e in batch]
        params = {
            "ids": [channel.run_id for channel, _ in taken],
            "epochs": [channel.epoch for channel, _ in taken],
            "lasts": [batch[-1].seq for _, batch in taken],
            "e_runs": [run_id for run_id, _ in events],
            **event_arrays(e for _, e in events),
            "channel": NOTIFY_CHANNEL,
        }
        rows = await self.db.execute_once(BATCH_FLUSH, params)
        return {row[0] for row in rows}

    async def _store_batch_steps(
        self, taken: list[tuple[RunChannel, list[StoredEvent]]]
    ) -> set[uuid.UUID]:
        """SQLite: one transaction, a fenced write per run."""
        stored: set[uuid.UUID] = set()
        async with self.db.transaction() as db:
            for channel, batch in taken:
                values = {"last_event_seq": batch[-1].seq}
                try:
                    await self._fence(db, channel, values)
                except LostOwnership:
                    continue
                await db.execute(INSERT_EVENTS, event_rows(channel.run_id, batch))
                stored.add(channel.run_id)
        return stored

    async def _flush(self, channel: RunChannel) -> None:
        """Store one run's unwritten events now (its channel closes)."""
        self._dirty.pop(channel.run_id, None)
        async with channel.lock:
            batch = list(channel.unwritten)
            if not batch or channel.lost:
                return
            try:
                async with self.db.transaction() as db:
                    await self._write(db, channel, batch, {})
            except LostOwnership:
                self._lose(channel)
                return
            except Exception as exc:  # kept: the next flush or step writes them
                level = logging.DEBUG if channel.flush_failing else logging.WARNING
                log.log(level, "could not store events of run %s: %s", channel.run_id, exc)
                channel.flush_failing = True
                return
            channel.flush_failing = False
            # Dropped only after the commit: a follower finds each event in one place or
            # the other.
            del channel.unwritten[: len(batch)]
            channel.release_held(batch[-1].seq)

    async def _write(
        self,
        db: AsyncSession,
        channel: RunChannel,
        events: list[StoredEvent],
        run_values: dict[str, Any] | None,
        *,
        webhooks: bool = True,
    ) -> None:
        """Store `events` (with their webhook deliveries, unless `webhooks` is False: none
        has a receiver) and set `run_values` (None: the step's own `final_update` did)
        with the last event's id on the run row, fenced, telling followers elsewhere."""
        if events:
            await db.execute(INSERT_EVENTS, event_rows(channel.run_id, events))
            if webhooks:
                await outbox.enqueue(db, channel.run_id, ((e.event, e.data) for e in events))
        if run_values is None:
            return
        values = dict(run_values)
        last = events[-1].seq if events else None
        if last is not None:
            values["last_event_seq"] = last
        await self._fence(db, channel, values, last)

    async def fenced(self, db: AsyncSession, run_id: uuid.UUID, values: dict[str, Any]) -> None:
        """Set `values` on a run executing here in the caller's transaction, fenced."""
        await self._fence(db, self.channels[run_id], values)

    def fenced_update(
        self, channel: RunChannel, values: dict[str, Any], notify_seq: int | None = None
    ) -> tuple[Update, dict[str, Any]]:
        """The fenced UPDATE setting `values` on the channel's run row
        (`fenced_statement`) and its parameters; with `notify_seq`, it also tells
        followers elsewhere that events up to that id are stored (Postgres)."""
        notify = notify_seq is not None and not self.db.is_sqlite
        params = {f"set_{name}": value for name, value in values.items()}
        params.update(fence_run=channel.run_id, fence_epoch=channel.epoch)
        if notify:
            params["notify_channel"] = NOTIFY_CHANNEL
            params["notify_payload"] = f"{channel.run_id}:{notify_seq}"
        return fenced_statement(tuple(sorted(values)), notify), params

    async def _fence(
        self,
        db: AsyncSession,
        channel: RunChannel,
        values: dict[str, Any],
        notify_seq: int | None = None,
    ) -> None:
        """Run `fenced_update`; `LostOwnership` when the run is no longer this owner's."""
        result = await db.execute(*self.fenced_update(channel, values, notify_seq))
        if result.first() is None:
            raise LostOwnership(f"run {channel.run_id} has another owner")

    async def notify(self, db: AsyncSession, run_id: uuid.UUID, seq: int) -> None:
        """Tell followers in other processes (sent when the transaction commits)."""
        if not self.db.is_sqlite:
            await db.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": NOTIFY_CHANNEL, "payload": f"{run_id}:{seq}"},
            )

    async def control(self, db: AsyncSession, kind: str, run_id: uuid.UUID) -> None:
        """Tell the other processes to act on a run (sent when the transaction commits)."""
        if not self.db.is_sqlite:
            await db.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": CONTROL_CHANNEL, "payload": f"{kind}:{run_id}"},
            )

    # --- reading -------------------------------------------------------------------

    async def stored(self, run_id: uuid.UUID, after: int) -> list[StoredEvent]:
        async with self.db.sessionmaker() as db:
            result = await db.execute(
                select(RunEvent.seq, RunEvent.event, RunEvent.data)
                .where(RunEvent.run_id == run_id, RunEvent.seq > after)
                .order_by(RunEvent.seq)
            )
            return [StoredEvent(seq, event, data) for seq, event, data in result.all()]

    async def follow(
        self,
        run_id: uuid.UUID,
        after: int,
        *,
        status: Callable[[], Awaitable[str | None]],
        stop: Waitable | None = None,
        poll_seconds: float = 1.0,
    ) -> AsyncGenerator[list[StoredEvent], None]:
        """Every event after `after`, in order and without gaps, until the run ends or
        pauses for client tools; `SHUTDOWN` (then the end) once `stop` (an event with
        `wait()`) is set. In batches: the events at hand together, so that a stream
        writes them at once."""
        last = after
        inbox: asyncio.Queue[StoredEvent | None] = asyncio.Queue()
        wakeup = asyncio.Event()
        self._wakeups.setdefault(run_id, set()).add(wakeup)
        subscribed: RunChannel | None = None
        stopping: asyncio.Future[Any] | None = None
        if stop is not None:
            stopping = asyncio.ensure_future(stop.wait())

            def on_stop(_: asyncio.Future[Any]) -> None:
                inbox.put_nowait(SHUTDOWN)
                wakeup.set()

            stopping.add_done_callback(on_stop)
        try:
            while True:
                # Catch up: subscribe first, then the table, then what the channel has
                # published but not stored (taken with no await after subscribing).
                channel = self.channels.get(run_id)
                caught_up: list[StoredEvent] | None = None
                if channel is not None:
                    if channel is not subscribed:
                        channel.subscribers.add(inbox)
                        subscribed = channel
                    # A pending claim's events are not sent before it is stored.
                    caught_up = channel.since(last) if channel.ready.is_set() else None
                    if caught_up is None:
                        unwritten = list(channel.unwritten)  # before the table is read
                        caught_up = [*await self.stored(run_id, last), *unwritten]
                else:
                    caught_up = await self.stored(run_id, last)
                # Ids grow; a jump in the table is a lost range (never stored, never reused).
                batch = await self._take(caught_up, last, run_id, status, gaps=True)
                if batch.events:
                    last = batch.events[-1].seq
                    yield batch.events
                if batch.ends:
                    return
                if channel is not None and run_id in self.channels:
                    # Live: in order; a gap (never expected) or the channel's end (None)
                    # sends us back to catch up.
                    while True:
                        live = [await inbox.get()]
                        while not inbox.empty():
                            live.append(inbox.get_nowait())
                        batch = await self._take(live, last, run_id, status, gaps=False)
                        if batch.events:
                            last = batch.events[-1].seq
                            yield batch.events
                        if batch.ends:
                            return
                        if batch.interrupted:
                            break
                    continue
                current = await status()
                if current is None or current in FINAL_RUN_STATUSES:
                    # The status commits just before the final event: let it land.
                    async for events in self._tail(run_id, last):
                        yield events
                    return
                wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), timeout=poll_seconds)
                if stopping is not None and stopping.done():
                    yield [SHUTDOWN]
                    return
        finally:
            if stopping is not None:
                stopping.cancel()
            if subscribed is not None:
                subscribed.subscribers.discard(inbox)
            waiters = self._wakeups.get(run_id)
            if waiters is not None:
                waiters.discard(wakeup)
                if not waiters:
                    self._wakeups.pop(run_id, None)

    async def _take(
        self,
        events: Iterable[StoredEvent | None],
        last: int,
        run_id: uuid.UUID,
        status: Callable[[], Awaitable[str | None]],
        *,
        gaps: bool,
    ) -> Batch:
        """What a follower at `last` sends of `events`: those after it, in order, up to
        the one that ends its stream. Unless `gaps` are allowed (the table: a jump is a
        lost range), a jump or None (the channel closed) interrupts the batch."""
        taken: list[StoredEvent] = []
        for event in events:
            if event is None:
                return Batch(taken, interrupted=True)
            if event is SHUTDOWN:
                return Batch([*taken, event], ends=True)
            if event.seq <= last:
                continue
            if not gaps and event.seq > last + 1:
                return Batch(taken, interrupted=True)
            last = event.seq
            taken.append(event)
            if await self._stops(event, run_id, status):
                return Batch(taken, ends=True)
        return Batch(taken)

    async def _tail(
        self, run_id: uuid.UUID, last: int, wait_seconds: float = 5.0
    ) -> AsyncGenerator[list[StoredEvent], None]:
        deadline = asyncio.get_running_loop().time() + wait_seconds
        while True:
            stored = await self.stored(run_id, last)
            for i, event in enumerate(stored):
                if event.event in TERMINAL_EVENTS:
                    yield stored[: i + 1]
                    return
            if stored:
                last = stored[-1].seq
                yield stored
            if asyncio.get_running_loop().time() > deadline:
                return
            await asyncio.sleep(0.05)

    async def _stops(
        self, event: StoredEvent, run_id: uuid.UUID, status: Callable[[], Awaitable[str | None]]
    ) -> bool:
        if event.event in TERMINAL_EVENTS:
            return True
        if event.event == PAUSE_EVENT:
            # A pause ends the stream unless the run has moved on since (resumed, or
            # ended: then its next events follow).
            channel = self.channels.get(run_id)
            if channel is not None and channel.next_seq > event.seq + 1:
                return False
            return await status() == "requires_action" and not await self.stored(run_id, event.seq)
        return False

    def wake(self, run_id: uuid.UUID) -> None:
        for wakeup in self._wakeups.get(run_id, ()):
            wakeup.set()

    # --- cross-process wakeups (Postgres) ------------------------------------------

    async def start_listener(self, dsn: str) -> None:
        """LISTEN for events and run control of other processes (Postgres only), and
        LISTEN again whenever the connection is lost (the database restarted)."""
        connected = asyncio.Event()
        self._listen_task = asyncio.create_task(self._listen(dsn, connected), name="parley-listen")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(connected.wait(), timeout=5)

    async def _listen(self, dsn: str, connected: asyncio.Event, retry_max: float = 2.0) -> None:
        import asyncpg

        delay = 0.1
        while True:
            closed = asyncio.Event()
            try:
                self._listener = await asyncpg.connect(dsn)
                self._listener.add_termination_listener(lambda _conn, ev=closed: ev.set())
                await self._listener.add_listener(NOTIFY_CHANNEL, self._on_notify)
                await self._listener.add_listener(CONTROL_CHANNEL, self._on_control)
            except Exception as exc:
                log.warning("LISTEN failed (%s); remote runs are polled until it works", exc)
                await self._drop_listener()
                await asyncio.sleep(delay)
                delay = min(delay * 2, retry_max)
                continue
            delay = 0.1
            connected.set()
            # Notifications sent while we were away are lost: let every follower look.
            for run_id in list(self._wakeups):
                self.wake(run_id)
            while not closed.is_set() and not self._listener.is_closed():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(closed.wait(), timeout=1)
            log.warning("the LISTEN connection was lost; reconnecting")
            await self._drop_listener()

    async def _drop_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.close(timeout=1)

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        run_id, _, _ = payload.partition(":")
        with contextlib.suppress(ValueError):
            self.wake(uuid.UUID(run_id))

    def _on_control(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        kind, _, run_id = payload.partition(":")
        with contextlib.suppress(ValueError):
            if self.on_control is not None:
                self.on_control(kind, uuid.UUID(run_id))

    async def stop(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        for run_id in list(self.channels):
            await self.close(run_id)
        for task in list(self._flushes):
            with contextlib.suppress(Exception):
                await task
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listen_task
        await self._drop_listener()
