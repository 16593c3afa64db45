"""The agent loop of one run.

    view -> (compaction layers) -> normalised request -> stream the model
    -> store the assistant message -> run the tools -> store their results -> repeat

No database transaction is held across a model call or a tool call (invariant 5): each
finished piece of work is one step (`step()`), a transaction holding its rows and the
events that report them, sent only after it commits.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import Row, Table, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.context.estimates import REQUEST_ESTIMATE, request_estimate
from app.context.request import build_body
from app.context.session import SessionConfig
from app.context.types import Block, Node
from app.conversation import sessions
from app.conversation.payloads import message_payload, result_events, run_json
from app.conversation.records import MessageRecord, new_message
from app.conversation.store import sessions_t
from app.domain import USAGE_COUNTERS, RunKind, RunStatus, ToolResult
from app.engine import runs
from app.engine.compaction import layers
from app.engine.handle import RunStep
from app.engine.llm.errors import ModelError, PromptTooLong
from app.engine.llm.events import MessageDone
from app.engine.model_call import ReplyStream
from app.engine.resources import Resources
from app.engine.tool_calls import plan_round, run_builtins
from app.errors import RunFailed
from app.models import AgentSession, Run

log = logging.getLogger("parley.loop")

runs_t = cast(Table, Run.__table__)

CONTINUE_TEXT = (
    "Output token limit hit. Resume directly from where you stopped, with no apology and "
    "no recap of what you were doing."
)


class TurnRunner:
    """One run executing in this process (a turn, or a manual compaction). It is the
    `RunHandle` that compaction works through."""

    def __init__(self, resources: Resources, run: Run, session: AgentSession) -> None:
        self.resources = resources
        self.settings = resources.settings
        self.run_id = run.id
        self.kind = run.kind
        self.params = run.params
        self.state = run.state.model_copy(deep=True)
        self.run_usage: dict[str, int] = dict(run.usage or {})
        self._session = session
        self._config = sessions.config_of(session, self.settings)
        self._head: uuid.UUID | None = session.head_uuid
        self._fresh_session = True
        self.pending_results: dict[str, ToolResult] = {}
        self.queued_next = True  # until `finish` has looked
        self.reply = ReplyStream(
            resources.llm, resources.events, run.id, resources.retry, self._count_call
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
            step = RunStep(log_step.db, log_step, self._head)
            yield step
        self._head = step.head  # committed: the run goes on from there

    async def emit(self, event: str, data: Any) -> None:
        await self.resources.events.emit(self.run_id, event, data)

    # --- the loop ------------------------------------------------------------------

    def _count_call(self) -> None:
        self.state.model_calls += 1

    async def turn(self) -> None:
        """The loop. `run.started` and the user's message were reported when the run was
        claimed (and tool results when they were submitted), in those transactions."""
        limit = self.settings.max_model_calls_per_run
        continuations = 0
        reactive_tried = False
        while True:
            if self.state.model_calls >= limit:
                raise RunFailed(
                    "model_call_limit",
                    f"The run reached its limit of {limit} model calls "
                    "(PARLEY_MAX_MODEL_CALLS_PER_RUN) and was stopped",
                )
            nodes = await self.prepare()
            body = build_body(self._config, nodes)
            # Recorded on the reply: its usage anchors later estimates of this prefix.
            measured = request_estimate(self._config, nodes)
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
            await self.store_assistant(msg_uuid, done, measured)
            uses = [block for block in done.content if block.get("type") == "tool_use"]
            if uses:
                if await self.run_tools(uses, set(done.truncated_tool_use_ids)):
                    return  # paused for client tools
                continue
            if done.stop_reason == "max_tokens" and continuations < self.settings.max_continuations:
                continuations += 1
                await self.store_user([{"type": "text", "text": CONTINUE_TEXT}], is_meta=True)
                continue
            break
        await self.finish(RunStatus.COMPLETED)

    async def prepare(self) -> list[Node]:
        """The session as it is now (the claim's copy on the first call: settings can be
        patched during a run) and the view the next request is built from."""
        if self._fresh_session:
            self._fresh_session = False
        else:
            async with self.resources.db.sessionmaker() as db:
                session = await db.get(AgentSession, self._session.id)
                assert session is not None
            self._session = session
            self._config = sessions.config_of(session, self.settings)
        return await layers.before_request(self)

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
        self, msg_uuid: uuid.UUID, done: MessageDone, measured: int | None = None
    ) -> None:
        usage = {key: int(value) for key, value in done.usage.items() if isinstance(value, int)}
        for key, value in usage.items():
            self.run_usage[key] = self.run_usage.get(key, 0) + value
        counters = {name: sessions_t.c[name] + usage.get(name, 0) for name in USAGE_COUNTERS}
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
        async with self.step() as step:
            [record] = await step.append(
                reply, session_values={**counters, "last_request_at": runs.now()}
            )
            step.run_values.update(usage=self.run_usage, state=self.state)
            step.report("message.completed", message_payload(record))
        for kind, value in usage.items():
            metrics.model_tokens.labels(kind).inc(value)
        self.reply.take_partial()

    async def store_user(self, content: list[Block], *, is_meta: bool = False) -> None:
        async with self.step() as step:
            [record] = await step.append(
                self._message(content, type="user", role="user", is_meta=is_meta)
            )
            step.report("message.completed", message_payload(record))

    # --- tools ---------------------------------------------------------------------

    async def run_tools(self, uses: list[Block], truncated: set[str]) -> bool:
        """Run the tools of one response; True when the run pauses for client tools."""
        round_, builtins = plan_round(self._config, uses, truncated)
        self.pending_results = round_.results
        await run_builtins(
            self.resources.db,
            self._session.id,
            builtins,
            round_,
            self.settings,
        )
        if round_.waiting:
            await self.pause(round_.waiting, round_.results)
            return True
        async with self.step() as step:
            [record] = await step.append(
                self._message(round_.result_blocks(), type="user", role="user")
            )
            for event, data in result_events(record):
                step.report(event, data)
        self.pending_results = {}
        return False

    async def pause(self, waiting: list[Block], results: dict[str, ToolResult]) -> None:
        # While paused the lease is the deadline for the client's answer (then `expired`).
        deadline = runs.now() + timedelta(seconds=self.settings.requires_action_ttl_seconds)
        required = {
            "type": "tool_results",
            "tool_uses": [{"id": u["id"], "name": u["name"], "input": u["input"]} for u in waiting],
        }
        self.state.results = results
        async with self.step() as step:
            run = await self.update_run(
                step.db,
                status=RunStatus.REQUIRES_ACTION,
                required_action=required,
                state=self.state,
                lease_expires_at=deadline,
                worker_id=None,
            )
            assert run is not None
            step.report("run.requires_action", run_json(run))
        self.pending_results = {}

    async def update_run(self, db: AsyncSession, **values: Any) -> Row[Any] | None:
        """Set `values` on this run while it is still running; its row, or None when it
        was finished elsewhere meanwhile."""
        result = await db.execute(
            update(runs_t)
            .where(runs_t.c.id == self.run_id, runs_t.c.status == RunStatus.RUNNING)
            .values(**values)
            .returning(*runs_t.c)
        )
        return result.first()

    # --- ending --------------------------------------------------------------------

    async def finish(self, status: RunStatus, error: dict[str, Any] | None = None) -> bool:
        """Mark the run finished (unless someone else already did) and report it."""
        async with self.step() as step:
            run = await self.update_run(
                step.db,
                status=status,
                error=error,
                finished_at=runs.now(),
                lease_expires_at=None,
                required_action=None,
                state=self.state,
            )
            if run is not None:
                step.report(f"run.{status}", run_json(run))
                # Whether a queued turn waits for this session (it starts right after).
                self.queued_next = (
                    await step.db.scalar(
                        select(runs_t.c.id)
                        .where(
                            runs_t.c.session_id == self._session.id,
                            runs_t.c.status == RunStatus.QUEUED,
                        )
                        .limit(1)
                    )
                    is not None
                )
        if run is None:
            return False
        metrics.runs_total.labels(self.kind, status).inc()
        return True

    async def stop_cancelled(self, reason: str | None) -> None:
        """Keep what was produced, answer open tool uses, end as cancelled (or as failed
        `interrupted` when the server is shutting down). `reason` is the supervisor's:
        `shutdown` of this process, `external` when another replica finished the run
        meanwhile, or a client's cancel (`cancelled`, `interrupted by a newer turn`, ...)."""
        if reason == "external":
            return  # finished elsewhere (another replica cancelled or reaped it)
        partial = self.reply.take_partial()
        async with self.step() as step:
            db = step.db
            status = await runs.status_of(db, self.run_id)
            if status != RunStatus.RUNNING:
                return
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
            placeholder = (
                runs.INTERRUPTED_TOOL_TEXT if reason == "shutdown" else runs.CANCELLED_TOOL_TEXT
            )
            answered = await runs.answer_open_tool_uses(
                db, self._session.id, step.head, self.run_id, placeholder, self.pending_results
            )
            if answered is not None:
                step.head = answered.uuid
                stored.append(answered)
            for record in stored:
                step.report("message.completed", message_payload(record))
        if reason == "shutdown":
            await self.finish(
                RunStatus.FAILED,
                {
                    "type": "interrupted",
                    "message": "The server shut down during the run; post again to continue",
                },
            )
        else:
            await self.finish(RunStatus.CANCELLED)


