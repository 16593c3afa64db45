"""The agent loop of one run.

    view -> (compaction layers) -> normalised request -> stream the model
    -> store the assistant message -> run the tools -> store their results -> repeat

No database transaction is held across a model call or a tool call (invariant 5): each
finished piece of work is one step (`step()`), a transaction holding its rows and the
events that report them, sent only after it commits. A step that fails for a transient
database error is retried (`PARLEY_DB_RETRY_SECONDS`) with what it stores held in memory.

What is stored says where a run is, so any process can resume it (`resume`): a stored
assistant message whose tool results are not stored runs its tools (those whose results
are not recorded), anything else calls the model. Only the owner of the run's current
epoch writes (`LostOwnership` stops any other silently).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import Table, Update, bindparam, exists
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.context.estimates import REQUEST_ESTIMATE, request_estimate, usage_input
from app.context.limits import Limits
from app.context.request import build_body
from app.context.session import SessionConfig
from app.context.types import Block, Node
from app.conversation import sessions, store
from app.conversation.payloads import message_payload, result_events, run_out
from app.conversation.records import MessageRecord, new_message
from app.conversation.views import ViewMemos
from app.db import is_transient
from app.domain import USAGE_COUNTERS, RunKind, RunStatus, ToolResult
from app.engine import finishing, refusal, runs
from app.engine.compaction import layers
from app.engine.compaction.collapse import worth_checking
from app.engine.events import LostOwnership
from app.engine.handle import RunStep
from app.engine.llm.errors import ModelError, PromptTooLong
from app.engine.llm.events import MessageDone
from app.engine.model_call import Partial, ReplyStream
from app.engine.quotas import budgets
from app.engine.resources import Resources
from app.engine.tool_calls import plan_round, run_builtins
from app.engine.webhooks import outbox
from app.errors import RunFailed
from app.models import AgentSession, Run
from app.schemas import RunOut

log = logging.getLogger("parley.loop")

T = TypeVar("T")

# Why the supervisor cancels a run's task, besides a client's cancel.
HANDOVER = "handover"  # this process shuts down: another one resumes the run
LOST = "lost"  # another process owns the run now: stop without a write
DISCARDED_ON_RESUME = "The process streaming this message stopped; the reply is generated again"

runs_t = cast(Table, Run.__table__)

# Whether a queued turn waits for the session (built once: an alias costs a proxy per
# column).
_queued = runs_t.alias("queued")
QUEUED_NEXT = (
    exists()
    .where(_queued.c.session_id == bindparam("queued_session"))
    .where(_queued.c.status == RunStatus.QUEUED)
    .label("queued_next")
)


@functools.lru_cache(maxsize=64)
def _settling(fenced: Update) -> Update:
    """A run's settling UPDATE: `fenced` (its values and fence) while the run is still
    running, returning the row, whether a queued turn waits for the session and
    whether the tenant has webhook endpoints. Built once per shape of `fenced`."""
    return fenced.where(runs_t.c.status == RunStatus.RUNNING).returning(
        *runs_t.c, QUEUED_NEXT, outbox.HAS_ENDPOINTS
    )


CONTINUE_TEXT = (
    "Output token limit hit. Resume directly from where you stopped, with no apology and "
    "no recap of what you were doing."
)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """A settled run as its last step stored it, and the messages it stored."""

    run: RunOut
    records: list[MessageRecord]


class TurnRunner:
    """One run executing in this process (a turn, or a manual compaction). It is the
    `RunHandle` that compaction works through."""

    def __init__(
        self,
        resources: Resources,
        run: Run,
        session: AgentSession,
        claimed: runs.Claimed | None = None,
    ) -> None:
        self.resources = resources
        self.settings = resources.settings
        self.run_id = run.id
        self.kind = run.kind
        self.params = run.params
        self._user_message_uuid = run.user_message_uuid
        self._created_at = run.created_at
        self.state = run.state.model_copy(deep=True)
        self.run_usage: dict[str, int] = dict(run.usage or {})
        self._session = session
        self._config = sessions.config_of(session, self.settings)
        self._head: uuid.UUID | None = session.head_uuid
        self._fresh_session = True
        # What a wait-mode answer reports, kept when the run was claimed here (its user
        # message is known): the messages stored so far and the run row it settled with.
        self._known: list[MessageRecord] | None = None
        self.claimed_here = claimed is not None
        # The session's message count as this run left it (the seq of the last message it
        # stored), when known: the final step may then be one statement.
        self._last_seq: int | None = None
        # The claim whose session row version (`session_rows`) this run's end may guard
        # on, until a step of the run writes the row again (read once the claim is
        # stored: a run launched while its claim is sent learns it then).
        self._versioned = claimed
        if claimed is not None:
            self._known = [] if claimed.record is None else [claimed.record]
            self._last_seq = claimed.record.seq if claimed.record is not None else None
            # Committed with the claim: the first view needs no walk.
            resources.views.extend(session.id, self._known)
        self.settled: RunOut | None = None
        self._settling: RunOut | None = None  # becomes `settled` when its step commits
        # The figure of the view whose last message is `_estimated_head` (a reply of this
        # run: its measured input and output tokens), for the collapse check after the run.
        self._estimated_head: uuid.UUID | None = None
        self._estimate = 0
        self.pending_results: dict[str, ToolResult] = {}
        self.queued_next = True  # until `finish` has looked
        # Left to another process (handed over, taken over, or to its lease): what
        # follows a run (a queued turn, the collapse check) is not this one's to do.
        self.left = False
        self.resumed = bool(run.takeovers)  # taken over from a process that stopped
        self.reply = ReplyStream(
            resources.llm,
            resources.events,
            run.id,
            resources.retry,
            self._count_call,
            self.durably,
            # The claim made here reserved the first reply's uuid with its ids.
            reserved_uuid=run.streaming_uuid if claimed is not None else None,
        )

    # --- what compaction sees (RunHandle) -------------------------------------------

    @property
    def session(self) -> AgentSession:
        return self._session

    @property
    def config(self) -> SessionConfig:
        return self._config

    @property
    def head(self) -> uuid.UUID | None:
        return self._head

    @asynccontextmanager
    async def step(self) -> AsyncIterator[RunStep]:
        async with self.resources.events.step(self.run_id) as log_step:
            self._settling = None
            step = RunStep(log_step.db, log_step, self._head)
            yield step
        self._head = step.head  # committed: the run goes on from there
        # The step may have changed the session row: the copy kept in memory is stale
        # (the one-statement end keeps the row it leaves instead).
        self.resources.session_rows.forget(self._session.id)
        self.resources.views.extend(self._session.id, step.stored)
        if step.stored:
            self._last_seq = step.stored[-1].seq
        self._versioned = None
        if self._known is not None:
            self._known += step.stored
        if self._settling is not None:
            self.settled, self._settling = self._settling, None

    def outcome(self) -> RunOutcome | None:
        """The run as it settled (finished or paused) and the messages it stored, from
        memory; None when this process does not know all of them."""
        if self._known is None or self.settled is None:
            return None
        records = sorted((r for r in self._known if r.run_id == self.run_id), key=lambda r: r.seq)
        return RunOutcome(self.settled, records)

    async def emit(self, event: str, data: Any) -> None:
        await self.resources.events.emit(self.run_id, event, data)

    async def emit_discarded(self, message_uuid: uuid.UUID) -> None:
        """Withdraw the message the owner before was streaming (clients drop it)."""
        async with self.step() as step:
            step.report(
                "message.discarded", {"uuid": str(message_uuid), "reason": DISCARDED_ON_RESUME}
            )
            step.run_values["streaming_uuid"] = None

    async def durably(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work` (a step, or reads), retried with backoff while the database fails
        transiently, for up to `db_retry_seconds`; what it stores is held meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.db_retry_seconds
        delay = 0.05
        while True:
            try:
                return await work()
            except Exception as exc:
                if not is_transient(exc) or loop.time() + delay > deadline:
                    raise
                log.warning("run %s: database unavailable (%s); retrying", self.run_id, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # --- the loop ------------------------------------------------------------------

    def _count_call(self) -> None:
        self.state.model_calls += 1

    async def turn(self) -> None:
        """The loop. `run.started` and the user's message were reported when the run was
        claimed (and tool results when they were submitted), in those transactions."""
        limit = self.settings.max_model_calls_per_run
        continuations = 0
        reactive_tried = False
        if self.resumed and await self.resume():
            return
        while True:
            if self.state.model_calls >= limit:
                raise RunFailed(
                    "model_call_limit",
                    f"The run reached its limit of {limit} model calls "
                    "(PARLEY_MAX_MODEL_CALLS_PER_RUN) and was stopped",
                )
            if self.state.model_calls:
                await self.durably(self.check_budget)
            nodes = await self.durably(self.prepare)
            memos = self.resources.views.memo(self._session.id) or ViewMemos()
            body = build_body(self._config, nodes, memo=memos.merge)
            # Recorded on the reply: its usage anchors later estimates of this prefix.
            measured = request_estimate(self._config, nodes, memos.tokens)
            try:
                msg_uuid, done = await self.reply.call(body)
            except PromptTooLong as exc:
                if reactive_tried:
                    raise RunFailed(
                        "context_overflow",
                        f"The conversation is still too long after compaction: {exc.message}",
                        exc.request_id,
                    ) from exc
                reactive_tried = True
                await layers.reactive(self, exc)
                continue
            reactive_tried = False
            uses = [block for block in done.content if block.get("type") == "tool_use"]
            goes_on = bool(uses) or (
                done.stop_reason == "max_tokens" and continuations < self.settings.max_continuations
            )
            # The final reply and the run's end are one step.
            await self.store_assistant(msg_uuid, done, measured, finish=not goes_on)
            if not goes_on:
                return
            if uses:
                if await self.run_tools(uses, set(done.truncated_tool_use_ids)):
                    return  # paused for client tools
                continue
            continuations += 1
            await self.store_user([{"type": "text", "text": CONTINUE_TEXT}], is_meta=True)

    async def resume(self) -> bool:
        """Go on from what is stored after a take-over: run the tools of a stored reply
        whose results are not stored, or end a run whose final reply is stored. True when
        the run paused or ended."""

        async def read_head() -> MessageRecord | None:
            if self._head is None:
                return None
            async with self.resources.db.sessionmaker() as db:
                return await store.get_message(db, self._session.id, self._head)

        head = await self.durably(read_head)
        if head is None or head.role != "assistant" or head.run_id != self.run_id:
            return False
        uses = [block for block in head.content if block.get("type") == "tool_use"]
        if not uses:
            await self.finish(RunStatus.COMPLETED)
            return True
        return await self.run_tools(uses, set(), known=self.state.results)

    async def check_budget(self) -> None:
        """Between model calls: a budget crossed by the calls so far ends the run as
        `failed` `budget_exceeded` (what they produced is kept)."""
        async with self.resources.db.sessionmaker() as db:
            used_up = await budgets.exhausted(db, self.settings, self._session)
        if used_up is not None:
            metrics.budget_refusals.labels(used_up.scope, "run").inc()
            raise RunFailed("budget_exceeded", used_up.message, extra=used_up.as_extra())

    async def prepare(self) -> list[Node]:
        """The session as it is now (the claim's copy on the first call: settings can be
        patched during a run) and the view the next request is built from."""
        if self._fresh_session:
            self._fresh_session = False
            held = self._session
            if not self.resources.views.holds(held.id, self._head, held.marks_version):
                # The view is read from the database: wait until the claim is stored.
                await self.resources.events.ready(self.run_id)
        else:
            async with self.resources.db.sessionmaker() as db:
                session = await db.get(AgentSession, self._session.id)
                assert session is not None
            self._session = session
            self._config = sessions.config_of(session, self.settings)
        return await layers.before_request(self)

    def may_collapse(self) -> bool:
        """Whether the collapse check after the run may find work. Decided in memory when
        the run ended on a reply whose usage measured the view; otherwise the check
        loads the view."""
        if self._head is None or self._head != self._estimated_head:
            return True
        return worth_checking(Limits.of(self._config), self._estimate)

    # --- storing -------------------------------------------------------------------

    def _message(self, content: list[Block], **fields: Any) -> MessageRecord:
        return new_message(
            session_id=self._session.id,
            parent_uuid=self._head,
            content=content,
            run_id=self.run_id,
            **fields,
        )

    async def store_assistant(
        self,
        msg_uuid: uuid.UUID,
        done: MessageDone,
        measured: int | None = None,
        *,
        finish: bool = False,
    ) -> None:
        """Store a reply; with `finish` (the run's final reply) the run completes in the
        same step."""
        usage = {key: int(value) for key, value in done.usage.items() if isinstance(value, int)}
        for key, value in usage.items():
            self.run_usage[key] = self.run_usage.get(key, 0) + value
        counters = {name: usage.get(name, 0) for name in USAGE_COUNTERS}
        reply = self._message(
            done.content,
            uuid_=msg_uuid,
            type="assistant",
            role="assistant",
            model=done.model,
            stop_reason=done.stop_reason,
            usage=usage,
            metadata=None if measured is None else {REQUEST_ESTIMATE: measured},
        )

        async def stored() -> None:
            if finish and await self._finish_turn(reply, usage):
                return
            async with self.step() as step:
                [record] = await step.append(
                    reply, add=counters, session_values={"last_request_at": runs.now()}
                )
                await budgets.record(step.db, self._session.tenant, self._session.id, usage)
                step.run_values.update(usage=self.run_usage, state=self.state, streaming_uuid=None)
                step.report("message.completed", message_payload(record))
                if finish:
                    await self._end_in(step, RunStatus.COMPLETED, None, None)

        await self.durably(stored)
        if finish:
            metrics.runs_total.labels(self.kind, RunStatus.COMPLETED).inc()
        measured_input = usage_input(usage)
        if measured_input > 0:
            self._estimated_head = msg_uuid
            self._estimate = measured_input + usage.get("output_tokens", 0)
        for kind, value in usage.items():
            metrics.model_tokens.labels(kind).inc(value)
        self.reply.take_partial()

    async def _finish_turn(self, reply: MessageRecord, usage: dict[str, int]) -> bool:
        """Store the final reply and complete the run in one statement
        (`finishing.finish_turn`), when this run knows the session's message count (it
        stored the last message). False when it does not, or the count moved (nothing
        written): the caller takes the ordinary step."""
        seen = self._last_seq
        if seen is None or self.resources.db.is_sqlite:
            return False
        await self.resources.events.ready(self.run_id)  # the claim is stored: its version
        version = self._versioned.version if self._versioned is not None else None
        record = reply.with_(seq=seen + 1)
        finished_at = runs.now()
        # The row as the statement leaves it, reported before it runs (its event is
        # stored by it): what `_end_in` would read back.
        settled = RunOut.model_validate(
            {
                "id": self.run_id,
                "session_id": self._session.id,
                "kind": self.kind,
                "status": RunStatus.COMPLETED,
                "user_message_uuid": self._user_message_uuid,
                "required_action": None,
                "usage": self.run_usage,
                "error": None,
                "created_at": self._created_at,
                "finished_at": finished_at,
            }
        )
        tenant, hooked = self._session.tenant, self.resources.webhook_tenants
        try:
            # Alone (autocommitted) unless webhook deliveries go in the same transaction.
            alone = not self.params.webhook_url and tenant not in hooked
            try:
                found = await self._finish_step(record, usage, settled, version, alone)
            except finishing.NeedsOutbox:
                hooked.add(tenant)
                found = await self._finish_step(record, usage, settled, version, False)
        except finishing.Moved:
            self._last_seq = None
            self.resources.session_rows.forget(self._session.id)
            return False
        if not found.has_endpoints:
            hooked.discard(tenant)
        if version is not None:  # the row as it was at `version`, and what the step set
            session = self._session
            self.resources.session_rows.keep(
                session,
                found.version,
                idle=not found.queued_next,  # a queued turn is claimed next
                message_seq=record.seq,
                head_uuid=record.uuid,
                updated_at=finished_at,
                last_request_at=finished_at,
                **{name: getattr(session, name) + usage.get(name, 0) for name in USAGE_COUNTERS},
            )
        return True

    async def _finish_step(
        self,
        record: MessageRecord,
        usage: dict[str, int],
        settled: RunOut,
        version: str | None,
        alone: bool,
    ) -> finishing.Finished:
        """The one-statement end (`finishing.finish_turn`) as the run's step; `alone`:
        autocommitted, without the step's transaction."""
        assert settled.finished_at is not None
        async with self.step() as step:
            step.report("message.completed", message_payload(record))
            step.report(f"run.{RunStatus.COMPLETED}", settled.model_dump(mode="json"))
            events = step.log.final_events()
            found = await finishing.finish_turn(
                step.db,
                self.resources.db,
                alone=alone,
                tenant=self._session.tenant,
                reply=record,
                usage=usage,
                run_id=self.run_id,
                epoch=step.log.channel.epoch,
                run_usage=self.run_usage,
                state=self.state.model_dump(mode="json", exclude_defaults=True),
                finished_at=settled.finished_at,
                events=events,
                version=version,
            )
            if found.has_endpoints or self.params.webhook_url:
                await outbox.enqueue(step.db, self.run_id, ((e.event, e.data) for e in events))
            step.head = record.uuid
            step.stored.append(record)
            self.queued_next = found.queued_next
            self._settling = settled
        return found

    async def store_user(self, content: list[Block], *, is_meta: bool = False) -> None:
        message = self._message(content, type="user", role="user", is_meta=is_meta)

        async def stored() -> None:
            async with self.step() as step:
                [record] = await step.append(message)
                step.report("message.completed", message_payload(record))

        await self.durably(stored)

    # --- tools ---------------------------------------------------------------------

    async def run_tools(
        self, uses: list[Block], truncated: set[str], known: dict[str, ToolResult] | None = None
    ) -> bool:
        """Run the tools of one response (but not those whose results are `known`: a
        resumed run); True when the run pauses for client tools."""
        round_, builtins = plan_round(self._config, uses, truncated)
        known = known or {}
        round_.results.update(known)
        round_.waiting = [use for use in round_.waiting if use["id"] not in known]
        builtins = [use for use in builtins if use["id"] not in known]
        self.pending_results = round_.results
        await run_builtins(
            self.resources.db,
            self._session.id,
            builtins,
            round_,
            self.settings,
            self._record_result,
        )
        if round_.waiting:
            await self.pause(round_.waiting, round_.results)
            return True
        message = self._message(round_.result_blocks(), type="user", role="user")
        self.state.results = {}

        async def stored() -> None:
            async with self.step() as step:
                [record] = await step.append(message)
                step.run_values["state"] = self.state
                for event, data in result_events(record):
                    step.report(event, data)

        await self.durably(stored)
        self.pending_results = {}
        return False

    async def _record_result(self, db: AsyncSession, use_id: str, result: ToolResult) -> None:
        """In a writing tool's own transaction: its result, so the tool's effect and the
        record that it ran commit together (a resumed run does not apply it twice)."""
        self.state.results = {**self.state.results, use_id: result}
        await self.resources.events.fenced(db, self.run_id, {"state": self.state})

    async def pause(self, waiting: list[Block], results: dict[str, ToolResult]) -> None:
        # While paused the lease is the deadline for the client's answer (then `expired`).
        deadline = runs.now() + timedelta(seconds=self.settings.requires_action_ttl_seconds)
        required = {
            "type": "tool_results",
            "tool_uses": [{"id": u["id"], "name": u["name"], "input": u["input"]} for u in waiting],
        }
        self.state.results = results

        async def stored() -> None:
            async with self.step() as step:
                run = await self._settle_in(
                    step,
                    status=RunStatus.REQUIRES_ACTION,
                    required_action=required,
                    state=self.state,
                    lease_expires_at=deadline,
                    worker_id=None,
                    streaming_uuid=None,
                )
                step.report("run.requires_action", run.model_dump(mode="json"))

        await self.durably(stored)
        self.pending_results = {}

    async def _settle_in(self, step: RunStep, **values: Any) -> RunOut:
        """In the run's last step here (a pause, the end): set `values` on the run row
        while it is running and this owner's, learning with it whether a queued turn
        waits for the session (it starts right after) and whether the tenant has
        webhook endpoints (else the step writes no deliveries). The run as it settles;
        the caller reports it next. `LostOwnership` when the run was ended or taken
        elsewhere."""
        fenced, params = step.log.final_update(**values)
        result = await step.db.execute(
            _settling(fenced),
            {**params, "queued_session": self._session.id, "tenant": self._session.tenant},
        )
        run = result.first()
        if run is None:
            raise LostOwnership(f"run {self.run_id} was ended or taken elsewhere")
        step.log.webhooks = bool(run.has_endpoints or self.params.webhook_url)
        self.queued_next = bool(run.queued_next)
        self._settling = run_out(run)
        return self._settling

    # --- ending --------------------------------------------------------------------

    async def finish(
        self,
        status: RunStatus,
        error: dict[str, Any] | None = None,
        *,
        also: Callable[[RunStep], Awaitable[None]] | None = None,
    ) -> None:
        """Mark the run finished and report it; `also` writes more in the same step (a
        refused turn's rewind). `LostOwnership` when someone else ended it."""
        await self.durably(lambda: self._finish(status, error, also))

    async def _finish(
        self,
        status: RunStatus,
        error: dict[str, Any] | None,
        also: Callable[[RunStep], Awaitable[None]] | None,
    ) -> None:
        async with self.step() as step:
            await self._end_in(step, status, error, also)
        metrics.runs_total.labels(self.kind, status).inc()

    async def _end_in(
        self,
        step: RunStep,
        status: RunStatus,
        error: dict[str, Any] | None,
        also: Callable[[RunStep], Awaitable[None]] | None,
    ) -> None:
        """In `step`: mark the run finished and report it (`also` first writes more in
        the step)."""
        if also is not None:
            await also(step)
            self._known = None  # it may change stored messages (a refused turn's rewind)
        run = await self._settle_in(
            step,
            status=status,
            error=error,
            finished_at=runs.now(),
            lease_expires_at=None,
            required_action=None,
            state=self.state,
            streaming_uuid=None,
            cancel_requested_at=None,
        )
        step.report(f"run.{status}", run.model_dump(mode="json"))

    async def stop_cancelled(self) -> None:
        """A client's cancel (on this or another replica): keep what was produced, answer
        open tool uses, end as cancelled."""
        partial = self.reply.take_partial()
        await self.durably(lambda: self._keep_partial(partial))
        await self.finish(RunStatus.CANCELLED)

    async def _keep_partial(self, partial: Partial | None) -> None:
        async with self.step() as step:
            db = step.db
            status = await runs.status_of(db, self.run_id)
            if status != RunStatus.RUNNING:
                return
            step.run_values["streaming_uuid"] = None
            stored: list[MessageRecord] = []
            if partial is not None and partial.content():
                stored += await step.append(
                    self._message(
                        partial.content(),
                        uuid_=partial.uuid,
                        type="assistant",
                        role="assistant",
                        subtype="interrupted",
                        model=self._session.model,
                    )
                )
            answered = await runs.answer_open_tool_uses(
                db,
                self._session.id,
                step.head,
                self.run_id,
                runs.CANCELLED_TOOL_TEXT,
                self.pending_results,
            )
            if answered is not None:
                step.head = answered.uuid
                step.stored.append(answered)
                stored.append(answered)
            for record in stored:
                step.report("message.completed", message_payload(record))


