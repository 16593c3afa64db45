"""One compaction: plan a safe cut, get the summary, then append the boundary, the
summary, re-attached files and verbatim copies of the kept messages (invariant 1), with
the events that report them, in one step of the run."""

from __future__ import annotations

import logging
import uuid

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.context.compaction import (
    FILE_TOKENS,
    FILES_SHARE,
    CompactionPlan,
    NothingToCompact,
    budget,
    files_to_reattach,
    plan_compaction,
    recent_user_messages,
)
from app.context.estimates import anchored_estimate, view_estimate
from app.context.limits import Limits
from app.context.summary_prompt import summary_message
from app.context.tokens import CHARS_PER_TOKEN, estimate_content
from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY, Block
from app.conversation import marks
from app.conversation.payloads import message_payload
from app.conversation.records import MessageRecord, new_message
from app.conversation.views import ChainView, load_view
from app.domain import CompactionOutcome, CompactionTrigger
from app.engine.compaction.summary import CompactionFailed, summarise, text_node
from app.engine.handle import RunHandle
from app.engine.hooks import CompactionEvent, call_hooks
from app.models import AgentSession, File

log = logging.getLogger("parley.compaction")


async def current_view(run: RunHandle) -> ChainView:
    resources = run.resources
    async with resources.db.sessionmaker() as db:
        return await load_view(
            db, resources.views, run.session.id, run.head, run.config.compactable
        )


def plan(run: RunHandle, view: ChainView, threshold: int) -> CompactionPlan:
    return plan_compaction(run.config, view.projected, view.nodes, view.collapses, threshold)


async def compact(
    run: RunHandle,
    trigger: CompactionTrigger,
    *,
    instructions: str | None = None,
    pre_tokens: int | None = None,
    threshold: int | None = None,
) -> CompactionOutcome:
    resources, session = run.resources, run.session
    threshold = threshold or Limits.of(run.config).auto_compact_threshold
    try:
        view = await current_view(run)
        planned = plan(run, view, threshold)
        pre = pre_tokens or anchored_estimate(run.config, view.records)
        await run.emit("compaction.started", {"trigger": trigger, "pre_tokens": pre})
        await call_hooks(resources.hooks, "before", CompactionEvent(session.id, trigger, pre))
        summary = await summarise(run, planned, instructions)
    except (NothingToCompact, CompactionFailed):
        metrics.compactions.labels(trigger, "failed").inc()
        raise
    outcome = await store_compaction(
        run,
        view,
        planned,
        summary,
        trigger=trigger,
        pre_tokens=pre,
        instructions=instructions,
        threshold=threshold,
    )
    metrics.compactions.labels(trigger, "ok").inc()
    await call_hooks(
        resources.hooks,
        "after",
        CompactionEvent(
            session.id, trigger, pre, outcome.post_tokens, outcome.summary, outcome.boundary_uuid
        ),
    )
    return outcome


async def _attachments(
    db: AsyncSession, session_id: uuid.UUID, paths: list[str], budget_tokens: int
) -> list[list[Block]]:
    """The current content of each file, trimmed to FILE_TOKENS and to the budget."""
    out: list[list[Block]] = []
    for path in paths:
        row = await db.get(File, (session_id, path))
        if row is None:
            continue
        try:
            text = row.content.decode()
        except UnicodeDecodeError:
            continue
        limit_chars = int(min(FILE_TOKENS, budget_tokens) * CHARS_PER_TOKEN)
        if limit_chars < 200:
            break
        if len(text) > limit_chars:
            text = text[:limit_chars] + f"\n[... file truncated; {len(row.content)} bytes in all]"
        content: list[Block] = [
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
    run: RunHandle,
    view: ChainView,
    planned: CompactionPlan,
    summary: str,
    *,
    trigger: CompactionTrigger,
    pre_tokens: int,
    instructions: str | None,
    threshold: int,
) -> CompactionOutcome:
    """Append the boundary, the summary, re-attached files and copies of the kept rows
    (invariant 1: nothing rewritten, nothing re-parented) and report them, in one step."""
    session_id = run.session.id
    kept_records = view.records[planned.kept_from :]
    covered = view.records[: planned.kept_from]
    last_covered = covered[-1].uuid if covered else None
    text = summary_message(
        summary,
        recent_user_messages(planned.compacted),
        continue_work=trigger != CompactionTrigger.MANUAL,
    )
    async with run.step() as step:
        files = await _attachments(
            step.db,
            session_id,
            files_to_reattach(planned.compacted, planned.kept),
            budget(FILES_SHARE, threshold, view_estimate(run.config, planned.projected)),
        )
        post = view_estimate(
            run.config,
            [text_node(text), *(text_node(c[0]["text"]) for c in files), *planned.kept],
        )
        boundary = new_message(
            session_id=session_id,
            parent_uuid=None,
            type="system",
            subtype=COMPACT_BOUNDARY,
            role=None,
            content=[],
            logical_parent_uuid=last_covered,
            run_id=run.run_id,
            metadata={
                "trigger": trigger,
                "pre_tokens": pre_tokens,
                "post_tokens": post,
                "covered": {
                    "first_uuid": str(covered[0].uuid) if covered else None,
                    "last_uuid": str(last_covered) if last_covered else None,
                    "messages": len(covered),
                },
                "kept": len(kept_records),
                "files": len(files),
                "model": run.resources.settings.compaction_model or run.config.model,
                "instructions": instructions,
                "clean_cut": planned.cut.clean,
            },
        )
        summary_row = new_message(
            session_id=session_id,
            parent_uuid=boundary.uuid,
            type="user",
            subtype=COMPACT_SUMMARY,
            role="user",
            content=[{"type": "text", "text": text}],
            run_id=run.run_id,
        )
        chain: list[MessageRecord] = [boundary, summary_row]
        for content in files:
            chain.append(
                new_message(
                    session_id=session_id,
                    parent_uuid=chain[-1].uuid,
                    type="attachment",
                    subtype="file",
                    role="user",
                    content=content,
                    is_meta=True,
                    run_id=run.run_id,
                )
            )
        reported = len(chain)
        copies: dict[uuid.UUID, uuid.UUID] = {}
        for record in kept_records:
            copy = record.with_(
                uuid=uuid.uuid4(), parent_uuid=chain[-1].uuid, copied_from=record.uuid
            )
            copies[record.uuid] = copy.uuid
            chain.append(copy)
        stored = await step.append(*chain)
        await marks.copy_marks(step.db, session_id, session_id, copies)
        await step.db.execute(
            update(AgentSession).where(AgentSession.id == session_id).values(compact_failures=0)
        )
        for record in stored[:reported]:
            step.report("message.completed", message_payload(record))
        step.report(
            "compaction.completed",
            {
                "boundary_uuid": str(boundary.uuid),
                "summary_uuid": str(summary_row.uuid),
                "pre_tokens": pre_tokens,
                "post_tokens": post,
            },
        )
    return CompactionOutcome(
        boundary_uuid=boundary.uuid,
        summary_uuid=summary_row.uuid,
        summary=summary,
        pre_tokens=pre_tokens,
        post_tokens=post,
        tokens_saved=max(pre_tokens - post, 0),
        messages_compacted=len(covered),
        trigger=trigger,
    )