async def execute(
    resources: Resources,
    run_id: uuid.UUID,
    cancel_reason: Callable[[uuid.UUID], str | None],
    run: Run | None = None,
    session: AgentSession | None = None,
) -> TurnRunner | None:
    """Run (or resume) one run to its end or its next pause; the runner, for what it
    learnt (its session, whether a queued turn waits). `run` and `session` are the
    claim's copies when the claim happened in this process."""
    if run is None or session is None:
        async with resources.db.sessionmaker() as db:
            run = await db.get(Run, run_id)
            session = await db.get(AgentSession, run.session_id) if run else None
    if run is None or session is None or run.status != RunStatus.RUNNING:
        return None
    runner = TurnRunner(resources, run, session)
    resources.events.open(run_id, run.last_event_seq)
    try:
        if run.kind == RunKind.COMPACT:
            runner.state.compaction = await layers.run_manual(runner, run.params.instructions)
            await runner.finish(RunStatus.COMPLETED)
        else:
            await runner.turn()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        await runner.stop_cancelled(cancel_reason(run_id))
    except RunFailed as exc:
        await runner.finish(RunStatus.FAILED, exc.error)
    except ModelError as exc:
        await runner.finish(
            RunStatus.FAILED,
            {
                "type": "upstream_error",
                "message": f"The model API failed ({exc.kind}): {exc.message}",
                **({"request_id": exc.request_id} if exc.request_id else {}),
            },
        )
    except Exception:
        log.exception("run %s failed unexpectedly", run_id)
        await runner.finish(
            RunStatus.FAILED,
            {"type": "internal", "message": "The run failed because of an internal error"},
        )
    finally:
        await resources.events.close(run_id)
    return runner
