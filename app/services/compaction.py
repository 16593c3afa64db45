"""The compaction layers around a model request (ARCHITECTURE.md, cheapest first):

1. snip (rows the client marked, left out: a projection, see services.view);
2. micro-compaction: the persisted watermark moves forward in batches worth a cache miss;
3. context collapse: spans summarised in the background after a run, applied once the
   estimate passes `collapse_at` of the threshold;
4. auto-compaction past the threshold: a summary replaces everything before a safe
   cut, recorded as a `compact_boundary` row, a `compact_summary` message, re-attached
   files and verbatim copies of the kept messages (nothing is deleted or re-parented);
5. manual (`POST /compact`, a run of kind `compact`) and 6. reactive (after a
   "prompt is too long" answer) use the same machinery.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from app.context.blocks import is_clean_user_turn
from app.context.collapse import plan_collapse_spans
from app.context.cut import Cut, api_rounds, find_cut
from app.context.micro import plan_micro
from app.context.render import render_for_summary
from app.context.summary_prompt import (
    extract_summary,
    summary_instruction,
    summary_message,
    transcript_request,
)
from app.context.tokens import chars_to_tokens, estimate_content, estimate_system, estimate_tools
from app.context.types import COLLAPSED, COMPACT_BOUNDARY, COMPACT_SUMMARY, Node
from app.errors import Invalid
from app.models import AgentSession, Collapse, File, MicroWatermark, Run, Snip
from app.services import metrics, store
from app.services.llm.errors import ModelError, PromptTooLong
from app.services.llm.events import MessageDone
from app.services.llm.retry import backoff_delay
from app.services.requests import build_body, max_tokens_of, tool_definitions
from app.services.sessions import Limits, estimate_from_rows
from app.services.view import ChainView, compactable_tools, load_view, span_indices

if TYPE_CHECKING:
    from app.services.agent import TurnRunner
    from app.services.runtime import Runtime

log = logging.getLogger("parley.compaction")

MAX_CONSECUTIVE_FAILURES = 3
MAX_PTL_RETRIES = 3
SUMMARY_MAX_TOKENS = 20_000
# Budgets after a compaction, as shares of the threshold and of the view being compacted
# (whichever is smaller, so compacting a short conversation early still shrinks it):
KEEP_SHARE = (0.10, 0.30)  # the newest messages, kept verbatim
FILES_SHARE = (0.08, 0.20)  # re-attached files
MAX_FILES = 5
FILE_TOKENS = 5_000
RECENT_USER_TOKENS = 2_000
RECENT_USER_MESSAGES = 3
SUMMARY_SYSTEM = "You are a helpful AI assistant tasked with summarizing conversations."
COLLAPSE_INSTRUCTION = (
    "Summarise the finished piece of work below in at most five sentences for the "
    "assistant that did it: what was asked, what was done (files, commands, findings), "
    "and the outcome. Plain text, no preamble, call no tools."
)


class NothingToCompact(Exception):
    """No cut point can compact anything without splitting a tool pair."""


class CompactionFailed(Exception):
    def __init__(self, message: str, cause: ModelError | None = None) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass
class CompactionOutcome:
    boundary_uuid: uuid.UUID
    summary_uuid: uuid.UUID
    summary: str
    pre_tokens: int
    post_tokens: int
    messages_compacted: int
    trigger: str

    @property
    def tokens_saved(self) -> int:
        return max(self.pre_tokens - self.post_tokens, 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "boundary_uuid": str(self.boundary_uuid),
            "summary_uuid": str(self.summary_uuid),
            "summary": self.summary,
            "pre_tokens": self.pre_tokens,
            "post_tokens": self.post_tokens,
            "tokens_saved": self.tokens_saved,
            "messages_compacted": self.messages_compacted,
            "trigger": self.trigger,
        }


# --- hooks -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CompactionEvent:
    session_id: uuid.UUID
    trigger: str
    pre_tokens: int
    post_tokens: int | None = None
    summary: str | None = None
    boundary_uuid: uuid.UUID | None = None


class CompactionHooks:
    """Before/after-compaction hooks; subclass and register on `Runtime.compaction_hooks`.
    A hook that raises is logged and never stops a compaction."""

    async def before(self, event: CompactionEvent) -> None:
        return None

    async def after(self, event: CompactionEvent) -> None:
        return None


class WebhookHook(CompactionHooks):
    """POSTs each completed compaction (trigger, tokens, summary) to a URL."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url
        self.timeout = timeout

    async def after(self, event: CompactionEvent) -> None:
        payload = {
            "type": "compaction.completed",
            "session_id": str(event.session_id),
            "trigger": event.trigger,
            "pre_tokens": event.pre_tokens,
            "post_tokens": event.post_tokens,
            "boundary_uuid": str(event.boundary_uuid) if event.boundary_uuid else None,
            "summary": event.summary,
        }
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            response = await client.post(self.url, json=payload)
            response.raise_for_status()


