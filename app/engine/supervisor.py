"""The runs executing in this process: launching them, renewing their leases, reaping
those of dead processes, starting queued turns, and stopping at shutdown.

A run executes as a task in the process that owns it and goes on when its HTTP client
leaves. The owner renews a lease on it (fenced by its epoch). When a process dies its
leases expire and any replica's reaper takes the run over (a new epoch) and resumes it
from what is stored; after `max_takeovers` a run fails (`interrupted`). At shutdown a
process lets short runs end, then releases the others' leases and tells the other
replicas, which take them over at once. A cancel posted to any replica is recorded on
the run and sent to its owner (NOTIFY; the heartbeat sees it too). A run left waiting
for client tools past its deadline fails with `expired`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

from sqlalchemy import func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.db import is_transient
from app.domain import ACTIVE_RUN_STATUSES, RunStatus
from app.engine import runs
from app.engine.compaction.collapse import collapse_spans
from app.engine.loop import HANDOVER, LOST, RunOutcome, execute, open_channel
from app.engine.quotas import running
from app.engine.resources import Resources
from app.errors import Conflict
from app.models import AgentSession, Run, RunEvent

log = logging.getLogger("parley.supervisor")

# Wait-mode answers registered and not yet sent, at most (older ones are forgotten).
MAX_WANTED = 10_000


def log_failure(what: str, exc: Exception) -> None:
    """A database outage is expected (one line; the loops go on); anything else is a bug."""
    if is_transient(exc):
        log.warning("%s: database unavailable (%s)", what, exc)
    else:
        log.exception("%s failed", what)


class Supervisor:
    def __init__(self, resources: Resources) -> None:
        self.resources = resources
        self.settings = resources.settings
        self.tasks: dict[uuid.UUID, asyncio.Task[None]] = {}
        self.shutting_down = asyncio.Event()
        self._settled: dict[uuid.UUID, asyncio.Event] = {}
        self._cancel_reasons: dict[uuid.UUID, str] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._collapsing: set[uuid.UUID] = set()  # sessions whose collapse works here
        self._wanted: OrderedDict[uuid.UUID, None] = OrderedDict()
        self._outcomes: dict[uuid.UUID, RunOutcome] = {}
        resources.events.on_control = self._on_control
        resources.events.on_lost = lambda run_id: self._stop_task(run_id, LOST)

    # --- executing -----------------------------------------------------------------

    def launch(
        self,
        run: Run,
        session: AgentSession | None = None,
        claimed: runs.Claimed | None = None,
        *,
        pending: bool = False,
    ) -> None:
        """Execute a claimed run in this process. With the claim's `session` the run
        starts without reloading anything; with what the claim stored (`claimed`) its
        followers and its outcome are served from memory. `pending`: the claim is still
        committing; the run prepares and calls the model meanwhile, but sends and writes
        nothing until `confirm` (`abort` stops it)."""
        if run.id in self.tasks:
            return
        self._settled.setdefault(run.id, asyncio.Event()).clear()
        if claimed is not None:  # open now: a stream starting next catches up from memory
            open_channel(self.resources, run, claimed, pending=pending)
        snapshot = (run, session, claimed) if session is not None else (None, None, None)
        task = asyncio.create_task(self._execute(run.id, *snapshot), name=f"run-{run.id}")
        task.add_done_callback(functools.partial(self._never_started, run.id))
        self.tasks[run.id] = task

    def confirm(self, run_id: uuid.UUID) -> None:
        """The claim of a run launched `pending` is stored."""
        self.resources.events.confirm(run_id)

    def abort(self, run: Run) -> None:
        """The claim of a run launched `pending` was not stored (rolled back, or its
        guard failed): stop it (which closes its model request) before it writes or
        sends anything, and drop the view it extended with the claim."""
        self.resources.events.abort(run.id)
        self._stop_task(run.id, LOST)
        self.resources.views.forget(run.session_id)

    def _never_started(self, run_id: uuid.UUID, task: asyncio.Task[None]) -> None:
        """A task cancelled before it ran (an aborted claim) skipped `_execute`'s own
        clean-up."""
        if task.cancelled() and self.tasks.get(run_id) is task:
            self.tasks.pop(run_id, None)
            self._cancel_reasons.pop(run_id, None)
            settled = self._settled.pop(run_id, None)
            if settled is not None:
                settled.set()

    async def _execute(
        self,
        run_id: uuid.UUID,
        run: Run | None = None,
        session: AgentSession | None = None,
        claimed: runs.Claimed | None = None,
    ) -> None:
        metrics.runs_active.inc()
        runner = None
        try:
            runner = await execute(
                self.resources, run_id, self._cancel_reasons.get, run, session, claimed
            )
        except Exception:
            log.exception("run %s crashed", run_id)
        finally:
            metrics.runs_active.dec()
            self.tasks.pop(run_id, None)
            self._cancel_reasons.pop(run_id, None)
            if runner is not None and run_id in self._wanted:
                outcome = runner.outcome()
                if outcome is not None:
                    self._outcomes[run_id] = outcome
            settled = self._settled.pop(run_id, None)
            if settled is not None:
                settled.set()
        if runner is not None and not runner.left and not self.shutting_down.is_set():
            if runner.queued_next:
                await self.start_next_queued(runner.session.id)
            if runner.may_collapse():
                self._in_background(self._collapse(runner.session.id))

    def _in_background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _collapse(self, session_id: uuid.UUID) -> None:
        """Context collapse: summarise older finished spans after a run (never blocks one).
        One at a time per session: a run that ends while one works leaves it be (it
        would summarise the same spans again); the next run's end checks again."""
        if session_id in self._collapsing:
            return
        self._collapsing.add(session_id)
        try:
            await collapse_spans(self.resources, session_id)
        except Exception:
            log.exception("context collapse failed for session %s", session_id)
        finally:
            self._collapsing.discard(session_id)

    def start_queued_soon(self, session_id: uuid.UUID) -> None:
        """Start the oldest queued turn of the session in the background (if it is idle)."""
        if not self.shutting_down.is_set():
            self._in_background(self.start_next_queued(session_id))

    async def start_next_queued(self, session_id: uuid.UUID) -> uuid.UUID | None:
        """Claim the oldest queued run of an idle session; its user message is stored
        now, under the head of this moment."""
        try:
            async with self.resources.db.transaction() as db:
                # The session row first: starters and posts go one at a time, so the
                # oldest queued run is the one that starts.
                session = await db.get(AgentSession, session_id, with_for_update=True)
                if session is None or await runs.active(db, session_id) is not None:
                    return None
                if await running.at_limit(db, self.settings, session.tenant):
                    return None
                run = await runs.oldest_queued(db, session_id)
                if run is None:
                    return None
                claimed = await runs.claim(
                    db,
                    session,
                    run,
                    worker_id=self.resources.worker_id,
                    lease_seconds=self.settings.run_lease_seconds,
                )
        except Conflict:
            return None
        self.launch(run, session, claimed)
        return run.id

    async def take_over(self, run_id: uuid.UUID) -> bool:
        """Resume a running run whose owner stopped (its lease expired or was released)
        under a new epoch; fail it instead once it was taken over `max_takeovers` times."""
        if run_id in self.tasks or self.shutting_down.is_set():
            return False
        async with self.resources.db.transaction() as db:
            run = await db.scalar(
                select(Run)
                .where(
                    Run.id == run_id,
                    Run.status == RunStatus.RUNNING,
                    Run.lease_expires_at <= runs.now(),
                )
                .with_for_update(skip_locked=True)
            )
            if run is None:
                return False
            session = await db.get(AgentSession, run.session_id)
            assert session is not None
            if run.takeovers >= self.settings.max_takeovers:
                error = {
                    "type": "interrupted",
                    "message": f"The run was resumed {run.takeovers} times after the process "
                    "running it stopped (PARLEY_MAX_TAKEOVERS); post again to continue",
                }
                await self._fail(db, session, run, error, runs.INTERRUPTED_TOOL_TEXT)
                return False
            run.takeovers += 1
            released = run.worker_id is None  # handed over at a shutdown (or expired)
            # The next owner's ids start after any id stored or reserved before.
            stored = await db.scalar(
                select(func.max(RunEvent.seq)).where(RunEvent.run_id == run.id)
            )
            run.reserved_seq = max(run.reserved_seq, run.last_event_seq, int(stored or 0))
            runs.own(
                run,
                worker_id=self.resources.worker_id,
                lease_seconds=self.settings.run_lease_seconds,
            )
        log.info("taking over run %s (take-over %d)", run_id, run.takeovers)
        metrics.run_takeovers.labels("handover" if released else "expired").inc()
        self.launch(run, session)
        return True

    def _on_control(self, kind: str, run_id: uuid.UUID) -> None:
        if kind == "cancel" and run_id in self.tasks:
            self._stop_task(run_id, "cancelled")
        elif kind == "released":
            self._in_background(self.take_over(run_id))

    def _stop_task(self, run_id: uuid.UUID, reason: str) -> None:
        task = self.tasks.get(run_id)
        if task is not None and not task.done() and run_id not in self._cancel_reasons:
            self._cancel_reasons[run_id] = reason
            task.cancel()

    # --- stopping ------------------------------------------------------------------

    async def cancel(self, run: Run, reason: str) -> bool:
        """Cancel a running run wherever it executes and wait until it has stopped (its
        partial reply kept); False when no process owns it any more (its lease ran
        out: the caller ends it)."""
        if await self.cancel_local(run.id, reason):
            return True
        if run.lease_expires_at is None or run.lease_expires_at <= runs.now():
            return False
        hub = self.resources.events
        async with self.resources.db.transaction() as db:
            await db.execute(
                update(Run)
                .where(Run.id == run.id, Run.status == RunStatus.RUNNING)
                .values(cancel_requested_at=runs.now())
            )
            await hub.control(db, "cancel", run.id)
        # The owner stops within a moment; a run taken over meanwhile stops on resuming.
        limit = self.settings.run_lease_seconds + 2 * self.settings.reaper_interval_seconds + 5
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait_settled(run.id, poll_seconds=0.1), timeout=limit)
        return True

    async def cancel_local(self, run_id: uuid.UUID, reason: str) -> bool:
        """Cancel a run executing here and wait until it has stopped (its partial reply
        kept, its open tool uses answered); False when it does not run here."""
        task = self.tasks.get(run_id)
        if task is None:
            return False
        if run_id not in self._cancel_reasons:  # a second cancel would cut the first's cleanup
            self._cancel_reasons[run_id] = reason
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(task), timeout=30)
        return True

    # --- wait-mode answers --------------------------------------------------------

    def want_outcome(self, run_id: uuid.UUID) -> None:
        """A wait-mode answer will ask for this run's outcome: keep it when it settles."""
        self._wanted[run_id] = None
        while len(self._wanted) > MAX_WANTED:  # answers never sent (a failed commit)
            self._outcomes.pop(self._wanted.popitem(last=False)[0], None)

    async def settled_outcome(self, run_id: uuid.UUID) -> RunOutcome | None:
        """Wait until the run settles; its outcome from memory when it ran here from
        its claim (None otherwise: read it from the database)."""
        try:
            await self.wait_settled(run_id)
            return self._outcomes.get(run_id)
        finally:
            self._wanted.pop(run_id, None)
            self._outcomes.pop(run_id, None)

    async def wait_settled(self, run_id: uuid.UUID, *, poll_seconds: float = 0.25) -> None:
        """Until the run is finished or waiting for client tools."""
        while True:
            event = self._settled.get(run_id)
            if event is not None and run_id in self.tasks:
                await event.wait()
                return
            async with self.resources.db.sessionmaker() as db:
                status = await runs.status_of(db, run_id)
            settled = status is None or status.is_final or status == RunStatus.REQUIRES_ACTION
            if settled and run_id not in self.tasks:
                return
            await asyncio.sleep(poll_seconds)

    async def shutdown(self) -> None:
        """Give running turns a moment to finish, then hand the others over: their leases
        are released and another replica resumes them at once."""
        self.shutting_down.set()
        for task in self._background:
            task.cancel()
        pending = [task for task in self.tasks.values() if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.shutdown_grace_seconds)
        # Looked at again: a claim committing as the shutdown began launched its run since.
        still = {run_id: task for run_id, task in self.tasks.items() if not task.done()}
        for run_id in still:
            self._stop_task(run_id, HANDOVER)
        if still:
            await asyncio.wait(still.values(), timeout=10)

    # --- leases and the reaper -----------------------------------------------------

    async def heartbeat_loop(self) -> None:
        interval = min(self.settings.run_lease_seconds / 3, 1.0)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except Exception as exc:
                log_failure("lease heartbeat", exc)

    async def heartbeat(self) -> None:
        """Renew the leases of runs executing here while this process still owns them
        (same epoch); stop those owned elsewhere now, and those a replica asked to
        cancel (the fallback for a lost notification)."""
        channels = self.resources.events.channels
        owned = [
            (run_id, channels[run_id].epoch)
            for run_id in list(self.tasks)
            if run_id in channels and not channels[run_id].lost and channels[run_id].ready.is_set()
        ]
        if not owned:
            return
        async with self.resources.db.transaction() as db:
            result = await db.execute(
                update(Run)
                .where(tuple_(Run.id, Run.epoch).in_(owned), Run.status == RunStatus.RUNNING)
                .values(lease_expires_at=runs.lease_deadline(self.settings.run_lease_seconds))
                .returning(Run.id, Run.cancel_requested_at)
            )
            alive = {row[0]: row[1] for row in result}
        for run_id, _epoch in owned:
            if run_id not in alive:
                self._stop_task(run_id, LOST)
            elif alive[run_id] is not None:
                self._stop_task(run_id, "cancelled")

    async def reaper_loop(self) -> None:
        while True:
            try:
                await self.reap()
            except Exception as exc:
                log_failure("reaper", exc)
            await asyncio.sleep(self.settings.reaper_interval_seconds)

    async def reap(self) -> None:
        """Take over runs whose lease expired, expire unanswered client tools, and start
        queued runs of idle sessions."""
        async with self.resources.db.sessionmaker() as db:
            expired = list(
                await db.scalars(
                    select(Run.id).where(
                        Run.status.in_(ACTIVE_RUN_STATUSES), Run.lease_expires_at < runs.now()
                    )
                )
            )
            waiting = list(
                await db.scalars(
                    select(Run.session_id).where(Run.status == RunStatus.QUEUED).distinct()
                )
            )
        for run_id in expired:
            if run_id not in self.tasks and not await self.take_over(run_id):
                await self._expire(run_id)
        for session_id in waiting:
            await self.start_next_queued(session_id)

    async def _expire(self, run_id: uuid.UUID) -> None:
        hub = self.resources.events
        async with self.resources.db.transaction() as db:
            run = await db.scalar(
                select(Run)
                .where(
                    Run.id == run_id,
                    Run.status == RunStatus.REQUIRES_ACTION,
                    Run.lease_expires_at < runs.now(),
                )
                .with_for_update(skip_locked=True)
            )
            if run is None:
                return
            session = await db.get(AgentSession, run.session_id)
            assert session is not None
            error = {"type": "expired", "message": "The client tools were not answered in time"}
            await self._fail(db, session, run, error, runs.EXPIRED_TOOL_TEXT)
        hub.wake(run_id)

    async def _fail(
        self, db: AsyncSession, session: AgentSession, run: Run, error: dict[str, Any], text: str
    ) -> None:
        """End a run no process executes as failed, its open tool uses answered with
        placeholders (`text`) unless their results are known."""
        answered = await runs.answer_open_tool_uses(
            db, session.id, session.head_uuid, run.id, text, run.state.results
        )
        await runs.end(db, self.resources.events, run, RunStatus.FAILED, error, answered=answered)
        log.warning("run %s failed: %s", run.id, error["type"])
        metrics.runs_total.labels(run.kind, "failed").inc()
