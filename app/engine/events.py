"""The run event log: a gap-free sequence per run, stored as the exact text sent, replayed
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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from sqlalchemy import Table, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import Database
from app.domain import FINAL_RUN_STATUSES
from app.engine.webhooks import outbox
from app.models import Run, RunEvent

runs_t = cast(Table, Run.__table__)
run_events_t = cast(Table, RunEvent.__table__)

log = logging.getLogger("parley.events")

NOTIFY_CHANNEL = "parley_run_events"
TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled"})
PAUSE_EVENT = "run.requires_action"


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


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


def event_rows(run_id: uuid.UUID, events: list[StoredEvent]) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "seq": e.seq, "event": e.event, "data": e.data} for e in events]


@dataclass
class RunChannel:
    """The live side of one run executing in this process."""

    run_id: uuid.UUID
    next_seq: int
    unwritten: list[StoredEvent] = field(default_factory=list)  # published, not stored yet
    subscribers: set[asyncio.Queue[StoredEvent | None]] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    flush_timer: asyncio.TimerHandle | None = None

    def take_seq(self, event: str, data: Any) -> StoredEvent:
        stored = StoredEvent(self.next_seq, event, dumps(data))
        self.next_seq += 1
        return stored

    def publish(self, event: StoredEvent | None) -> None:
        for subscriber in self.subscribers:
            subscriber.put_nowait(event)


class Step:
    """Events added inside a step transaction; published after its commit."""

    def __init__(self, hub: EventHub, channel: RunChannel, db: AsyncSession) -> None:
        self.hub = hub
        self.channel = channel
        self.db = db
        self.events: list[StoredEvent] = []
        self.run_values: dict[str, Any] = {}  # set on the run row with its last event seq

    def add(self, event: str, data: Any) -> None:
        self.events.append(self.channel.take_seq(event, data))


class EventHub:
    def __init__(self, db: Database, flush_seconds: float) -> None:
        self.db = db
        self.flush_seconds = flush_seconds
        self.channels: dict[uuid.UUID, RunChannel] = {}
        self._wakeups: dict[uuid.UUID, set[asyncio.Event]] = {}
        self._flushes: set[asyncio.Task[None]] = set()
        self._listener: Any = None

    # --- writing -------------------------------------------------------------------

    def open(self, run_id: uuid.UUID, last_seq: int) -> RunChannel:
        """Start (or resume) the live channel of a run that executes here."""
        channel = self.channels.get(run_id)
        if channel is None:
            channel = self.channels[run_id] = RunChannel(run_id=run_id, next_seq=last_seq + 1)
            self.wake(run_id)  # followers polling the table can switch to the channel
        return channel

    async def close(self, run_id: uuid.UUID) -> None:
        """Write what is left and end the channel (followers go on from the table)."""
        channel = self.channels.get(run_id)
        if channel is None:
            return
        await self._flush(channel)
        self.channels.pop(run_id, None)
        channel.publish(None)

    def emit_nowait(self, run_id: uuid.UUID, event: str, data: Any) -> None:
        """A delta: published at once, stored within `flush_seconds`."""
        channel = self.channels[run_id]
        stored = channel.take_seq(event, data)
        channel.unwritten.append(stored)
        channel.publish(stored)
        if channel.flush_timer is None:
            channel.flush_timer = asyncio.get_running_loop().call_later(
                self.flush_seconds, self._schedule_flush, channel
            )

    @contextlib.asynccontextmanager
    async def step(self, run_id: uuid.UUID) -> AsyncIterator[Step]:
        """A transaction for one finished step and the events that report it."""
        channel = self.channels[run_id]
        async with channel.lock, self.db.sessionmaker() as db:
            step = Step(self, channel, db)
            try:
                yield step
                written = [*channel.unwritten, *step.events]
                if written or step.run_values:
                    await self._write(db, run_id, written, step.run_values)
                await db.commit()
            except BaseException:
                await db.rollback()
                # The step did not happen: give its ids back so the sequence stays gap-free.
                if step.events:
                    channel.next_seq = step.events[0].seq
                raise
            del channel.unwritten[: len(written) - len(step.events)]
        for event in step.events:
            channel.publish(event)

    async def emit(self, run_id: uuid.UUID, event: str, data: Any) -> None:
        """An event of its own: returns once it is stored (and published)."""
        async with self.step(run_id) as step:
            step.add(event, data)

    def _schedule_flush(self, channel: RunChannel) -> None:
        channel.flush_timer = None
        task = asyncio.create_task(self._flush(channel))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, channel: RunChannel) -> None:
        if channel.flush_timer is not None:
            channel.flush_timer.cancel()
            channel.flush_timer = None
        async with channel.lock:
            batch = list(channel.unwritten)
            if not batch:
                return
            try:
                async with self.db.transaction() as db:
                    await self._write(db, channel.run_id, batch)
            except Exception:
                log.exception("could not store events of run %s", channel.run_id)
                return
            # Dropped only after the commit: a follower finds each event in one place or
            # the other.
            del channel.unwritten[: len(batch)]

    async def _write(
        self,
        db: AsyncSession,
        run_id: uuid.UUID,
        events: list[StoredEvent],
        run_values: dict[str, Any] | None = None,
    ) -> None:
        values = dict(run_values or {})
        if events:
            await db.execute(insert(run_events_t), event_rows(run_id, events))
            values["last_event_seq"] = events[-1].seq
            await outbox.enqueue(db, run_id, ((e.event, e.data) for e in events))
        await db.execute(update(runs_t).where(runs_t.c.id == run_id).values(**values))
        if events:
            await self.notify(db, run_id, events[-1].seq)

    async def notify(self, db: AsyncSession, run_id: uuid.UUID, seq: int) -> None:
        """Tell followers in other processes (sent when the transaction commits)."""
        if not self.db.is_sqlite:
            await db.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": NOTIFY_CHANNEL, "payload": f"{run_id}:{seq}"},
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
    ) -> AsyncGenerator[StoredEvent, None]:
        """Every event after `after`, in order and without gaps, until the run ends or
        pauses for client tools; `SHUTDOWN` (then the end) once `stop` (an event with
        `wait()`) is set."""
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
                unwritten: list[StoredEvent] = []
                if channel is not None:
                    if channel is not subscribed:
                        channel.subscribers.add(inbox)
                        subscribed = channel
                    unwritten = list(channel.unwritten)
                for event in [*await self.stored(run_id, last), *unwritten]:
                    if event.seq != last + 1:
                        continue
                    last = event.seq
                    yield event
                    if await self._stops(event, run_id, status):
                        return
                if channel is not None and run_id in self.channels:
                    # Live: in order; a gap (never expected) sends us back to catch up.
                    while (live := await inbox.get()) is not None:
                        if live is SHUTDOWN:
                            yield live
                            return
                        if live.seq <= last:
                            continue
                        if live.seq > last + 1:
                            break
                        last = live.seq
                        yield live
                        if await self._stops(live, run_id, status):
                            return
                    continue
                current = await status()
                if current is None or current in FINAL_RUN_STATUSES:
                    # The status commits just before the final event: let it land.
                    async for event in self._tail(run_id, last):
                        yield event
                    return
                wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), timeout=poll_seconds)
                if stopping is not None and stopping.done():
                    yield SHUTDOWN
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

    async def _tail(
        self, run_id: uuid.UUID, last: int, wait_seconds: float = 5.0
    ) -> AsyncGenerator[StoredEvent, None]:
        deadline = asyncio.get_running_loop().time() + wait_seconds
        while True:
            for event in await self.stored(run_id, last):
                last = event.seq
                yield event
                if event.event in TERMINAL_EVENTS:
                    return
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
        """LISTEN for events written by other processes (Postgres only)."""
        import asyncpg

        try:
            self._listener = await asyncpg.connect(dsn)
            await self._listener.add_listener(NOTIFY_CHANNEL, self._on_notify)
        except Exception:
            log.warning("LISTEN/NOTIFY unavailable; remote runs are followed by polling")
            self._listener = None

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        run_id, _, _ = payload.partition(":")
        with contextlib.suppress(ValueError):
            self.wake(uuid.UUID(run_id))

    async def stop(self) -> None:
        for run_id in list(self.channels):
            await self.close(run_id)
        for task in list(self._flushes):
            with contextlib.suppress(Exception):
                await task
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
            self._listener = None