async def _call_hooks(rt: Runtime, stage: str, event: CompactionEvent) -> None:
    for hook in rt.compaction_hooks:
        try:
            await getattr(hook, stage)(event)
        except Exception:
            log.exception("compaction hook %s.%s failed", type(hook).__name__, stage)


# --- estimates -------------------------------------------------------------------------


def view_estimate(session: AgentSession, nodes: list[Node]) -> int:
    """A pure estimate of a request built from `nodes` (system and tools included)."""
    return (
        estimate_system(session.system)
        + estimate_tools(tool_definitions(session))
        + sum(node.token_estimate or estimate_content(node.content) for node in nodes)
    )


def request_estimate(session: AgentSession, view: ChainView, freed: int = 0) -> int:
    """Anchored on the last response's real usage (invariant 8), less what projections
    applied since then free; a pure estimate when the view holds no response."""
    return max(estimate_from_rows(session, view.rows) - freed, 0)


def cache_cold(session: AgentSession, ttl_seconds: float) -> bool:
    if session.last_request_at is None:
        return False
    last = session.last_request_at
    if last.tzinfo is None:
        last = last.replace(tzinfo=UTC)
    return datetime.now(UTC) - last > timedelta(seconds=ttl_seconds)


# --- the layers before each request ---------------------------------------------------


async def before_request(runner: TurnRunner, session: AgentSession) -> list[Node]:
    """The view the next request is built from, after micro-compaction, collapse and
    (when still over the threshold) auto-compaction."""
    rt = runner.rt
    limits = Limits(session, rt.settings)
    settings = limits.compaction
    async with rt.db.sessionmaker() as db:
        view = await load_view(db, session)
    freed = 0
    if settings.micro:
        plan = plan_micro(
            view.nodes,
            watermark=view.watermark,
            compactable=compactable_tools(session),
            keep_recent=settings.keep_recent_tool_results,
            batch_tokens=settings.micro_batch_tokens,
            cache_cold=cache_cold(session, rt.settings.cache_ttl_seconds),
        )
        if plan is not None:
            async with rt.db.transaction() as db:
                db.add(
                    MicroWatermark(
                        session_id=session.id,
                        anchor_uuid=uuid.UUID(view.nodes[plan.watermark].uuid),
                        tokens_freed=plan.tokens_freed,
                    )
                )
                view = await load_view(db, session)
            freed += plan.tokens_freed
            log.info(
                "micro-compaction cleared %d results (%d tokens)",
                plan.results_cleared,
                plan.tokens_freed,
            )
    estimate = request_estimate(session, view, freed)
    pending = [span for span in view.collapses if span.applied_at is None]
    if pending and estimate > settings.collapse_at * limits.auto_compact_threshold:
        async with rt.db.transaction() as db:
            await db.execute(
                update(Collapse)
                .where(Collapse.id.in_([span.id for span in pending]))
                .values(applied_at=datetime.now(UTC))
            )
            view = await load_view(db, session)
        freed += sum(span.tokens_saved for span in pending)
        estimate = request_estimate(session, view, freed)
    if (
        settings.auto
        and estimate > limits.auto_compact_threshold
        and session.compact_failures < MAX_CONSECUTIVE_FAILURES
    ):
        try:
            await compact(runner, session, "auto", pre_tokens=estimate)
        except (NothingToCompact, CompactionFailed) as exc:
            await _count_failure(rt, session.id)
            log.warning("auto-compaction failed: %s", exc)
            if estimate > limits.context_window - max_tokens_of(session):
                from app.services.agent import RunFailed

                raise RunFailed(
                    "context_overflow",
                    f"The conversation ({estimate} tokens) no longer fits the context window "
                    f"and could not be compacted: {exc}",
                ) from exc
        async with rt.db.sessionmaker() as db:
            refreshed = await db.get(AgentSession, session.id)
            assert refreshed is not None
            runner.session = refreshed
            view = await load_view(db, refreshed)
    return view.projected