async def execute(
    resources: Resources,
    run_id: uuid.UUID,
    cancel_reason: Callable[[uuid.UUID], str | None],
    run: Run | None = None,
    session: AgentSession | None = None,
    claimed: runs.Claimed | None = None,
) -> TurnRunner | None:
    """Run (or resume) one run to its end or its next pause; the runner, for what it
    learnt (its session, whether a queued turn waits, its outcome). `run` and `session`
    are the claim's copies when the claim happened in this process, `claimed` what the
    claim stored."""
    if run is None or session is None:
        async with resources.db.sessionmaker() as db:
            run = await db.get(Run, run_id)
            session = await db.get(AgentSession, run.session_id) if run else None
    if run is None or session is None or run.status != RunStatus.RUNNING:
        return None
    runner = TurnRunner(resources, run, session, claimed)
    open_channel(resources, run, claimed)
    try:
        await _drive(runner, run, cancel_reason)
    except LostOwnership:
        log.info("run %s has another owner now (or none: its claim rolled back)", run_id)
        runner.left = True
    except Exception as exc:
        if not is_transient(exc):
            raise
        # Its lease runs out and a process that reaches the database resumes it.
        log.warning("run %s: database unavailable too long; left to its lease", run_id)
        runner.left = True
    finally:
        await resources.events.close(run_id)
    return runner


