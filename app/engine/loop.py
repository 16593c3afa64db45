"""The agent loop of one run (ARCHITECTURE.md, "The turn").

    view -> (compaction layers) -> normalised request -> stream the model
    -> store the assistant message -> run the tools -> store their results -> repeat

No database transaction is held across a model call or a tool call (invariant 5):
every step opens its own short transaction, and a finished step is stored before the
events that report it are sent.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.context.tools import READ_ONLY_TOOLS, client_tool_names
from app.context.types import Node
from app.conversation import store
from app.conversation.files import DbWorkspace
from app.conversation.payloads import message_payload, result_events, run_json
from app.engine import compaction
from app.engine.events import runs_t
from app.engine.llm.errors import ModelError, PromptTooLong
from app.engine.llm.events import (
    MessageDone,
    MessageStart,
    TextDelta,
    ThinkingDelta,
    ToolUseReady,
)
from app.engine.llm.retry import backoff_delay
from app.engine.requests import build_body
from app.engine.runs import (
    CANCELLED_TOOL_TEXT,
    INTERRUPTED_TOOL_TEXT,
    answer_open_tool_uses,
    now,
)
from app.engine.tools.builtin import run_builtin, truncate_middle
from app.errors import RunFailed, UpstreamError
from app.models import AgentSession, Run

log = logging.getLogger("parley.agent")

CONTINUE_TEXT = (
    "Output token limit hit. Resume directly from where you stopped, with no apology and "
    "no recap of what you were doing."
)
TRUNCATED_TOOL_TEXT = (
    "The input of this tool call was cut off by the output token limit, so the tool did not "
    "run. Call it again with a shorter input."
)
USAGE_COUNTERS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


@dataclass
class Partial:
    """What a model response has produced so far (kept if the run is cancelled)."""

    uuid: uuid.UUID
    texts: dict[int, list[str]] = field(default_factory=dict)
    tool_uses: dict[int, dict[str, Any]] = field(default_factory=dict)

    def content(self) -> list[dict[str, Any]]:
        blocks: dict[int, dict[str, Any]] = {
            i: {"type": "text", "text": "".join(chunks)} for i, chunks in self.texts.items()
        }
        blocks.update(self.tool_uses)
        return [
            blocks[i]
            for i in sorted(blocks)
            if blocks[i].get("type") != "text" or blocks[i]["text"].strip()
        ]


class TurnRunner:
    def __init__(self, rt: Any, run: Run, session: AgentSession) -> None:
        self.rt = rt
        self.settings = rt.settings
        self.run_id = run.id
        self.kind = run.kind
        self.session_id = session.id
        self.session = session
        self.head: uuid.UUID | None = session.head_uuid
        self.state: dict[str, Any] = dict(run.state or {})
        self.model_calls = int(self.state.get("model_calls", 0))
        self.partial: Partial | None = None
        self.pending_results: dict[str, dict[str, Any]] = {}
        self.run_usage: dict[str, int] = dict(run.usage or {})
        self.fresh_session = True
        self.params: dict[str, Any] = dict(run.params or {})
        self.queued_next = True  # until `finish` has looked

    # --- events --------------------------------------------------------------------

    async def emit(self, event: str, data: Any) -> None:
        await self.rt.events.emit(self.run_id, event, data)

    def emit_nowait(self, event: str, data: Any) -> None:
        self.rt.events.emit_nowait(self.run_id, event, data)

    # --- the loop ------------------------------------------------------------------

    async def turn(self) -> None:
        """The loop. `run.started` and the user's message were reported when the run was
        claimed (and tool results when they were submitted), in those transactions."""
        continuations = 0
        reactive_tried = False
        while True:
            if self.model_calls >= self.settings.max_model_calls_per_run:
                raise RunFailed(
                    "model_call_limit",
                    f"The run reached its limit of {self.settings.max_model_calls_per_run} "
                    "model calls (PARLEY_MAX_MODEL_CALLS_PER_RUN) and was stopped",
                )
            session, nodes = await self.prepare()
            body = build_body(session, nodes)
            try:
                msg_uuid, done = await self.call_model(body)
            except PromptTooLong as exc:
                if reactive_tried:
                    raise RunFailed(
                        "context_overflow",
                        f"The conversation is still too long after compaction: {exc.message}",
                        exc.request_id,
                    ) from exc
                reactive_tried = True
                await compaction.reactive(self, exc)
                continue
            reactive_tried = False
            await self.store_assistant(msg_uuid, done)
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
        await self.finish("completed")

    async def prepare(self) -> tuple[AgentSession, list[Node]]:
        """The session as it is now (the claim's copy on the first call: settings can be
        patched during a run) and the view the next request is built from."""
        if self.fresh_session:
            self.fresh_session = False
        else:
            async with self.rt.db.sessionmaker() as db:
                session = await db.get(AgentSession, self.session_id)
                assert session is not None
                self.session = session
        nodes = await compaction.before_request(self, self.session)
        return self.session, nodes

    async def call_model(self, body: dict[str, Any]) -> tuple[uuid.UUID, MessageDone]:
        """Stream one response, retrying faults with backoff; a response that broke
        mid-way is announced as discarded so clients drop what they showed."""
        attempt = 0
        while True:
            msg_uuid = uuid.uuid4()
            key = str(msg_uuid)
            partial = self.partial = Partial(msg_uuid)
            started = False
            try:
                done: MessageDone | None = None
                async for event in self.rt.llm.stream(body):
                    if isinstance(event, TextDelta):
                        partial.texts.setdefault(event.index, []).append(event.text)
                        self.emit_nowait(
                            "text.delta",
                            {"message_uuid": key, "index": event.index, "text": event.text},
                        )
                    elif isinstance(event, ThinkingDelta):
                        self.emit_nowait(
                            "thinking.delta",
                            {"message_uuid": key, "index": event.index, "thinking": event.thinking},
                        )
                    elif isinstance(event, ToolUseReady):
                        partial.tool_uses[event.index] = event.block
                        self.emit_nowait(
                            "tool_use",
                            {
                                "message_uuid": key,
                                "id": event.block["id"],
                                "name": event.block["name"],
                                "input": event.block["input"],
                            },
                        )
                    elif isinstance(event, MessageStart):
                        started = True
                        self.emit_nowait(
                            "message.started",
                            {"uuid": key, "role": "assistant", "model": event.model},
                        )
                    elif isinstance(event, MessageDone):
                        done = event
                if done is None:
                    raise ModelError(
                        kind="stream_broken",
                        message="The model stream ended early",
                        status=None,
                        request_id=None,
                        retry_after=None,
                        retryable=True,
                    )
                metrics.model_calls.labels("ok").inc()
                self.model_calls += 1
                return msg_uuid, done
            except PromptTooLong:
                metrics.model_calls.labels("prompt_too_long").inc()
                self.model_calls += 1
                raise
            except ModelError as exc:
                metrics.model_calls.labels(exc.kind).inc()
                self.model_calls += 1
                if started or partial.texts or partial.tool_uses:
                    await self.emit("message.discarded", {"uuid": key, "reason": exc.message})
                self.partial = None
                if not exc.retryable or attempt >= self.settings.max_retries:
                    raise
                delay = backoff_delay(
                    attempt,
                    base=self.settings.retry_base_seconds,
                    cap=self.settings.retry_max_seconds,
                    retry_after=exc.retry_after,
                )
                log.warning(
                    "model call failed (%s), retry %d in %.2fs", exc.kind, attempt + 1, delay
                )
                attempt += 1
                await asyncio.sleep(delay)

    # --- storing -------------------------------------------------------------------

    async def store_assistant(self, msg_uuid: uuid.UUID, done: MessageDone) -> dict[str, Any]:
        usage = {key: int(value) for key, value in done.usage.items() if isinstance(value, int)}
        for key, value in usage.items():
            self.run_usage[key] = self.run_usage.get(key, 0) + value
        counters = {name: store.sessions_t.c[name] + usage.get(name, 0) for name in USAGE_COUNTERS}
        async with self.rt.events.step(self.run_id) as step:
            row = await store.append(
                step.db,
                self.session_id,
                parent_uuid=self.head,
                message_uuid=msg_uuid,
                type="assistant",
                role="assistant",
                content=done.content,
                model=done.model,
                stop_reason=done.stop_reason,
                usage=usage,
                run_id=self.run_id,
                session_values={**counters, "last_request_at": now()},
            )
            step.run_values.update(
                usage=self.run_usage, state={**self.state, "model_calls": self.model_calls}
            )
            step.add("message.completed", message_payload(row))
        for kind, value in usage.items():
            metrics.model_tokens.labels(kind).inc(value)
        self.partial = None
        self.head = msg_uuid
        return row

    async def store_user(
        self, content: list[dict[str, Any]], *, is_meta: bool = False
    ) -> dict[str, Any]:
        async with self.rt.events.step(self.run_id) as step:
            row = await store.append(
                step.db,
                self.session_id,
                parent_uuid=self.head,
                type="user",
                role="user",
                content=content,
                is_meta=is_meta,
                run_id=self.run_id,
            )
            step.add("message.completed", message_payload(row))
        self.head = row["uuid"]
        return row

    # --- tools ---------------------------------------------------------------------

    async def run_tools(self, uses: list[dict[str, Any]], truncated: set[str]) -> bool:
        """Run the tools of one response; True when the run pauses for client tools."""
        session = self.session
        builtin = set(session.builtin_tools or [])
        client = client_tool_names(session.tools or [])
        results: dict[str, dict[str, Any]] = {}
        to_run: list[dict[str, Any]] = []
        waiting: list[dict[str, Any]] = []
        for use in uses:
            if use["id"] in truncated:
                results[use["id"]] = {"content": TRUNCATED_TOOL_TEXT, "is_error": True}
            elif use["name"] in builtin:
                to_run.append(use)
            elif use["name"] in client:
                waiting.append(use)
            else:
                results[use["id"]] = {
                    "content": f"Unknown tool {use['name']!r}: it is not available in this session",
                    "is_error": True,
                }
        self.pending_results = results
        await self.run_builtins(to_run, results)
        if waiting:
            await self.pause(waiting, results)
            return True
        blocks = [
            {
                "type": "tool_result",
                "tool_use_id": use["id"],
                "content": results[use["id"]]["content"],
                "is_error": results[use["id"]]["is_error"],
            }
            for use in uses
        ]
        async with self.rt.events.step(self.run_id) as step:
            row = await store.append(
                step.db,
                self.session_id,
                parent_uuid=self.head,
                type="user",
                role="user",
                content=blocks,
                run_id=self.run_id,
            )
            for event, data in result_events(row):
                step.add(event, data)
        self.head = row["uuid"]
        self.pending_results = {}
        return False

    async def run_builtins(
        self, uses: list[dict[str, Any]], results: dict[str, dict[str, Any]]
    ) -> None:
        """Consecutive read-only tools run concurrently; a writing tool runs alone, in order."""
        batch: list[dict[str, Any]] = []
        for use in [*uses, None]:
            if use is not None and use["name"] in READ_ONLY_TOOLS:
                batch.append(use)
                continue
            if batch:
                outcomes = await asyncio.gather(*(self.run_one(u) for u in batch))
                results.update(zip((u["id"] for u in batch), outcomes, strict=True))
                batch = []
            if use is not None:
                results[use["id"]] = await self.run_one(use)

    async def run_one(self, use: dict[str, Any]) -> dict[str, Any]:
        async with self.rt.db.transaction() as db:
            outcome = await run_builtin(use["name"], use["input"], DbWorkspace(db, self.session_id))
        metrics.tool_calls.labels(use["name"], str(outcome.is_error).lower()).inc()
        content = truncate_middle(outcome.content, self.settings.tool_result_max_chars)
        return {"content": content, "is_error": outcome.is_error}

    async def pause(
        self, waiting: list[dict[str, Any]], results: dict[str, dict[str, Any]]
    ) -> None:
        # While paused the lease is the deadline for the client's answer (then `expired`).
        deadline = now() + timedelta(seconds=self.settings.requires_action_ttl_seconds)
        required = {
            "type": "tool_results",
            "tool_uses": [{"id": u["id"], "name": u["name"], "input": u["input"]} for u in waiting],
        }
        async with self.rt.events.step(self.run_id) as step:
            run = await self.update_run(
                step.db,
                status="requires_action",
                required_action=required,
                state={**self.state, "results": results, "model_calls": self.model_calls},
                lease_expires_at=deadline,
                worker_id=None,
            )
            assert run is not None
            step.add("run.requires_action", run_json(run))
        self.pending_results = {}

    async def update_run(self, db: AsyncSession, **values: Any) -> Any:
        """Set `values` on this run while it is still running; its row, or None when it
        was finished elsewhere meanwhile."""
        result = await db.execute(
            update(runs_t)
            .where(runs_t.c.id == self.run_id, runs_t.c.status == "running")
            .values(**values)
            .returning(*runs_t.c)
        )
        return result.first()

    # --- ending --------------------------------------------------------------------

    async def finish(self, status: str, error: dict[str, Any] | None = None) -> bool:
        """Mark the run finished (unless someone else already did) and report it."""
        async with self.rt.events.step(self.run_id) as step:
            run = await self.update_run(
                step.db,
                status=status,
                error=error,
                finished_at=now(),
                lease_expires_at=None,
                required_action=None,
                state={**self.state, "model_calls": self.model_calls},
            )
            if run is not None:
                step.add(f"run.{status}", run_json(run))
                # Whether a queued turn waits for this session (it starts right after).
                self.queued_next = (
                    await step.db.scalar(
                        select(runs_t.c.id)
                        .where(runs_t.c.session_id == self.session_id, runs_t.c.status == "queued")
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
        `interrupted` when the server is shutting down)."""
        if reason == "external":
            return  # finished elsewhere (another replica cancelled or reaped it)
        partial, self.partial = self.partial, None
        async with self.rt.events.step(self.run_id) as step:
            db = step.db
            run = await db.get(Run, self.run_id)
            session = await db.get(AgentSession, self.session_id)
            if run is None or session is None or run.status != "running":
                return
            stored = []
            if partial is not None and partial.content():
                stored.append(
                    await store.append(
                        db,
                        self.session_id,
                        parent_uuid=self.head,
                        message_uuid=partial.uuid,
                        type="assistant",
                        role="assistant",
                        subtype="interrupted",
                        content=partial.content(),
                        model=session.model,
                        run_id=self.run_id,
                    )
                )
                await db.flush()
                await db.refresh(session)
            placeholder = INTERRUPTED_TOOL_TEXT if reason == "shutdown" else CANCELLED_TOOL_TEXT
            answered = await answer_open_tool_uses(
                db, session, run, placeholder, self.pending_results
            )
            if answered:
                stored.append(answered)
            for row in stored:
                step.add("message.completed", message_payload(row))
        if reason == "shutdown":
            await self.finish(
                "failed",
                {
                    "type": "interrupted",
                    "message": "The server shut down during the run; post again to continue",
                },
            )
        else:
            await self.finish("cancelled")