async def _count_failure(rt: Runtime, session_id: uuid.UUID) -> None:
    async with rt.db.transaction() as db:
        await db.execute(
            update(AgentSession)
            .where(AgentSession.id == session_id)
            .values(compact_failures=AgentSession.compact_failures + 1)
        )
    metrics.compactions.labels("auto", "failed").inc()


async def reactive(runner: TurnRunner, error: PromptTooLong) -> None:
    """The model said the prompt is too long: compact now and let the caller retry once."""
    from app.services.agent import RunFailed

    session = runner.session
    # Size the result for the limit the API just reported, not only for our threshold.
    threshold = Limits(session, runner.rt.settings).auto_compact_threshold
    if error.maximum:
        threshold = min(threshold, int(0.8 * error.maximum))
    try:
        await compact(
            runner, session, "reactive", pre_tokens=error.tokens or None, threshold=threshold
        )
    except (NothingToCompact, CompactionFailed) as exc:
        await _count_failure(runner.rt, session.id)
        raise RunFailed(
            "context_overflow",
            f"The prompt is too long ({error.tokens} tokens > {error.maximum}) and the "
            f"conversation could not be compacted: {exc}",
            error.request_id,
        ) from exc


async def run_manual(runner: TurnRunner, *, first_start: bool) -> None:
    """A run of kind `compact` (POST /sessions/{id}/compact)."""
    from app.services.agent import RunFailed

    if first_start:
        await runner.emit_run("run.started")
    async with runner.rt.db.sessionmaker() as db:
        run = await db.get(Run, runner.run_id)
        session = await db.get(AgentSession, runner.session_id)
    assert run is not None
    assert session is not None
    runner.session = session
    instructions = (run.params or {}).get("instructions")
    try:
        outcome = await compact(runner, session, "manual", instructions=instructions)
    except NothingToCompact as exc:
        raise RunFailed("nothing_to_compact", str(exc)) from exc
    except CompactionFailed as exc:
        cause = exc.cause
        raise RunFailed(
            "upstream_error", str(exc), cause.request_id if cause is not None else None
        ) from exc
    runner.state["compaction"] = outcome.as_dict()
    await runner.finish("completed")


# --- compaction itself ---------------------------------------------------------------


@dataclass
class _Plan:
    view: ChainView
    nodes: list[Node]  # the projected view: what the model last saw
    cut: Cut
    kept_from: int  # index in view.nodes (raw) of the first kept row
    files: list[tuple[str, str]] = field(default_factory=list)


def budget(shares: tuple[float, float], threshold: int, view_tokens: int) -> int:
    return int(min(shares[0] * threshold, shares[1] * view_tokens))


def plan_compaction(session: AgentSession, view: ChainView, threshold: int) -> _Plan:
    nodes = view.projected
    cut = find_cut(nodes, budget(KEEP_SHARE, threshold, view_estimate(session, nodes)))
    if cut is None:
        raise NothingToCompact(
            "Nothing can be compacted without splitting a tool call from its result"
        )
    raw_index = {node.uuid: i for i, node in enumerate(view.nodes)}
    if cut.index >= len(nodes):
        kept_from = len(view.nodes)
    else:
        first = nodes[cut.index]
        if first.subtype == COLLAPSED:
            span = next(s for s in view.collapses if str(s.id) == first.uuid)
            kept_from = raw_index[str(span.start_uuid)]
        else:
            kept_from = raw_index[first.uuid]
    return _Plan(view=view, nodes=nodes, cut=cut, kept_from=kept_from)