def open_channel(
    resources: Resources, run: Run, claimed: runs.Claimed | None, *, pending: bool = False
) -> None:
    """The run's live channel here. A claim made here reserved this owner's ids right
    after its events (kept for followers); otherwise ids go on after the last one stored
    or reserved by any owner before."""
    if claimed is not None:
        resources.events.open(
            run.id,
            run.last_event_seq,
            run.epoch,
            reserved=run.reserved_seq,
            history=claimed.events,
            pending=pending,
        )
    else:
        resources.events.open(run.id, max(run.last_event_seq, run.reserved_seq), run.epoch)


async def _drive(
    runner: TurnRunner, run: Run, cancel_reason: Callable[[uuid.UUID], str | None]
) -> None:
    resources = runner.resources
    run_id = runner.run_id
    try:
        streaming = run.streaming_uuid
        # The owner before stopped mid-message (a claim made here only reserved the uuid).
        if streaming is not None and not runner.claimed_here:
            await runner.durably(lambda: runner.emit_discarded(streaming))
        if run.cancel_requested_at is not None:
            await runner.stop_cancelled()
        elif run.kind == RunKind.COMPACT:
            runner.state.compaction = await layers.run_manual(runner, run.params.instructions)
            await runner.finish(RunStatus.COMPLETED)
        else:
            await runner.turn()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        reason = cancel_reason(run_id)
        if reason == HANDOVER:
            await resources.events.hand_over(run_id)
            runner.left = True
        elif reason == LOST:
            raise LostOwnership(f"run {run_id} has another owner") from None
        else:
            await runner.stop_cancelled()
    except LostOwnership:
        raise
    except RunFailed as exc:
        await runner.finish(RunStatus.FAILED, exc.error)
    except ModelError as exc:
        refused = refusal.refused_turn(run, exc)
        if refused is not None:
            rewind = functools.partial(
                refusal.rewind, session_id=runner.session.id, message_uuid=refused
            )
            await runner.finish(RunStatus.FAILED, refusal.refused_error(exc), also=rewind)
        else:
            await runner.finish(RunStatus.FAILED, upstream_error(exc))
    except Exception as exc:
        if is_transient(exc):
            raise
        log.exception("run %s failed unexpectedly", run_id)
        await runner.finish(
            RunStatus.FAILED,
            {"type": "internal", "message": "The run failed because of an internal error"},
        )


def upstream_error(exc: ModelError) -> dict[str, Any]:
    return {
        "type": "upstream_error",
        "message": f"The model API failed ({exc.kind}): {exc.message}",
        **({"request_id": exc.request_id} if exc.request_id else {}),
    }