async def execute(
    rt: Any, run_id: uuid.UUID, run: Run | None = None, session: AgentSession | None = None
) -> TurnRunner | None:
    """Run (or resume) one run to its end or its next pause; the runner, for what it
    learnt (its session, whether a queued turn waits). `run` and `session` are the
    claim's copies when the claim happened in this process."""
    if run is None or session is None:
        async with rt.db.sessionmaker() as db:
            run = await db.get(Run, run_id)
            session = await db.get(AgentSession, run.session_id) if run else None
    if run is None or session is None or run.status != "running":
        return None
    runner = TurnRunner(rt, run, session)
    rt.events.open(run_id, run.last_event_seq)
    try:
        if run.kind == "compact":
            await compaction.run_manual(runner)
        else:
            await runner.turn()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        await runner.stop_cancelled(rt.runs.cancel_reason(run_id))
    except RunFailed as exc:
        await runner.finish("failed", exc.error)
    except ModelError as exc:
        await runner.finish(
            "failed",
            {
                "type": "upstream_error",
                "message": f"The model API failed ({exc.kind}): {exc.message}",
                **({"request_id": exc.request_id} if exc.request_id else {}),
            },
        )
    except UpstreamError as exc:
        await runner.finish("failed", {"type": "upstream_error", "message": str(exc.detail)})
    except Exception:
        log.exception("run %s failed unexpectedly", run_id)
        await runner.finish(
            "failed", {"type": "internal", "message": "The run failed because of an internal error"}
        )
    finally:
        await rt.events.close(run_id)
    return runner
