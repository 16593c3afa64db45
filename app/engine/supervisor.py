"""The runs executing in this process: launching them, renewing their leases, reaping
those of dead processes, starting queued turns, and stopping at shutdown.

A run executes as a task in the process that claimed it and goes on when its HTTP
client leaves. That process renews a lease on it; when a process dies, its leases expire
and any replica's reaper fails the run (`interrupted`) and frees the session. A run left
waiting for client tools past its deadline fails with `expired`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Coroutine
from typing import Any

from sqlalchemy import select, update

from app import metrics
from app.domain import ACTIVE_RUN_STATUSES, RunStatus
from app.engine import runs
from app.engine.compaction.collapse import collapse_spans
from app.engine.loop import execute
from app.engine.quotas import running
from app.engine.resources import Resources
from app.errors import Conflict
from app.models import AgentSession, Run

log = logging.getLogger("parley.supervisor")


class Supervisor:
    def __init__(self, resources: Resources) -> None:
        self.resources = resources
        self.settings = resources.settings
        self.tasks: dict[uuid.UUID, asyncio.Task[None]] = {}
        self.shutting_down = asyncio.Event()
        self._settled: dict[uuid.UUID, asyncio.Event] = {}
        self._cancel_reasons: dict[uuid.UUID, str] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # --- executing -----------------------------------------------------------------

    def launch(self, run: Run, session: AgentSession | None = None) -> None:
        """Execute a claimed run in this process (after its claim is committed). With the
        claim's `session` the run starts without reloading anything."""
        if run.id in self.tasks:
            return
        self._settled.setdefault(run.id, asyncio.Event()).clear()
        snapshot = (run, session) if session is not None else (None, None)
        task = asyncio.create_task(self._execute(run.id, *snapshot), name=f"run-{run.id}")
        self.tasks[run.id] = task

    async def _execute(
        self, run_id: uuid.UUID, run: Run | None = None, session: AgentSession | None = None
    ) -> None:
        metrics.runs_active.inc()
        runner = None
        try:
            runner = await execute(self.resources, run_id, self._cancel_reasons.get, run, session)
        except Exception:
            log.exception("run %s crashed", run_id)
        finally:
            metrics.runs_active.dec()
            self.tasks.pop(run_id, None)
            self._cancel_reasons.pop(run_id, None)
            settled = self._settled.pop(run_id, None)
            if settled is not None:
                settled.set()
        if runner is not None and not self.shutting_down.is_set():
            if runner.queued_next:
                await self.start_next_queued(runner.session.id)
            self._in_background(self._collapse(runner.session.id))

    def _in_background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _collapse(self, session_id: uuid.UUID) -> None:
        """Context collapse: summarise older finished spans after a run (never blocks one)."""
        try:
            await collapse_spans(self.resources, session_id)
        except Exception:
            log.exception("context collapse failed for session %s", session_id)

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
                await runs.claim(
                    db,
                    self.resources.events,
                    session,
                    run,
                    worker_id=self.resources.worker_id,
                    lease_seconds=self.settings.run_lease_seconds,
                )
        except Conflict:
            return None
        self.launch(run, session)
        return run.id

    # --- stopping ------------------------------------------------------------------

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
        """Give running turns a moment to finish, then stop them as interrupted."""
        self.shutting_down.set()
        for task in self._background:
            task.cancel()
        grace = self.settings.shutdown_grace_seconds
        pending = [task for task in self.tasks.values() if not task.done()]
        if pending:
            _done, still = await asyncio.wait(pending, timeout=grace)
            for run_id, task in list(self.tasks.items()):
                if task in still:
                    self._cancel_reasons[run_id] = "shutdown"
                    task.cancel()
            if still:
                await asyncio.wait(still, timeout=10)

    # --- leases and the reaper -----------------------------------------------------

    async def heartbeat_loop(self) -> None:
        interval = self.settings.run_lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except Exception:
                log.exception("lease heartbeat failed")

    async def heartbeat(self) -> None:
        """Renew the leases of runs executing here; stop those finished elsewhere
        (cancelled by another replica, or reaped)."""
        local = list(self.tasks)
        if not local:
            return
        async with self.resources.db.transaction() as db:
            result = await db.execute(
                update(Run)
                .where(Run.id.in_(local), Run.status == RunStatus.RUNNING)
                .values(lease_expires_at=runs.lease_deadline(self.settings.run_lease_seconds))
                .returning(Run.id)
            )
            alive = set(result.scalars())
        for run_id in local:
            task = self.tasks.get(run_id)
            if run_id not in alive and task is not None and not task.done():
                self._cancel_reasons[run_id] = "external"
                task.cancel()

    async def reaper_loop(self) -> None:
        while True:
            try:
                await self.reap()
            except Exception:
                log.exception("reaper failed")
            await asyncio.sleep(self.settings.reaper_interval_seconds)

    async def reap(self) -> None:
        """Fail runs whose lease expired, expire unanswered client tools, and start
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
            if run_id not in self.tasks:
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
                    Run.status.in_(ACTIVE_RUN_STATUSES),
                    Run.lease_expires_at < runs.now(),
                )
                .with_for_update(skip_locked=True)
            )
            if run is None:
                return
            session = await db.get(AgentSession, run.session_id)
            assert session is not None
            if run.status == RunStatus.REQUIRES_ACTION:
                error = {"type": "expired", "message": "The client tools were not answered in time"}
                text = runs.EXPIRED_TOOL_TEXT
            else:
                error = {
                    "type": "interrupted",
                    "message": "The process running this turn stopped; post again to continue",
                }
                text = runs.INTERRUPTED_TOOL_TEXT
            answered = await runs.answer_open_tool_uses(
                db, session.id, session.head_uuid, run.id, text, run.state.results
            )
            await runs.end(db, hub, run, RunStatus.FAILED, error, answered=answered)
            log.warning("run %s failed: %s", run.id, error["type"])
        metrics.runs_total.labels(run.kind, "failed").inc()
        hub.wake(run_id)