async def precheck(db: AsyncSession, session: AgentSession, rt: Runtime) -> None:
    """422 before starting a manual compaction that could not do anything."""
    view = await load_view(db, session)
    try:
        plan_compaction(session, view, Limits(session, rt.settings).auto_compact_threshold)
    except NothingToCompact as exc:
        raise Invalid(str(exc)) from exc


async def compact(
    runner: TurnRunner,
    session: AgentSession,
    trigger: str,
    *,
    instructions: str | None = None,
    pre_tokens: int | None = None,
    threshold: int | None = None,
) -> CompactionOutcome:
    rt = runner.rt
    threshold = threshold or Limits(session, rt.settings).auto_compact_threshold
    async with rt.db.sessionmaker() as db:
        view = await load_view(db, session)
    plan = plan_compaction(session, view, threshold)
    pre = pre_tokens or request_estimate(session, view)
    await runner.emit("compaction.started", {"trigger": trigger, "pre_tokens": pre})
    await _call_hooks(rt, "before", CompactionEvent(session.id, trigger, pre))
    try:
        summary = await summarise(runner, session, plan, instructions)
    except CompactionFailed:
        metrics.compactions.labels(trigger, "failed").inc()
        raise
    outcome = await store_compaction(
        runner,
        session,
        plan,
        summary,
        trigger=trigger,
        pre_tokens=pre,
        instructions=instructions,
        threshold=threshold,
    )
    await runner.emit(
        "compaction.completed",
        {
            "boundary_uuid": str(outcome.boundary_uuid),
            "summary_uuid": str(outcome.summary_uuid),
            "pre_tokens": outcome.pre_tokens,
            "post_tokens": outcome.post_tokens,
        },
    )
    metrics.compactions.labels(trigger, "ok").inc()
    await _call_hooks(
        rt,
        "after",
        CompactionEvent(
            session.id, trigger, pre, outcome.post_tokens, outcome.summary, outcome.boundary_uuid
        ),
    )
    return outcome


async def summarise(
    runner: TurnRunner, session: AgentSession, plan: _Plan, instructions: str | None
) -> str:
    """Ask the model for the summary. By default the request is the conversation as the
    model last saw it plus one final instruction, so its prefix is read from the prompt
    cache; when that cannot work (too long, cache cold, another model) the compacted
    messages are rendered to text, and if that is still too long the oldest API rounds
    are dropped, up to MAX_PTL_RETRIES times."""
    rt = runner.rt
    settings = rt.settings
    model = settings.compaction_model or session.model
    limits = Limits(session, settings)
    max_tokens = min(SUMMARY_MAX_TOKENS, limits.max_output_tokens)
    instruction = summary_instruction(instructions)
    fits = (
        view_estimate(session, plan.nodes) + chars_to_tokens(len(instruction)) + max_tokens
        <= limits.context_window
    )
    warm = not cache_cold(session, settings.cache_ttl_seconds)
    if model == session.model and fits and warm:
        nodes = [*plan.nodes, _text_node(instruction)]
        body = build_body(session, nodes, thinking=False)
        body["max_tokens"] = max_tokens
        try:
            return await _summary_from(rt, body)
        except PromptTooLong:
            log.info("cached-prefix summary request too long; rendering to text")
    compacted = plan.nodes[: plan.cut.index]
    rounds = api_rounds(compacted)
    for attempt in range(MAX_PTL_RETRIES + 1):
        start = rounds[attempt][0] if attempt < len(rounds) and attempt else 0
        if attempt and attempt >= len(rounds):
            break
        transcript = render_for_summary(compacted[start:])
        if start:
            transcript = f"[{start} earlier messages omitted]\n{transcript}"
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "system": [{"type": "text", "text": SUMMARY_SYSTEM}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": transcript_request(transcript, instructions)}
                    ],
                }
            ],
        }
        try:
            return await _summary_from(rt, body)
        except PromptTooLong:
            log.info("summary request too long; dropping the oldest API round (%d)", attempt + 1)
    raise CompactionFailed("The summary request stayed too long after dropping old rounds")


def _text_node(text: str) -> Node:
    content = [{"type": "text", "text": text}]
    return Node(
        uuid=str(uuid.uuid4()),
        type="user",
        role="user",
        content=content,
        token_estimate=estimate_content(content),
    )


