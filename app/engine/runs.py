"""Runs: claiming a session, starting, resuming, cancelling, leasing and reaping.

A run is active while `running` or `requires_action`; the database allows one active
run per session (a unique partial index), so the rule holds across processes. A run
executes as a task in the process that started it and goes on when its HTTP client
leaves. That process renews a lease on it; when a process dies, its leases expire and
any replica's reaper fails the run (`interrupted`) and frees the session. A run left
waiting for client tools past its deadline fails with `expired`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app import metrics
from app.context.blocks import as_blocks
from app.conversation import store
from app.conversation.payloads import message_payload, result_events, run_json
from app.engine.compaction import collapse_spans
from app.engine.events import EventHub, StoredEvent, dumps, event_rows, run_events_t
from app.engine.tools.builtin import truncate_middle
from app.errors import Conflict, Invalid, NotFound
from app.models import ACTIVE_RUN_STATUSES, FINAL_RUN_STATUSES, AgentSession, Run, RunEvent
from app.schemas import IfBusy, ToolResultsIn

if TYPE_CHECKING:
    from app.engine.runtime import Runtime

log = logging.getLogger("parley.runs")

CANCELLED_TOOL_TEXT = "[Tool use was cancelled before it returned a result]"
EXPIRED_TOOL_TEXT = "[No result: the client did not answer this tool call in time]"
INTERRUPTED_TOOL_TEXT = "[Tool use was interrupted: the run stopped before a result arrived]"


def now() -> datetime:
    return datetime.now(UTC)


def request_hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def conflict_for(run: Run) -> Conflict:
    return Conflict(
        f"Session {run.session_id} already has an active run {run.id} ({run.status})",
        extra={"run_id": str(run.id)},
    )


async def load_run(db: AsyncSession, session_id: uuid.UUID, run_id: uuid.UUID) -> Run:
    run = await db.get(Run, run_id)
    if run is None or run.session_id != session_id:
        raise NotFound(f"Run {run_id} not found in this session")
    return run


async def append_events_direct(
    db: AsyncSession,
    events: EventHub,
    run: Run,
    items: list[tuple[str, Any]],
    *,
    after: int | None,
    notify: bool = True,
) -> None:
    """Store events of a run that has no live channel here (being claimed, paused,
    queued, remote or dead), in the caller's transaction, after event `after` (None:
    after the last one stored)."""
    if after is None:
        stored = await db.scalar(select(func.max(RunEvent.seq)).where(RunEvent.run_id == run.id))
        after = int(stored or 0)
    batch = [StoredEvent(after + i, name, dumps(data)) for i, (name, data) in enumerate(items, 1)]
    await db.execute(insert(run_events_t), event_rows(run.id, batch))
    run.last_event_seq = batch[-1].seq
    if notify:
        await events.notify(db, run.id, batch[-1].seq)


async def answer_open_tool_uses(
    db: AsyncSession,
    session: AgentSession,
    run: Run,
    text: str,
    known: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """If the head is an assistant message with tool uses, store their results (known
    ones as computed, the rest as placeholders) so the history stays valid."""
    if session.head_uuid is None:
        return None
    head = await store.get_message(db, session.id, session.head_uuid)
    if head is None or head.role != "assistant":
        return None
    uses = [b for b in head.content if b.get("type") == "tool_use"]
    if not uses:
        return None
    known = known or {}
    blocks = []
    for use in uses:
        result = known.get(use["id"]) or {"content": text, "is_error": True}
        blocks.append(
            {
                "type": "tool_result",
                "tool_use_id": use["id"],
                "content": result["content"],
                "is_error": bool(result.get("is_error")),
            }
        )
    return await store.append(
        db,
        session.id,
        parent_uuid=head.uuid,
        type="user",
        role="user",
        content=blocks,
        run_id=run.id,
    )


class RunManager:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.tasks: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._settled: dict[uuid.UUID, asyncio.Event] = {}
        self._cancel_reasons: dict[uuid.UUID, str] = {}
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def settings(self) -> Any:
        return self.rt.settings

    def lease_deadline(self) -> datetime:
        return now() + timedelta(seconds=self.settings.run_lease_seconds)

    # --- starting turns ------------------------------------------------------------

    async def find_idempotent(
        self, db: AsyncSession, session_id: uuid.UUID, key: str | None, digest: str
    ) -> Run | None:
        if not key:
            return None
        run = await db.scalar(
            select(Run).where(Run.session_id == session_id, Run.idempotency_key == key)
        )
        if run is not None and run.request_hash != digest:
            raise Invalid(
                "This Idempotency-Key was used with a different request body",
                errors=[
                    {
                        "loc": ["header", "Idempotency-Key"],
                        "msg": "reused with another body",
                        "type": "value_error",
                    }
                ],
            )
        return run

    async def submit_turn(
        self,
        db: AsyncSession,
        session: AgentSession,
        *,
        content: Any,
        parent_uuid: uuid.UUID | None,
        if_busy: IfBusy,
        idempotency_key: str | None,
        digest: str,
        kind: str = "turn",
        params: dict[str, Any] | None = None,
    ) -> Run:
        """Store the turn and claim the session (or queue it). The caller commits and
        then calls `launch` when the run's status is `running`."""
        if parent_uuid is not None and await store.get_message(db, session.id, parent_uuid) is None:
            raise NotFound(f"Message {parent_uuid} not found in this session")
        # `reject` relies on the database alone (the claim fails if a run is active).
        active = None if if_busy == "reject" else await self.active(db, session.id)
        if active is not None and if_busy == "interrupt":
            await self.cancel(db, session, active, reason="interrupted by a newer turn")
            await db.flush()
        params = {
            "content": content,
            "parent_uuid": str(parent_uuid) if parent_uuid else None,
            **(params or {}),
        }
        run = Run(
            id=uuid.uuid4(),
            session_id=session.id,
            kind=kind,
            status="queued",
            params=params,
            idempotency_key=idempotency_key,
            request_hash=digest,
            usage={},
            state={},
            last_event_seq=0,
            created_at=now(),
        )
        if active is not None and if_busy == "enqueue":
            db.add(run)
            await db.flush()
            return run
        await self._claim(db, session, run)
        return run

    async def _claim(self, db: AsyncSession, session: AgentSession, run: Run) -> None:
        """Make `run` the session's active run, store its user message and report both
        (`run.started`, `message.completed`) in the same transaction. A conflict rolls
        the whole transaction back: nothing of the turn is stored."""
        content = run.params.get("content")
        parent = run.params.get("parent_uuid")
        parent_uuid = uuid.UUID(parent) if parent else session.head_uuid
        head = parent_uuid
        row = None
        if content is not None:
            row = await store.append(
                db,
                session.id,
                parent_uuid=parent_uuid,
                type="user",
                role="user",
                content=as_blocks(content),
                run_id=run.id,
            )
            head = row["uuid"]
            run.user_message_uuid = head
        else:  # a regeneration: the reply grows from the given node
            await store.set_head(db, session.id, parent_uuid)
        set_committed_value(session, "head_uuid", head)
        run.status = "running"
        run.started_at = now()
        run.worker_id = self.rt.worker_id
        run.lease_expires_at = self.lease_deadline()
        db.add(run)
        try:
            await db.flush()
        except IntegrityError:
            session_id = run.session_id  # read before the rollback expires the objects
            await db.rollback()
            active = await self.active(db, session_id)
            if active is not None:
                raise conflict_for(active) from None
            raise
        events = [("run.started", run_json(run))]
        if row is not None:
            events.append(("message.completed", message_payload(row)))
        # No notification: until this commits nobody can know the run is running.
        await append_events_direct(
            db, self.rt.events, run, events, after=run.last_event_seq, notify=False
        )
        await db.flush()

    async def active(self, db: AsyncSession, session_id: uuid.UUID) -> Run | None:
        return await db.scalar(
            select(Run).where(Run.session_id == session_id, Run.status.in_(ACTIVE_RUN_STATUSES))
        )

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
        from app.engine.loop import execute

        metrics.runs_active.inc()
        runner = None
        try:
            runner = await execute(self.rt, run_id, run, session)
        except Exception:
            log.exception("run %s crashed", run_id)
        finally:
            metrics.runs_active.dec()
            self.tasks.pop(run_id, None)
            self._cancel_reasons.pop(run_id, None)
            settled = self._settled.pop(run_id, None)
            if settled is not None:
                settled.set()
        if runner is not None and not self.rt.shutting_down.is_set():
            if runner.queued_next:
                await self.start_next_queued(runner.session_id)
            self._in_background(self._collapse(runner.session_id))

    def _in_background(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _collapse(self, session_id: uuid.UUID) -> None:
        """Context collapse: summarise older finished spans after a run (never blocks one)."""
        try:
            await collapse_spans(self.rt, session_id)
        except Exception:
            log.exception("context collapse failed for session %s", session_id)

    async def start_next_queued(self, session_id: uuid.UUID) -> uuid.UUID | None:
        """Claim the oldest queued run of an idle session; its user message is stored
        now, under the head of this moment."""
        try:
            async with self.rt.db.transaction() as db:
                run = await db.scalar(
                    select(Run)
                    .where(Run.session_id == session_id, Run.status == "queued")
                    .order_by(Run.created_at, Run.id)
                    .limit(1)
                )
                if run is None or await self.active(db, session_id) is not None:
                    return None
                session = await db.get(AgentSession, session_id)
                if session is None:
                    return None
                await self._claim(db, session, run)
        except Conflict:
            return None
        self.launch(run, session)
        return run.id

    # --- client tools ----------------------------------------------------------------

    async def submit_tool_results(
        self, db: AsyncSession, session: AgentSession, run: Run, body: ToolResultsIn
    ) -> int:
        """Store the client's answers with the results computed before the pause and
        make the run `running` again. Returns the seq of the stored message."""
        if run.status != "requires_action" or not run.required_action:
            raise Conflict(f"Run {run.id} is {run.status}, not waiting for tool results")
        pending = [use["id"] for use in run.required_action.get("tool_uses", [])]
        given = [result.tool_use_id for result in body.results]
        if sorted(given) != sorted(pending):
            raise Invalid(
                f"results must answer exactly the pending tool uses {pending}; got {given}",
                errors=[
                    {
                        "loc": ["body", "results"],
                        "msg": "must match pending tool uses",
                        "type": "value_error",
                    }
                ],
            )
        limit = self.settings.tool_result_max_chars
        known: dict[str, dict[str, Any]] = dict(run.state.get("results", {}))
        for result in body.results:
            content = result.content
            if isinstance(content, str):
                content = truncate_middle(content, limit)
            known[result.tool_use_id] = {"content": content, "is_error": result.is_error}
        row = await answer_open_tool_uses(db, session, run, INTERRUPTED_TOOL_TEXT, known)
        run.status = "running"
        run.required_action = None
        run.worker_id = self.rt.worker_id
        run.lease_expires_at = self.lease_deadline()
        run.state = {**run.state, "results": {}}
        if row is not None:
            set_committed_value(session, "head_uuid", row["uuid"])
            await append_events_direct(db, self.rt.events, run, result_events(row), after=None)
        await db.flush()
        return int(row["seq"]) if row else 0

    # --- cancelling --------------------------------------------------------------------

    async def cancel(
        self, db: AsyncSession, session: AgentSession, run: Run, *, reason: str = "cancelled"
    ) -> Run:
        """Stop a run, keeping what it produced and leaving the history valid.
        Idempotent: a finished run is returned unchanged."""
        if run.status in FINAL_RUN_STATUSES:
            return run
        task = self.tasks.get(run.id)
        if run.status == "running" and task is not None:
            self._cancel_reasons[run.id] = reason
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), timeout=30)
            await db.refresh(run)
            await db.refresh(session)
            return run
        if run.status == "requires_action":
            await answer_open_tool_uses(
                db, session, run, CANCELLED_TOOL_TEXT, run.state.get("results", {})
            )
        run.status = "cancelled"
        run.required_action = None
        run.finished_at = now()
        run.lease_expires_at = None
        await append_events_direct(
            db, self.rt.events, run, [("run.cancelled", run_json(run))], after=None
        )
        await db.flush()
        self.rt.events.wake(run.id)
        metrics.runs_total.labels(run.kind, "cancelled").inc()
        return run

    def cancel_reason(self, run_id: uuid.UUID) -> str | None:
        return self._cancel_reasons.get(run_id)

    async def cancel_all_for_session(
        self, db: AsyncSession, session_id: uuid.UUID, *, reason: str
    ) -> None:
        session = await db.get(AgentSession, session_id)
        if session is None:
            return
        runs = await db.scalars(
            select(Run).where(
                Run.session_id == session_id, Run.status.in_((*ACTIVE_RUN_STATUSES, "queued"))
            )
        )
        for run in list(runs):
            await self.cancel(db, session, run, reason=reason)

    # --- waiting -------------------------------------------------------------------------

    async def wait_settled(self, run_id: uuid.UUID, *, poll_seconds: float = 0.25) -> None:
        """Until the run is finished or waiting for client tools."""
        while True:
            event = self._settled.get(run_id)
            if event is not None and run_id in self.tasks:
                await event.wait()
                return
            async with self.rt.db.sessionmaker() as db:
                status = await db.scalar(select(Run.status).where(Run.id == run_id))
            settled = status is None or status in (*FINAL_RUN_STATUSES, "requires_action")
            if settled and run_id not in self.tasks:
                return
            await asyncio.sleep(poll_seconds)

    # --- leases and the reaper ---------------------------------------------------------

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
        async with self.rt.db.transaction() as db:
            result = await db.execute(
                update(Run)
                .where(Run.id.in_(local), Run.status == "running")
                .values(lease_expires_at=self.lease_deadline())
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
        async with self.rt.db.sessionmaker() as db:
            expired = list(
                (
                    await db.execute(
                        select(Run.id, Run.session_id).where(
                            Run.status.in_(ACTIVE_RUN_STATUSES), Run.lease_expires_at < now()
                        )
                    )
                ).all()
            )
            waiting = list(
                (
                    await db.scalars(
                        select(Run.session_id).where(Run.status == "queued").distinct()
                    )
                ).all()
            )
        for run_id, _session_id in expired:
            if run_id not in self.tasks:
                await self._expire(run_id)
        for session_id in waiting:
            await self.start_next_queued(session_id)

    async def _expire(self, run_id: uuid.UUID) -> None:
        async with self.rt.db.transaction() as db:
            run = await db.scalar(
                select(Run)
                .where(
                    Run.id == run_id,
                    Run.status.in_(ACTIVE_RUN_STATUSES),
                    Run.lease_expires_at < now(),
                )
                .with_for_update(skip_locked=True)
            )
            if run is None:
                return
            session = await db.get(AgentSession, run.session_id)
            assert session is not None
            if run.status == "requires_action":
                error = {"type": "expired", "message": "The client tools were not answered in time"}
                text = EXPIRED_TOOL_TEXT
            else:
                error = {
                    "type": "interrupted",
                    "message": "The process running this turn stopped; post again to continue",
                }
                text = INTERRUPTED_TOOL_TEXT
            await answer_open_tool_uses(db, session, run, text, run.state.get("results", {}))
            run.status = "failed"
            run.error = error
            run.required_action = None
            run.finished_at = now()
            run.lease_expires_at = None
            await append_events_direct(
                db, self.rt.events, run, [("run.failed", run_json(run))], after=None
            )
            log.warning("run %s failed: %s", run.id, error["type"])
        metrics.runs_total.labels(run.kind, "failed").inc()
        self.rt.events.wake(run_id)

    async def shutdown(self) -> None:
        """Give running turns a moment to finish, then stop them as interrupted."""
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
