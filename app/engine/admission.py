"""Admitting work into the engine: posting a turn (with its idempotency key and `if_busy`),
regenerating a reply, a manual compaction, a client's tool results, and cancelling.

Each call works inside the request's transaction: it stores what the client sent and
claims the session (or queues the turn), and registers the launch of the run for after
the commit, so a run never starts on rows that might still roll back, except *pending*:
its model request is sent while the claim is stored, and it sends and writes nothing
until then (stopped, upstream request included, if the claim is not stored). A plain
turn's claim is one statement of its own (`runs.claim_at_once`), stored when it returns.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app import metrics
from app.conversation import history, sessions
from app.conversation.payloads import result_events
from app.db import after_commit, after_rollback
from app.domain import (
    FINAL_RUN_STATUSES,
    IfBusy,
    RunKind,
    RunParams,
    RunState,
    RunStatus,
    ToolResult,
)
from app.engine import runs
from app.engine.quotas import budgets, running
from app.engine.resources import Resources
from app.engine.supervisor import Supervisor
from app.engine.tools.builtin import truncate_middle
from app.errors import BudgetExceeded, Conflict, Invalid, RateLimited, Unavailable
from app.models import AgentSession, Run
from app.schemas import ToolResultsIn

# Seconds a post refused for the tenant's running runs is told to wait.
RUNNING_RETRY_AFTER = 5


def request_hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class Admission:
    def __init__(self, resources: Resources, supervisor: Supervisor) -> None:
        self.resources = resources
        self.supervisor = supervisor

    def _launch_after_commit(
        self,
        db: AsyncSession,
        run: Run,
        session: AgentSession,
        claimed: runs.Claimed | None = None,
    ) -> None:
        """Launch a run this transaction made running once it commits. A claim made here
        on Postgres launches at once, pending: the model request is prepared and sent
        while the claim commits, and nothing is sent or written until it has (stopped,
        upstream request included, if it rolls back)."""
        self._check_accepting()
        if run.status != RunStatus.RUNNING:
            return
        supervisor = self.supervisor
        if claimed is not None and db.get_bind().dialect.name == "postgresql":
            supervisor.launch(run, session, claimed, pending=True)
            after_commit(db, lambda: supervisor.confirm(run.id))
            after_rollback(db, lambda: supervisor.abort(run))
        else:
            after_commit(db, lambda: supervisor.launch(run, session, claimed))

    def _check_accepting(self) -> None:
        if self.supervisor.shutting_down.is_set():  # draining: nothing is stored (503)
            raise Unavailable("The server is shutting down; post again to another replica")

    # --- turns ---------------------------------------------------------------------

    async def find_idempotent(
        self, db: AsyncSession, session_id: uuid.UUID, key: str | None, digest: str
    ) -> Run | None:
        """The run a retried post already made, if any; 422 when the key was used with
        another body."""
        if not key:
            return None
        run = await runs.by_idempotency_key(db, session_id, key)
        if run is not None and run.request_hash != digest:
            raise Invalid.field(
                ["header", "Idempotency-Key"],
                "reused with another body",
                "This Idempotency-Key was used with a different request body",
            )
        return run

    async def post_turn(
        self,
        db: AsyncSession,
        session: AgentSession,
        *,
        content: str | list[dict[str, Any]],
        parent_uuid: uuid.UUID | None,
        if_busy: IfBusy,
        idempotency_key: str | None,
        digest: str,
        webhook_url: str | None = None,
        version: str | None = None,
    ) -> Run:
        """The run of a posted turn: the one an idempotent retry already made, or a new
        one, claimed (running) or queued. `version`: the session row's, when known
        (`session_rows`)."""
        return await self.submit(
            db,
            session,
            RunParams(content=content, parent_uuid=parent_uuid, webhook_url=webhook_url),
            if_busy=if_busy,
            idempotency_key=idempotency_key,
            digest=digest,
            version=version,
        )

    async def regenerate(
        self,
        db: AsyncSession,
        session: AgentSession,
        message_uuid: uuid.UUID,
        *,
        idempotency_key: str | None = None,
        digest: str = "",
    ) -> Run:
        """A new reply as a sibling of assistant message `message_uuid`."""
        record = await history.message(db, session.id, message_uuid)
        if record.role != "assistant" or record.parent_uuid is None:
            raise Invalid("Only an assistant reply with a parent can be regenerated")
        params = RunParams(parent_uuid=record.parent_uuid, regenerate=message_uuid)
        return await self.submit(
            db, session, params, idempotency_key=idempotency_key, digest=digest
        )

    async def compact(
        self, db: AsyncSession, session: AgentSession, instructions: str | None
    ) -> Run:
        """A manual compaction: a run of kind `compact` that holds the session."""
        return await self.submit(
            db, session, RunParams(instructions=instructions), kind=RunKind.COMPACT
        )

    async def submit(
        self,
        db: AsyncSession,
        session: AgentSession,
        params: RunParams,
        *,
        kind: RunKind = RunKind.TURN,
        if_busy: IfBusy = IfBusy.REJECT,
        idempotency_key: str | None = None,
        digest: str = "",
        version: str | None = None,
    ) -> Run:
        """The run this key already made, or: store the turn and claim the session, or
        queue it (`enqueue`), or cancel the active run first (`interrupt`). The run is
        launched after the commit (at once after a one-statement claim). `version`: the
        session row's as `session` shows it (Postgres `xmin`), when known: the
        one-statement claim is guarded on it.

        Posts that look before they claim (for their key's run, for the active run) take
        the session row first, so racing posts are admitted one after another, each
        seeing what the previous one committed. `reject` alone needs no lock: the claim
        fails on the one-active-run index when it loses."""
        if params.parent_uuid is not None:
            await history.message(db, session.id, params.parent_uuid)
        run = self._new_run(session, kind, params, idempotency_key, digest)
        at_once = self._may_claim_at_once(db, session, run, if_busy)
        if at_once:
            await self.check_quotas(db, session)
            await self._check_running(db, session)
            self._check_accepting()
            claimed = await self._claim_at_once(db, session, run, version)
            if claimed is not None:
                return run
            # Not claimed: the run launched meanwhile (if any) keeps its id until it stops.
            run = self._new_run(session, kind, params, idempotency_key, digest)
        if at_once or version is not None:
            # Read the row again: it changed since it was read, or it is a copy kept in
            # memory (only the guarded claim above may start from one). Then look, claim,
            # and forget the kept copy once this has changed the row.
            found = await db.get(AgentSession, session.id, populate_existing=True)
            session = sessions.owned(found, session.tenant, session.id)
            rows, session_id = self.resources.session_rows, session.id
            after_commit(db, lambda: rows.forget(session_id))
        if if_busy == IfBusy.INTERRUPT:
            earlier = await self._interrupt(db, session, idempotency_key, digest)
            if earlier is not None:
                return earlier
        if idempotency_key is not None or if_busy == IfBusy.ENQUEUE:
            await self.lock_session(db, session)
        earlier = await self.find_idempotent(db, session.id, idempotency_key, digest)
        if earlier is not None:
            return earlier  # a retry gets its run even when the budget is spent since
        if if_busy != IfBusy.INTERRUPT:  # `_interrupt` checked, before it cancelled
            await self.check_quotas(db, session)
        # Look before inserting: a claim that inserted an active run beside one whose last
        # step is committing deadlocks with it on the one-active-run index.
        active = await runs.active(db, session.id)
        if active is not None and if_busy == IfBusy.REJECT:
            raise runs.conflict_for(active)
        crowded = await running.at_limit(db, self.resources.settings, session.tenant)
        if crowded is not None and if_busy != IfBusy.ENQUEUE:
            raise self._crowded(crowded)
        # An idle session whose queued turns have not started yet (the run before just
        # ended): this one goes behind them, and the oldest starts now.
        waiting = (
            active is None
            and crowded is None
            and if_busy == IfBusy.ENQUEUE
            and await runs.has_queued(db, session.id)
        )
        if active is not None or crowded is not None or waiting:  # only with `enqueue`
            db.add(run)
            await db.flush()
            if waiting:
                after_commit(db, lambda: self.supervisor.start_queued_soon(session.id))
            return run
        resources = self.resources
        claimed = await runs.claim(
            db,
            session,
            run,
            worker_id=resources.worker_id,
            lease_seconds=resources.settings.run_lease_seconds,
        )
        self._launch_after_commit(db, run, session, claimed)
        return run

    async def _claim_at_once(
        self, db: AsyncSession, session: AgentSession, run: Run, version: str | None
    ) -> runs.Claimed | None:
        """The one-statement claim. When the claim is all but sure to be stored (no
        retry, and the session row kept at `version` was left by the end of a run, with
        nothing seen to change it since: `SessionRows.idle`), the run is launched
        pending just before the statement is sent, so its model request travels while
        the statement does; otherwise the run launches once the claim is stored (a
        failed guard would close a model request just opened, which the provider may
        bill). None when the guard failed: nothing stored, a pending run stopped and its
        model request closed."""
        supervisor, session_rows = self.supervisor, self.resources.session_rows
        if session in db:  # the run's own: a rollback of `db` must not expire it
            db.expunge(session)
        pending = run.idempotency_key is None and session_rows.idle(session.id, version)
        session_rows.forget(session.id)  # kept again once stored; a post meanwhile reads it

        def launch_pending(claim: runs.Claimed) -> None:
            supervisor.launch(run, session, claim, pending=True)

        try:
            claimed = await runs.claim_at_once(
                db,
                self.resources.db,
                session,
                run,
                worker_id=self.resources.worker_id,
                lease_seconds=self.resources.settings.run_lease_seconds,
                version=version,
                sending=launch_pending if pending else None,
            )
        except BaseException:  # stored or not is unknown: a stored run is reaped later
            if pending:
                supervisor.abort(run)
            raise
        overlapped = "true" if pending else "false"
        metrics.turn_claims.labels("stored" if claimed else "guard_failed", overlapped).inc()
        if claimed is None:
            if pending:  # nothing known here said it would fail: another writer
                supervisor.abort(run)
                session_rows.changed_elsewhere(session.id)
            return None
        if claimed.version is not None and claimed.record is not None:
            session_rows.keep(session, claimed.version, updated_at=claimed.record.created_at)
        if pending:
            supervisor.confirm(run.id)
        else:
            supervisor.launch(run, session, claimed)
            await asyncio.sleep(0)  # the run sends its model request before this goes on
        return claimed

    @staticmethod
    def _new_run(
        session: AgentSession,
        kind: RunKind,
        params: RunParams,
        idempotency_key: str | None,
        digest: str,
    ) -> Run:
        return runs.new_run(
            id=uuid.uuid4(),
            session_id=session.id,
            kind=kind,
            status=RunStatus.QUEUED,
            params=params,
            idempotency_key=idempotency_key,
            request_hash=digest,
            usage={},
            state=RunState(),
            last_event_seq=0,
            reserved_seq=0,
            epoch=0,
            takeovers=0,
            created_at=runs.now(),
        )

    def _may_claim_at_once(
        self, db: AsyncSession, session: AgentSession, run: Run, if_busy: IfBusy
    ) -> bool:
        """Whether the turn may be claimed in one statement (`runs.claim_at_once`), with
        nothing looked at first: new content after the head, rejected if the session is
        busy, on Postgres. A keyed post goes this way only when no limit could refuse it
        (a retry must get its run, not a refusal)."""
        if (
            if_busy != IfBusy.REJECT
            or run.kind != RunKind.TURN
            or run.params.content is None
            or run.params.parent_uuid is not None
            or db.get_bind().dialect.name != "postgresql"
        ):
            return False
        if run.idempotency_key is None:
            return True
        limits = self.resources.settings.limits_of(session.tenant)
        return not (limits.token_budget or limits.running_runs or session.token_budget)

    async def _check_running(self, db: AsyncSession, session: AgentSession) -> None:
        crowded = await running.at_limit(db, self.resources.settings, session.tenant)
        if crowded is not None:
            raise self._crowded(crowded)

    @staticmethod
    def _crowded(limit: int) -> RateLimited:
        metrics.throttled.labels("running_runs").inc()
        return RateLimited(
            f"The tenant has its limit of {limit} runs running; retry later or post "
            "with if_busy=enqueue",
            retry_after=RUNNING_RETRY_AFTER,
            extra={"limit": "running_runs"},
        )

    @staticmethod
    async def lock_session(db: AsyncSession, session: AgentSession) -> None:
        """Take the session row until the commit, reloading it (its head)."""
        await db.refresh(session, with_for_update=True)

    async def _interrupt(
        self, db: AsyncSession, session: AgentSession, key: str | None, digest: str
    ) -> Run | None:
        """Cancel the active run, before the post takes the session row: a run executing
        here needs that row for its last step, so a post holding it would wait on its own
        cancel. The run this key already made (a retry, or a post racing this one) is
        returned instead, never cancelled."""
        run = await self.find_idempotent(db, session.id, key, digest)
        if run is not None:
            return run
        await self.check_quotas(db, session)  # a refused post cancels nothing
        active = await runs.active(db, session.id)
        if active is None:
            return None
        if key is not None and active.idempotency_key == key:
            return await self.find_idempotent(db, session.id, key, digest)
        await self.cancel(db, session, active, reason="interrupted by a newer turn")
        await db.flush()
        return None

    async def check_quotas(self, db: AsyncSession, session: AgentSession) -> None:
        """429 `budget_exceeded` when the tenant's or the session's token budget is
        used up."""
        used_up = await budgets.exhausted(db, self.resources.settings, session)
        if used_up is not None:
            metrics.budget_refusals.labels(used_up.scope, "post").inc()
            raise BudgetExceeded(used_up.message, extra=used_up.as_extra())

    # --- client tools ----------------------------------------------------------------

    async def submit_tool_results(
        self, db: AsyncSession, session: AgentSession, run: Run, body: ToolResultsIn
    ) -> tuple[int, int]:
        """Store the client's answers with the results computed before the pause and
        make the run `running` again; launched after the commit. Accepted once: the
        database lets one post take the pause, and a repeat of the accepted body answers
        as it did (a different one is a 409). Returns where the answer starts: the last
        event before it and the seq of the stored message (the wait-mode answer lists
        the run's messages from there)."""
        key = " ".join(sorted(result.tool_use_id for result in body.results))
        digest = request_hash(body.model_dump(mode="json", exclude={"stream", "background"}))
        if run.status == RunStatus.REQUIRES_ACTION and key not in (run.tool_answers or {}):
            self._check_pending(run, body)
            if await self._take_pause(db, run):
                return await self._store_results(db, session, run, body, key, digest)
            await db.refresh(run)  # another post (or a cancel) got there first
        first = (run.tool_answers or {}).get(key)
        if first is None:
            raise Conflict(f"Run {run.id} is {run.status}, not waiting for tool results")
        if first["hash"] != digest:
            raise Conflict(
                f"Run {run.id} already accepted other results for these tool uses",
                extra={"run_id": str(run.id)},
            )
        return int(first["after_seq"]), int(first["message_seq"])

    @staticmethod
    def _check_pending(run: Run, body: ToolResultsIn) -> None:
        pending = [use["id"] for use in (run.required_action or {}).get("tool_uses", [])]
        given = [result.tool_use_id for result in body.results]
        if sorted(given) != sorted(pending):
            raise Invalid.field(
                ["body", "results"],
                "must match pending tool uses",
                f"results must answer exactly the pending tool uses {pending}; got {given}",
            )

    async def _take_pause(self, db: AsyncSession, run: Run) -> bool:
        """Make the run `running` if it still awaits the tool uses this request saw: a
        conditional UPDATE, so of concurrent posts exactly one wins (the others wait
        for its commit and then find the pause gone)."""
        taken = await db.scalars(
            update(Run)
            .where(
                Run.id == run.id,
                Run.status == RunStatus.REQUIRES_ACTION,
                Run.required_action == run.required_action,
            )
            .values(
                status=RunStatus.RUNNING,
                required_action=None,
                worker_id=self.resources.worker_id,
                lease_expires_at=runs.lease_deadline(self.resources.settings.run_lease_seconds),
                epoch=Run.epoch + 1,  # a new owner (events.LostOwnership fences the old)
            )
            .returning(Run)
            .execution_options(populate_existing=True)
        )
        return taken.first() is not None

    async def _store_results(
        self,
        db: AsyncSession,
        session: AgentSession,
        run: Run,
        body: ToolResultsIn,
        key: str,
        digest: str,
    ) -> tuple[int, int]:
        limit = self.resources.settings.tool_result_max_chars
        known = dict(run.state.results)
        for result in body.results:
            content = result.content
            if isinstance(content, str):
                content = truncate_middle(content, limit)
            known[result.tool_use_id] = ToolResult(content=content, is_error=result.is_error)
        record = await runs.answer_open_tool_uses(
            db, session.id, session.head_uuid, run.id, runs.INTERRUPTED_TOOL_TEXT, known
        )
        after_seq = run.last_event_seq
        run.state = run.state.model_copy(update={"results": {}})
        if record is not None:
            set_committed_value(session, "head_uuid", record.uuid)
            await runs.append_events(db, self.resources.events, run, result_events(record))
        message_seq = record.seq if record is not None else 0
        answer = {"hash": digest, "after_seq": after_seq, "message_seq": message_seq}
        run.tool_answers = {**(run.tool_answers or {}), key: answer}
        await db.flush()
        self._launch_after_commit(db, run, session)
        return after_seq, message_seq

    # --- cancelling --------------------------------------------------------------------

    async def cancel(
        self, db: AsyncSession, session: AgentSession, run: Run, *, reason: str = "cancelled"
    ) -> Run:
        """Stop a run, keeping what it produced and leaving the history valid.
        Idempotent: a finished run is returned unchanged."""
        if run.status in FINAL_RUN_STATUSES:
            return run
        if run.status == RunStatus.RUNNING and await self.supervisor.cancel(run, reason):
            await db.refresh(run)
            await db.refresh(session)
            return run
        answered = None
        if run.status == RunStatus.REQUIRES_ACTION:
            answered = await runs.answer_open_tool_uses(
                db,
                session.id,
                session.head_uuid,
                run.id,
                runs.CANCELLED_TOOL_TEXT,
                run.state.results,
            )
            if answered is not None:  # a turn claimed next in this transaction follows it
                set_committed_value(session, "head_uuid", answered.uuid)
        await runs.end(db, self.resources.events, run, RunStatus.CANCELLED, answered=answered)
        self.resources.events.wake(run.id)
        metrics.runs_total.labels(run.kind, "cancelled").inc()
        return run

    async def cancel_all(self, db: AsyncSession, session: AgentSession, *, reason: str) -> None:
        """Cancel every active or queued run of the session (it is being deleted)."""
        for run in await runs.unfinished(db, session.id):
            await self.cancel(db, session, run, reason=reason)