async def _summary_from(rt: Runtime, body: dict[str, Any]) -> str:
    done = await complete(rt, body)
    text = "".join(b.get("text", "") for b in done.content if b.get("type") == "text")
    summary = extract_summary(text)
    if not summary:
        raise CompactionFailed("The model returned an empty summary")
    return summary


async def complete(rt: Runtime, body: dict[str, Any]) -> MessageDone:
    """One model response, with the same retry policy as turns, reporting no events."""
    settings = rt.settings
    attempt = 0
    while True:
        try:
            done: MessageDone | None = None
            async for event in rt.llm.stream(body):
                if isinstance(event, MessageDone):
                    done = event
            if done is None:
                raise CompactionFailed("The model stream ended early")
            return done
        except PromptTooLong:
            raise
        except ModelError as exc:
            if not exc.retryable or attempt >= settings.max_retries:
                raise CompactionFailed(f"The summary request failed: {exc.message}", exc) from exc
            await asyncio.sleep(
                backoff_delay(
                    attempt,
                    base=settings.retry_base_seconds,
                    cap=settings.retry_max_seconds,
                    retry_after=exc.retry_after,
                )
            )
            attempt += 1


def recent_user_messages(nodes: list[Node]) -> list[str]:
    """The newest user prompts of the compacted part, verbatim, within a budget."""
    picked: list[str] = []
    budget = RECENT_USER_TOKENS
    for node in reversed(nodes):
        if len(picked) >= RECENT_USER_MESSAGES:
            break
        if not is_clean_user_turn(node) or node.subtype:
            continue
        text = "\n".join(b.get("text", "") for b in node.content if b.get("type") == "text")
        cost = chars_to_tokens(len(text))
        if not text.strip() or cost > budget:
            continue
        budget -= cost
        picked.append(text)
    return list(reversed(picked))


def files_to_reattach(compacted: list[Node], kept: list[Node]) -> list[str]:
    """Up to MAX_FILES paths read most recently in the compacted part and not still
    visible in the kept part (newest first)."""
    visible = {path for path in _read_paths(kept)}
    paths: list[str] = []
    for path in reversed(_read_paths(compacted)):
        if path not in visible and path not in paths:
            paths.append(path)
        if len(paths) >= MAX_FILES:
            break
    return paths


def _read_paths(nodes: list[Node]) -> list[str]:
    paths = []
    for node in nodes:
        if node.role != "assistant":
            continue
        for block in node.content:
            if block.get("type") == "tool_use" and block.get("name") == "Read":
                path = (block.get("input") or {}).get("file_path")
                if isinstance(path, str):
                    paths.append(path.lstrip("/"))
    return paths


async def _attachments(
    db: AsyncSession, session_id: uuid.UUID, paths: list[str], budget_tokens: int
) -> list[list[dict[str, Any]]]:
    """The current content of each file, trimmed to FILE_TOKENS and to the budget."""
    out: list[list[dict[str, Any]]] = []
    for path in paths:
        row = await db.get(File, (session_id, path))
        if row is None:
            continue
        try:
            text = row.content.decode()
        except UnicodeDecodeError:
            continue
        limit_chars = int(min(FILE_TOKENS, budget_tokens) * 2.8)
        if limit_chars < 200:
            break
        if len(text) > limit_chars:
            text = text[:limit_chars] + f"\n[... file truncated; {len(row.content)} bytes in all]"
        content = [
            {
                "type": "text",
                "text": (
                    f"Contents of {path}, re-attached after the conversation was compacted "
                    f"(the file as it is now):\n\n{text}"
                ),
            }
        ]
        budget_tokens -= estimate_content(content)
        out.append(content)
    return out


