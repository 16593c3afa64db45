"""The run event log: a gap-free sequence per run, stored as the exact text sent, replayed
from the store and then followed live (invariant 7).

One writer task per run keeps publication in sequence order. Events that report a
finished step (`durable`) are committed before anyone sees them; text and thinking
deltas are published at once and written in small batches off the hot path, so a
process that dies leaves a stored prefix. Subscribers in this process get events from
memory; subscribers elsewhere read the table, woken by Postgres LISTEN/NOTIFY (the
notification carries ids, not payloads) or, on SQLite, by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, insert, select, text, update

from app.db import Database
from app.models import FINAL_RUN_STATUSES, Run, RunEvent

log = logging.getLogger("parley.events")

NOTIFY_CHANNEL = "parley_run_events"
TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled"})
PAUSE_EVENT = "run.requires_action"
_CLOSE = object()


@dataclass(frozen=True, slots=True)
class StoredEvent:
    seq: int
    event: str
    data: str  # JSON text, byte-for-byte what is sent


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass
class _Pending:
    event: StoredEvent
    durable: bool
    done: asyncio.Future[None] | None = None


@dataclass
class RunChannel:
    """The live side of one run executing in this process."""

    run_id: uuid.UUID
    next_seq: int
    queue: asyncio.Queue[_Pending | object] = field(default_factory=asyncio.Queue)
    unflushed: list[StoredEvent] = field(default_factory=list)
    subscribers: set[asyncio.Queue[StoredEvent]] = field(default_factory=set)
    writer: asyncio.Task[None] | None = None


class EventHub:
    def __init__(self, db: Database, flush_seconds: float) -> None:
        self.db = db
        self.flush_seconds = flush_seconds
        self.channels: dict[uuid.UUID, RunChannel] = {}
        self._remote_wakeups: dict[uuid.UUID, set[asyncio.Event]] = {}
        self._listener: Any = None

    # --- writing -------------------------------------------------------------------

    def open(self, run_id: uuid.UUID, last_seq: int) -> RunChannel:
        """Start (or resume) the live channel of a run that executes here."""
        channel = self.channels.get(run_id)
        if channel is None:
            channel = RunChannel(run_id=run_id, next_seq=last_seq + 1)
            channel.writer = asyncio.create_task(self._write_loop(channel))
            self.channels[run_id] = channel
        return channel

    async def close(self, run_id: uuid.UUID) -> None:
        """Flush what is left and stop the run's writer."""
        channel = self.channels.get(run_id)
        if channel is None:
            return
        channel.queue.put_nowait(_CLOSE)
        if channel.writer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(channel.writer)
        self.channels.pop(run_id, None)
        for subscriber in channel.subscribers:
            subscriber.put_nowait(_closed_marker())

    def emit_nowait(self, run_id: uuid.UUID, event: str, data: Any) -> int:
        """A delta: published at once, stored in the next batch. Returns its seq."""
        channel = self.channels[run_id]
        stored = StoredEvent(channel.next_seq, event, dumps(data))
        channel.next_seq += 1
        channel.queue.put_nowait(_Pending(stored, durable=False))
        return stored.seq

    async def emit(self, run_id: uuid.UUID, event: str, data: Any) -> int:
        """A step event: returns once it is committed (and then published)."""
        channel = self.channels[run_id]
        stored = StoredEvent(channel.next_seq, event, dumps(data))
        channel.next_seq += 1
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        channel.queue.put_nowait(_Pending(stored, durable=True, done=done))
        await asyncio.shield(done)
        return stored.seq

    async def _write_loop(self, channel: RunChannel) -> None:
        while True:
            try:
                item = await asyncio.wait_for(
                    channel.queue.get(), timeout=self.flush_seconds if channel.unflushed else None
                )
            except TimeoutError:
                await self._flush(channel)
                continue
            if item is _CLOSE:
                await self._flush(channel)
                return
            assert isinstance(item, _Pending)
            if item.durable:
                channel.unflushed.append(item.event)
                try:
                    await self._flush(channel)
                except Exception as exc:
                    if item.done is not None and not item.done.done():
                        item.done.set_exception(exc)
                    continue
                self._publish(channel, item.event)
                if item.done is not None and not item.done.done():
                    item.done.set_result(None)
            else:
                self._publish(channel, item.event)
                channel.unflushed.append(item.event)

    def _publish(self, channel: RunChannel, event: StoredEvent) -> None:
        for subscriber in channel.subscribers:
            subscriber.put_nowait(event)

    async def _flush(self, channel: RunChannel) -> None:
        batch = list(channel.unflushed)
        if not batch:
            return
        try:
            async with self.db.transaction() as db:
                await db.execute(
                    insert(RunEvent),
                    [
                        {"run_id": channel.run_id, "seq": e.seq, "event": e.event, "data": e.data}
                        for e in batch
                    ],
                )
                await db.execute(
                    update(Run).where(Run.id == channel.run_id).values(last_event_seq=batch[-1].seq)
                )
                if not self.db.is_sqlite:
                    await db.execute(
                        text("SELECT pg_notify(:channel, :payload)"),
                        {"channel": NOTIFY_CHANNEL, "payload": f"{channel.run_id}:{batch[-1].seq}"},
                    )
        except Exception:
            log.exception("could not store events of run %s", channel.run_id)
            raise
        # Removed only after the commit, so a subscriber always finds an event either
        # in the table or here.
        del channel.unflushed[: len(batch)]

    # --- reading -------------------------------------------------------------------

    async def stored(self, run_id: uuid.UUID, after: int) -> list[StoredEvent]:
        async with self.db.sessionmaker() as db:
            result = await db.execute(
                select(RunEvent.seq, RunEvent.event, RunEvent.data)
                .where(RunEvent.run_id == run_id, RunEvent.seq > after)
                .order_by(RunEvent.seq)
            )
            return [StoredEvent(seq, event, data) for seq, event, data in result.all()]

    async def last_seq(self, run_id: uuid.UUID) -> int:
        async with self.db.sessionmaker() as db:
            value = await db.scalar(select(func.max(RunEvent.seq)).where(RunEvent.run_id == run_id))
            return int(value or 0)

    async def follow(
        self,
        run_id: uuid.UUID,
        after: int,
        *,
        status: Callable[[], Awaitable[str | None]],
        poll_seconds: float = 1.0,
    ) -> AsyncGenerator[StoredEvent, None]:
        """Every event after `after`, in order and without gaps: the stored ones first,
        then live ones, until the run ends or pauses for client tools."""
        last = after
        channel = self.channels.get(run_id)
        inbox: asyncio.Queue[StoredEvent] = asyncio.Queue()
        snapshot: list[StoredEvent] = []
        wakeup = asyncio.Event()
        if channel is not None:
            # Subscribe and snapshot with no await in between: nothing can slip past.
            channel.subscribers.add(inbox)
            snapshot = list(channel.unflushed)
        else:
            self._remote_wakeups.setdefault(run_id, set()).add(wakeup)
        try:
            backlog = await self.stored(run_id, last)
            backlog += [e for e in snapshot if not backlog or e.seq > backlog[-1].seq]
            for event in backlog:
                if event.seq != last + 1:
                    continue
                last = event.seq
                yield event
                if await self._stops(event, run_id, last, status):
                    return
            while True:
                if channel is not None and run_id in self.channels:
                    event = await inbox.get()
                    if event.seq == -1:  # channel closed: the rest is in the table
                        channel = None
                        continue
                    if event.seq <= last:
                        continue
                    if event.seq > last + 1:  # never expected; heal from the table
                        for missing in await self.stored(run_id, last):
                            if missing.seq >= event.seq:
                                break
                            last = missing.seq
                            yield missing
                    last = event.seq
                    yield event
                    if await self._stops(event, run_id, last, status):
                        return
                    continue
                fresh = await self.stored(run_id, last)
                for event in fresh:
                    last = event.seq
                    yield event
                    if await self._stops(event, run_id, last, status):
                        return
                if not fresh:
                    current = await status()
                    if current is None or current in FINAL_RUN_STATUSES:
                        # The status is committed just before the final event is stored:
                        # give that event a moment to land, then stop.
                        async for event in self._tail(run_id, last):
                            yield event
                        return
                    if run_id in self.channels:  # it (re)started here meanwhile
                        channel = self.channels[run_id]
                        channel.subscribers.add(inbox)
                        continue
                    wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wakeup.wait(), timeout=poll_seconds)
        finally:
            if channel is not None:
                channel.subscribers.discard(inbox)
            for ch in self.channels.values():
                ch.subscribers.discard(inbox)
            waiters = self._remote_wakeups.get(run_id)
            if waiters is not None:
                waiters.discard(wakeup)
                if not waiters:
                    self._remote_wakeups.pop(run_id, None)

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
        self,
        event: StoredEvent,
        run_id: uuid.UUID,
        seq: int,
        status: Callable[[], Awaitable[str | None]],
    ) -> bool:
        if event.event in TERMINAL_EVENTS:
            return True
        if event.event == PAUSE_EVENT:
            # A pause ends the stream unless the run has moved on since (resumed, or
            # ended: then its next events follow).
            channel = self.channels.get(run_id)
            if channel is not None and channel.next_seq > seq + 1:
                return False
            return await status() == "requires_action" and not await self.stored(run_id, seq)
        return False

    def wake_remote(self, run_id: uuid.UUID) -> None:
        for wakeup in self._remote_wakeups.get(run_id, ()):
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
            self.wake_remote(uuid.UUID(run_id))

    async def stop(self) -> None:
        for run_id in list(self.channels):
            await self.close(run_id)
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
            self._listener = None


def _closed_marker() -> StoredEvent:
    return StoredEvent(-1, "", "")
