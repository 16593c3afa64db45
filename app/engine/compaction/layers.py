"""The layers before each model request (micro-compaction, collapse, auto-compaction),
reactive compaction after "prompt is too long", and the manual compaction run."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

from sqlalchemy import update

from app.context.cache import cache_cold
from app.context.compaction import NothingToCompact
from app.context.estimates import anchored_estimate
from app.context.limits import Limits, max_tokens_of
from app.context.micro import plan_micro
from app.context.types import Node
from app.conversation import marks
from app.conversation.views import ChainView
from app.domain import CompactionOutcome, CompactionTrigger
from app.engine.compaction.compact import compact, current_view
from app.engine.compaction.summary import CompactionFailed
from app.engine.handle import RunHandle
from app.engine.llm.errors import PromptTooLong
from app.engine.resources import Resources
from app.errors import RunFailed
from app.models import AgentSession

log = logging.getLogger("parley.compaction")

MAX_CONSECUTIVE_FAILURES = 3


def request_estimate(run: RunHandle, view: ChainView, freed: int = 0) -> int:
    """Anchored on the last response's real usage (invariant 8), less what projections
    applied since then free."""
    return max(anchored_estimate(run.config, view.records) - freed, 0)


async def before_request(run: RunHandle) -> list[Node]:
    """The view the next request is built from, after micro-compaction, collapse and
    (when still over the threshold) auto-compaction."""
    resources, session = run.resources, run.session
    limits = Limits.of(run.config)
    settings = limits.compaction
    view = await current_view(run)
    freed = 0
    if settings.micro:
        cold = cache_cold(
            session.last_request_at, resources.settings.cache_ttl_seconds, datetime.now(UTC)
        )
        planned = plan_micro(
            view.nodes,
            watermark=view.watermark,
            compactable=view.compactable,
            keep_recent=settings.keep_recent_tool_results,
            batch_tokens=settings.micro_batch_tokens,
            cache_cold=cold,
        )
        if planned is not None:
            async with resources.db.transaction() as db:
                anchor = uuid.UUID(view.nodes[planned.watermark].uuid)
                marks.add_watermark(db, session.id, anchor, planned.tokens_freed)
            view.watermark = planned.watermark
            view.reproject()
            freed += planned.tokens_freed
            log.info(
                "micro-compaction cleared %d results (%d tokens)",
                planned.results_cleared,
                planned.tokens_freed,
            )
    estimate = request_estimate(run, view, freed)
    pending = [span for span in view.collapses if span.applied_at is None]
    if pending and estimate > settings.collapse_at * limits.auto_compact_threshold:
        applied_at = datetime.now(UTC)
        async with resources.db.transaction() as db:
            await marks.mark_applied(db, pending, applied_at)
        for span in pending:
            span.applied_at = applied_at
        view.reproject()
        freed += sum(span.tokens_saved for span in pending)
        estimate = request_estimate(run, view, freed)
    if (
        settings.auto
        and estimate > limits.auto_compact_threshold
        and session.compact_failures < MAX_CONSECUTIVE_FAILURES
    ):
        try:
            await compact(run, CompactionTrigger.AUTO, pre_tokens=estimate)
        except (NothingToCompact, CompactionFailed) as exc:
            await count_failure(resources, session.id)
            log.warning("auto-compaction failed: %s", exc)
            if estimate > limits.context_window - max_tokens_of(run.config):
                raise RunFailed(
                    "context_overflow",
                    f"The conversation ({estimate} tokens) no longer fits the context window "
                    f"and could not be compacted: {exc}",
                ) from exc
        view = await current_view(run)
    return view.projected


async def count_failure(resources: Resources, session_id: uuid.UUID) -> None:
    """One more failed compaction in a row (three pause auto-compaction)."""
    async with resources.db.transaction() as db:
        await db.execute(
            update(AgentSession)
            .where(AgentSession.id == session_id)
            .values(compact_failures=AgentSession.compact_failures + 1)
        )


async def reactive(run: RunHandle, error: PromptTooLong) -> None:
    """The model said the prompt is too long: compact now and let the caller retry once."""
    # Size the result for the limit the API just reported, not only for our threshold.
    threshold = Limits.of(run.config).auto_compact_threshold
    if error.maximum:
        threshold = min(threshold, int(0.8 * error.maximum))
    try:
        await compact(
            run,
            CompactionTrigger.REACTIVE,
            pre_tokens=error.tokens or None,
            threshold=threshold,
        )
    except (NothingToCompact, CompactionFailed) as exc:
        await count_failure(run.resources, run.session.id)
        raise RunFailed(
            "context_overflow",
            f"The prompt is too long ({error.tokens} tokens > {error.maximum}) and the "
            f"conversation could not be compacted: {exc}",
            error.request_id,
        ) from exc


async def run_manual(run: RunHandle, instructions: str | None) -> CompactionOutcome:
    """The body of a run of kind `compact` (POST /sessions/{id}/compact)."""
    try:
        return await compact(run, CompactionTrigger.MANUAL, instructions=instructions)
    except NothingToCompact as exc:
        raise RunFailed("nothing_to_compact", str(exc)) from exc
    except CompactionFailed as exc:
        cause = exc.cause
        raise RunFailed(
            "upstream_error", str(exc), cause.request_id if cause is not None else None
        ) from exc