async def store_compaction(
    runner: TurnRunner,
    session: AgentSession,
    plan: _Plan,
    summary: str,
    *,
    trigger: str,
    pre_tokens: int,
    instructions: str | None,
    threshold: int,
) -> CompactionOutcome:
    """Append the boundary, the summary, re-attached files and copies of the kept rows
    (invariant 1: nothing rewritten, nothing re-parented)."""
    rt = runner.rt
    view = plan.view
    compacted = plan.nodes[: plan.cut.index]
    kept_rows = view.rows[plan.kept_from :]
    covered = view.rows[: plan.kept_from]
    last_covered = covered[-1].uuid if covered else None
    recent = recent_user_messages(compacted)
    text = summary_message(summary, recent, continue_work=trigger != "manual")
    async with rt.db.transaction() as db:
        current = await db.get(AgentSession, session.id)
        assert current is not None
        boundary_id, summary_id = uuid.uuid4(), uuid.uuid4()
        files = await _attachments(
            db,
            session.id,
            files_to_reattach(compacted, plan.nodes[plan.cut.index :]),
            budget(FILES_SHARE, threshold, view_estimate(session, plan.nodes)),
        )
        specs: list[dict[str, Any]] = [
            {
                "message_uuid": boundary_id,
                "parent_uuid": None,
                "type": "system",
                "subtype": COMPACT_BOUNDARY,
                "role": None,
                "content": [],
                "logical_parent_uuid": last_covered,
                "run_id": runner.run_id,
            },
            {
                "message_uuid": summary_id,
                "parent_uuid": boundary_id,
                "type": "user",
                "subtype": COMPACT_SUMMARY,
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "run_id": runner.run_id,
            },
        ]
        parent = summary_id
        for content in files:
            file_id = uuid.uuid4()
            specs.append(
                {
                    "message_uuid": file_id,
                    "parent_uuid": parent,
                    "type": "attachment",
                    "subtype": "file",
                    "role": "user",
                    "content": content,
                    "is_meta": True,
                    "run_id": runner.run_id,
                }
            )
            parent = file_id
        copies: dict[uuid.UUID, uuid.UUID] = {}
        for row in kept_rows:
            copy_id = uuid.uuid4()
            copies[row.uuid] = copy_id
            specs.append(
                {
                    "message_uuid": copy_id,
                    "parent_uuid": parent,
                    "type": row.type,
                    "subtype": row.subtype,
                    "role": row.role,
                    "content": row.content,
                    "model": row.model,
                    "stop_reason": row.stop_reason,
                    "usage": row.usage,
                    "is_meta": row.is_meta,
                    "copied_from": row.uuid,
                    "meta": row.metadata,
                    "run_id": row.run_id,
                    "token_estimate": row.token_estimate,
                }
            )
            parent = copy_id
        post = view_estimate(
            current,
            [
                _text_node(text),
                *(_text_node(c[0]["text"]) for c in files),
                *plan.nodes[plan.cut.index :],
            ],
        )
        specs[0]["meta"] = {
            "trigger": trigger,
            "pre_tokens": pre_tokens,
            "post_tokens": post,
            "covered": {
                "first_uuid": str(covered[0].uuid) if covered else None,
                "last_uuid": str(last_covered) if last_covered else None,
                "messages": len(covered),
            },
            "kept": len(kept_rows),
            "files": len(files),
            "model": rt.settings.compaction_model or session.model,
            "instructions": instructions,
            "clean_cut": plan.cut.clean,
        }
        rows = await store.append_many(db, session.id, specs)
        await _copy_marks(db, session.id, view, copies)
        await db.execute(
            update(AgentSession).where(AgentSession.id == session.id).values(compact_failures=0)
        )
    runner.head = rows[-1]["uuid"]
    from app.services.agent import message_payload

    for row in rows[: 2 + len(files)]:
        await runner.emit("message.completed", message_payload(row))
    return CompactionOutcome(
        boundary_uuid=boundary_id,
        summary_uuid=summary_id,
        summary=summary,
        pre_tokens=pre_tokens,
        post_tokens=post,
        messages_compacted=len(covered),
        trigger=trigger,
    )


