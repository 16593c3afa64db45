"""The layers before each model request (micro-compaction, collapse, auto-compaction),
reactive compaction after "prompt is too long", and the manual compaction run."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

from sqlalchemy import update

from app.context.cache import cache_cold
from app.context.compaction import NothingToCompact, NothingToGain
from app.context.estimates import anchored_estimate
from app.context.limits import Limits, max_tokens_of
from app.context.micro import plan_micro
from app.context.types import Node
from app.conversation import marks
from app.conversation.views import ViewMemos
from app.domain import CompactionOutcome, CompactionTrigger
from app.engine.compaction.compact import compact, current_view
from app.engine.compaction.summary import CompactionFailed
from app.engine.handle import RunHandle
from app.engine.llm.errors import PromptTooLong
from app.errors import RunFailed
from app.models import AgentSession

log = logging.getLogger("parley.compaction")

MAX_CONSECUTIVE_FAILURES = 3


async def before_request(run: RunHandle) -> list[Node]:
    """The view the next request is built from, after micro-compaction, collapse and
    (when still over the threshold) auto-compaction. The estimate that decides is the
    figure of the view as projected now (`anchored_estimate`: a projection since the
    last reply is taken off its anchor)."""
    resources, session = run.resources, run.session
    limits = Limits.of(run.config)
    settings = limits.compaction
    view = await current_view(run)
    memos = resources.views.memo(session.id) or ViewMemos()
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
            memo=memos.scan,
        )
        if planned is not None:
            await before_writing(run)
            async with resources.db.transaction() as db:
                anchor = uuid.UUID(view.nodes[planned.watermark].uuid)
                await marks.add_watermark(db, session.id, anchor, planned.tokens_freed)
            resources.views.forget_marks(session.id)  # the run's copy of the row is older
            view.watermark = planned.watermark
            view.reproject()
            log.info(
                "micro-compaction cleared %d results (%d tokens)",
                planned.results_cleared,
                planned.tokens_freed,
            )
    estimate = anchored_estimate(run.config, view.projected, memos.tokens)
    pending = [span for span in view.collapses if span.applied_at is None]
    if pending and estimate > settings.collapse_at * limits.auto_compact_threshold:
        applied_at = datetime.now(UTC)
        await before_writing(run)
        async with resources.db.transaction() as db:
            await marks.mark_applied(db, session.id, pending, applied_at)
        resources.views.forget_marks(session.id)
        for span in pending:
            span.applied_at = applied_at
        view.reproject()
        estimate = anchored_estimate(run.config, view.projected, memos.tokens)
    if estimate > limits.auto_compact_threshold and should_auto_compact(run, estimate):
        try:
            await compact(run, CompactionTrigger.AUTO, pre_tokens=estimate)
        except NothingToGain as exc:
            # Not worth a summary now: try again once the view has grown by the saving.
            retry_at = int(estimate * (1 + resources.settings.compaction_min_saving)) + 1
            resources.compaction_skips.skip(session.id, retry_at)
            log.info("auto-compaction skipped until %d tokens: %s", retry_at, exc)
            check_fits(run, estimate, exc)
        except (NothingToCompact, CompactionFailed) as exc:
            await count_failure(run)
            log.warning("auto-compaction failed: %s", exc)
            check_fits(run, estimate, exc)
        view = await current_view(run)
    return view.projected


async def before_writing(run: RunHandle) -> None:
    """Before a write of the run outside its steps, which changes the session row: wait
    until the run's claim is stored (a run launched while its claim is sent may not act
    for a turn that does not exist yet; `LostOwnership` when it never will), and forget
    the row kept in memory (`session_rows`)."""
    await run.resources.events.ready(run.run_id)
    run.resources.session_rows.forget(run.session.id)


def should_auto_compact(run: RunHandle, estimate: int) -> bool:
    """Auto-compaction is on, has not failed three times in a row, and was not found
    worthless at a figure this one has not yet outgrown."""
    if not run.config.compaction.auto:
        return False
    if run.session.compact_failures >= MAX_CONSECUTIVE_FAILURES:
        return False
    retry_at = run.resources.compaction_skips.retry_at(run.session.id)
    return retry_at is None or estimate >= retry_at


def check_fits(run: RunHandle, estimate: int, reason: Exception) -> None:
    """After auto-compaction could not help: fail the run when the request cannot fit."""
    if estimate > Limits.of(run.config).context_window - max_tokens_of(run.config):
        raise RunFailed(
            "context_overflow",
            f"The conversation ({estimate} tokens) no longer fits the context window "
            f"and could not be compacted: {reason}",
        )


async def count_failure(run: RunHandle) -> None:
    """One more failed compaction in a row (three pause auto-compaction)."""
    await before_writing(run)
    async with run.resources.db.transaction() as db:
        await db.execute(
            update(AgentSession)
            .where(AgentSession.id == run.session.id)
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
    except NothingToGain as exc:
        raise RunFailed(
            "context_overflow",
            f"The prompt is too long ({error.tokens} tokens > {error.maximum}) and "
            f"compacting would not shorten it enough: {exc}",
            error.request_id,
        ) from exc
    except (NothingToCompact, CompactionFailed) as exc:
        await count_failure(run)
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
    except NothingToGain as exc:
        figures = {
            "pre_tokens": exc.pre_tokens,
            "post_tokens": exc.post_tokens,
            "min_saving": exc.min_saving,
        }
        raise RunFailed("nothing_to_gain", str(exc), extra=figures) from exc
    except CompactionFailed as exc:
        cause = exc.cause
        raise RunFailed(
            "upstream_error", str(exc), cause.request_id if cause is not None else None
        ) from exc
