"""The layers before each model request (micro-compaction, collapse, auto-compaction),
reactive compaction after "prompt is too long", and the manual compaction run."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import update

from app import metrics
from app.context.micro import plan_micro
from app.context.types import Node
from app.conversation.sessions import Limits
from app.conversation.views import load_view
from app.engine.compaction.compact import NothingToCompact, compact
from app.engine.compaction.estimates import cache_cold, request_estimate
from app.engine.compaction.summary import CompactionFailed
from app.engine.llm.errors import PromptTooLong
from app.engine.requests import max_tokens_of
from app.errors import RunFailed
from app.models import AgentSession, Collapse, MicroWatermark

if TYPE_CHECKING:
    from app.engine.loop import TurnRunner
    from app.engine.runtime import Runtime

log = logging.getLogger("parley.compaction")


MAX_CONSECUTIVE_FAILURES = 3


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
            compactable=view.compactable,
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
            view.watermark = plan.watermark
            view.reproject()
            freed += plan.tokens_freed
            log.info(
                "micro-compaction cleared %d results (%d tokens)",
                plan.results_cleared,
                plan.tokens_freed,
            )
    estimate = request_estimate(session, view, freed)
    pending = [span for span in view.collapses if span.applied_at is None]
    if pending and estimate > settings.collapse_at * limits.auto_compact_threshold:
        applied_at = datetime.now(UTC)
        async with rt.db.transaction() as db:
            await db.execute(
                update(Collapse)
                .where(Collapse.id.in_([span.id for span in pending]))
                .values(applied_at=applied_at)
            )
        for span in pending:
            span.applied_at = applied_at
        view.reproject()
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


async def run_manual(runner: TurnRunner) -> None:
    """A run of kind `compact` (POST /sessions/{id}/compact)."""

    instructions = runner.params.get("instructions")
    try:
        outcome = await compact(runner, runner.session, "manual", instructions=instructions)
    except NothingToCompact as exc:
        raise RunFailed("nothing_to_compact", str(exc)) from exc
    except CompactionFailed as exc:
        cause = exc.cause
        raise RunFailed(
            "upstream_error", str(exc), cause.request_id if cause is not None else None
        ) from exc
    runner.state["compaction"] = outcome.as_dict()
    await runner.finish("completed")