async def _copy_marks(
    db: AsyncSession, session_id: uuid.UUID, view: ChainView, copies: dict[uuid.UUID, uuid.UUID]
) -> None:
    """Snips, the micro watermark and collapses on kept rows follow them to their copies."""
    for snipped in view.snipped:
        original = uuid.UUID(snipped)
        if original in copies:
            db.add(Snip(session_id=session_id, message_uuid=copies[original]))
    if view.watermark is not None:
        anchor = uuid.UUID(view.nodes[view.watermark].uuid)
        if anchor in copies:
            db.add(MicroWatermark(session_id=session_id, anchor_uuid=copies[anchor]))
    for span in view.collapses:
        if span.start_uuid in copies and span.end_uuid in copies:
            db.add(
                Collapse(
                    session_id=session_id,
                    start_uuid=copies[span.start_uuid],
                    end_uuid=copies[span.end_uuid],
                    summary=span.summary,
                    tokens_saved=span.tokens_saved,
                    model=span.model,
                    applied_at=span.applied_at,
                )
            )
    await db.flush()


# --- context collapse, in the background after a run -----------------------------------


async def collapse_spans(rt: Runtime, session_id: uuid.UUID, *, max_spans: int = 3) -> int:
    """Summarise older completed spans of the chain into collapse rows (not applied yet).
    Runs only once the session is past half of the collapse point, so short sessions
    never pay for it. Returns how many spans were summarised."""
    async with rt.db.sessionmaker() as db:
        session = await db.get(AgentSession, session_id)
        if session is None:
            return 0
        view = await load_view(db, session)
    limits = Limits(session, rt.settings)
    estimate = request_estimate(session, view)
    if estimate < 0.5 * limits.compaction.collapse_at * limits.auto_compact_threshold:
        return 0
    existing = [(start, end) for start, end, _ in span_indices(view.nodes, view.collapses)]
    spans = plan_collapse_spans(view.nodes, skip=existing)[:max_spans]
    done = 0
    for start, end in spans:
        nodes = view.nodes[start : end + 1]
        body = {
            "model": rt.settings.compaction_model or session.model,
            "max_tokens": 1024,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": (
                                f"{COLLAPSE_INSTRUCTION}\n\n<work>\n{render_for_summary(nodes)}\n</work>"
                            ),
                        }
                    ],
                }
            ],
        }
        try:
            result = await complete(rt, body)
        except (CompactionFailed, ModelError) as exc:
            log.warning("collapse summary failed: %s", exc)
            break
        text = "".join(b.get("text", "") for b in result.content if b.get("type") == "text")
        text = extract_summary(text)
        if not text:
            continue
        saved = sum(n.token_estimate for n in nodes) - chars_to_tokens(len(text)) - 10
        if saved <= 0:
            continue
        async with rt.db.transaction() as db:
            db.add(
                Collapse(
                    session_id=session_id,
                    start_uuid=uuid.UUID(nodes[0].uuid),
                    end_uuid=uuid.UUID(nodes[-1].uuid),
                    summary=text,
                    tokens_saved=saved,
                    model=body["model"],
                )
            )
        done += 1
    return done


# --- the context report ------------------------------------------------------------------


async def context_report(db: AsyncSession, session: AgentSession, rt: Runtime) -> dict[str, Any]:
    limits = Limits(session, rt.settings)
    view = await load_view(db, session)
    estimated = request_estimate(session, view)
    tool_results = 0
    messages = 0
    for node in view.projected:
        for block in node.content:
            tokens = estimate_content([block])
            if block.get("type") == "tool_result":
                tool_results += tokens
            else:
                messages += tokens
    last = None
    if view.rows and view.rows[0].subtype == COMPACT_SUMMARY and view.rows[0].parent_uuid:
        boundary = await store.get_message(db, session.id, view.rows[0].parent_uuid)
        if boundary is not None:
            last = {
                "boundary_uuid": str(boundary.uuid),
                "summary_uuid": str(view.rows[0].uuid),
                "created_at": boundary.created_at.isoformat(),
                **(boundary.metadata or {}),
            }
    return {
        "estimated_tokens": estimated,
        "context_window": limits.context_window,
        "max_output_tokens": limits.max_output_tokens,
        "auto_compact_threshold": limits.auto_compact_threshold,
        "warning_threshold": limits.warning_threshold,
        "percent_used": round(100 * estimated / limits.context_window, 2),
        "breakdown": {
            "system": estimate_system(session.system),
            "tools": estimate_tools(tool_definitions(session)),
            "messages": messages,
            "tool_results": tool_results,
        },
        "last_compaction": last,
    }
