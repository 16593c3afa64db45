"""One compaction: plan a safe cut, check it can gain, get the summary, check again,
then append the boundary, the summary, re-attached files and verbatim copies of the kept
messages (invariant 1), with the events that report them, in one step of the run.

The figures are those of requests: `pre_tokens` is the request that would have been
sent (anchored on real usage where the usage measured it), `post_tokens` the one that
will be (estimated: nothing in the new view has been measured yet, and the copies'
usage is dropped so it never anchors). A compaction that would not make the request
smaller by `compaction_min_saving` is refused (`NothingToGain`): before the summary
request when even the smallest summary could not gain, after it otherwise.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.context.cache import cache_cold
from app.context.compaction import (
    FILE_TOKENS,
    FILES_SHARE,
    CompactionPlan,
    NothingToCompact,
    NothingToGain,
    compacted_view,
    gains,
    plan_compaction,
    post_floor,
    quoted_prompts,
    raw_budget,
    settle_kept,
)
from app.context.estimates import anchored_estimate, view_estimate, without_anchor
from app.context.limits import Limits
from app.context.micro import MicroPlan
from app.context.restore import file_from_history, files_to_reattach
from app.context.summary_prompt import summary_message
from app.context.tokens import CHARS_PER_TOKEN, estimate_content
from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY, Block, Node
from app.conversation import marks
from app.conversation.payloads import message_payload
from app.conversation.records import MessageRecord, new_message
from app.conversation.views import ChainView, load_view
from app.domain import CompactionOutcome, CompactionTrigger
from app.engine.compaction.summary import CompactionFailed, summarise
from app.engine.handle import RunHandle
from app.engine.hooks import CompactionEvent, call_hooks
from app.models import AgentSession, File

log = logging.getLogger("parley.compaction")


async def current_view(run: RunHandle) -> ChainView:
    resources = run.resources
    async with resources.db.sessionmaker() as db:
        return await load_view(
            db,
            resources.views,
            run.session.id,
            run.head,
            run.config.compactable,
            marks_version=run.session.marks_version,
        )


def settled_kept(run: RunHandle, planned: CompactionPlan) -> tuple[list[Node], MicroPlan | None]:
    cold = cache_cold(
        run.session.last_request_at, run.resources.settings.cache_ttl_seconds, datetime.now(UTC)
    )
    return settle_kept(run.config, planned.kept, cold=cold)


def plan(run: RunHandle, view: ChainView, threshold: int, pre_tokens: int) -> CompactionPlan:
    return plan_compaction(
        run.config, view.projected, view.nodes, view.collapses, threshold, pre_tokens
    )


@dataclass(frozen=True, slots=True)
class Draft:
    """What a compaction will write besides the summary, known before asking for it."""

    prompts: list[str]  # every prompt of the compacted part (the summary request holds them)
    quoted: list[str]  # the newest of them, quoted verbatim in the summary message
    files: list[list[Block]]  # re-attached files' content

    @property
    def file_texts(self) -> list[str]:
        return [content[0]["text"] for content in self.files]

    def message(self, summary: str, trigger: CompactionTrigger) -> str:
        return summary_message(
            summary, self.quoted, continue_work=trigger != CompactionTrigger.MANUAL
        )


async def draft_for(
    run: RunHandle, view: ChainView, planned: CompactionPlan, threshold: int, pre_tokens: int
) -> Draft:
    prompts, quoted = quoted_prompts(view.nodes, planned)
    async with run.resources.db.sessionmaker() as db:
        files = await attachments(
            db,
            run.session.id,
            files_to_reattach(planned.compacted, planned.kept),
            raw_budget(run.config, FILES_SHARE, threshold, pre_tokens),
            view.nodes,
        )
    return Draft(prompts, quoted, files)


async def compact(
    run: RunHandle,
    trigger: CompactionTrigger,
    *,
    instructions: str | None = None,
    pre_tokens: int | None = None,
    threshold: int | None = None,
) -> CompactionOutcome:
    resources, session = run.resources, run.session
    min_saving = resources.settings.compaction_min_saving
    threshold = threshold or Limits.of(run.config).auto_compact_threshold
    try:
        view = await current_view(run)
        pre = pre_tokens or anchored_estimate(run.config, view.projected)
        planned = plan(run, view, threshold, pre)
        draft = await draft_for(run, view, planned, threshold, pre)
        kept, micro = settled_kept(run, planned)
        continue_work = trigger != CompactionTrigger.MANUAL
        floor = post_floor(
            run.config, kept, draft.quoted, draft.file_texts, continue_work=continue_work
        )
        if not gains(pre, floor, min_saving):
            raise NothingToGain(pre, floor, min_saving)
        await run.emit("compaction.started", {"trigger": trigger, "pre_tokens": pre})
        await call_hooks(resources.hooks, "before", CompactionEvent(session.id, trigger, pre))
        summary = await summarise(run, planned, instructions, draft.prompts)
        text = draft.message(summary, trigger)
        post = view_estimate(run.config, compacted_view(text, draft.file_texts, kept))
        if not gains(pre, post, min_saving):
            raise NothingToGain(pre, post, min_saving)
    except NothingToGain as exc:
        metrics.compactions.labels(trigger, "nothing_to_gain").inc()
        log.info("compaction refused (%s): %s", trigger, exc)
        raise
    except (NothingToCompact, CompactionFailed):
        metrics.compactions.labels(trigger, "failed").inc()
        raise
    outcome = await store_compaction(
        run,
        view,
        planned,
        draft,
        summary,
        text,
        micro,
        trigger=trigger,
        pre_tokens=pre,
        post_tokens=post,
        instructions=instructions,
    )
    resources.compaction_skips.clear(session.id)
    metrics.compactions.labels(trigger, "ok").inc()
    await call_hooks(
        resources.hooks,
        "after",
        CompactionEvent(
            session.id, trigger, pre, outcome.post_tokens, outcome.summary, outcome.boundary_uuid
        ),
    )
    return outcome


def _attachment(path: str, text: str, size: int, limit_chars: int, from_history: bool) -> str:
    if len(text) > limit_chars:
        text = text[:limit_chars] + f"\n[... file truncated; {size} characters in all]"
    origin = (
        "as the conversation last showed it: the workspace does not hold this file"
        if from_history
        else "the file as it is now"
    )
    return (
        f"Contents of {path}, re-attached after the conversation was compacted "
        f"({origin}):\n\n{text}"
    )


async def attachments(
    db: AsyncSession,
    session_id: uuid.UUID,
    paths: list[str],
    budget_tokens: int,
    history: list[Node],
) -> list[list[Block]]:
    """The content of each file, trimmed to FILE_TOKENS and to the budget: the
    workspace's, or when the workspace lacks it (an imported session's paths are the
    source machine's) the content the conversation last showed."""
    out: list[list[Block]] = []
    for path in paths:
        limit_chars = int(min(FILE_TOKENS, budget_tokens) * CHARS_PER_TOKEN)
        if limit_chars < 200:
            break
        row = await db.get(File, (session_id, path))
        text: str | None = None
        if row is not None:
            try:
                text = row.content.decode()
            except UnicodeDecodeError:
                continue
        from_history = text is None
        if text is None:
            text = file_from_history(history, path)
        if text is None:
            continue
        body = _attachment(path, text, len(text), limit_chars, from_history)
        content: list[Block] = [{"type": "text", "text": body}]
        budget_tokens -= estimate_content(content)
        out.append(content)
    return out


async def store_compaction(
    run: RunHandle,
    view: ChainView,
    planned: CompactionPlan,
    draft: Draft,
    summary: str,
    text: str,
    micro: MicroPlan | None,
    *,
    trigger: CompactionTrigger,
    pre_tokens: int,
    post_tokens: int,
    instructions: str | None,
) -> CompactionOutcome:
    """Append the boundary, the summary, re-attached files and copies of the kept rows
    (invariant 1: nothing rewritten, nothing re-parented) and report them, in one step.
    A copy keeps its row's content (the newest round's shrunk tool results excepted)
    but not the usage's standing as an anchor: it measured the view before. `micro`:
    a watermark to set on the copies (`settled_kept`)."""
    session_id = run.session.id
    kept_records = view.records[planned.kept_from :]
    covered = view.records[: planned.kept_from]
    last_covered = covered[-1].uuid if covered else None
    shrunk = {node.uuid: node for node in planned.kept if node.uuid in planned.shrunk}
    async with run.step() as step:
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
                "post_tokens": post_tokens,
                "covered": {
                    "first_uuid": str(covered[0].uuid) if covered else None,
                    "last_uuid": str(last_covered) if last_covered else None,
                    "messages": len(covered),
                },
                "kept": len(kept_records),
                "shrunk": len(shrunk),
                "files": len(draft.files),
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
        for content in draft.files:
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
            metadata = without_anchor(record.metadata)
            content, estimate = record.content, record.token_estimate
            cut = shrunk.get(str(record.uuid))
            if cut is not None:
                content, estimate = cut.content, cut.token_estimate
                metadata = {**(metadata or {}), "shrunk": True}
            copy = record.with_(
                uuid=uuid.uuid4(),
                parent_uuid=chain[-1].uuid,
                copied_from=record.uuid,
                content=content,
                token_estimate=estimate,
                metadata=metadata,
            )
            copies[record.uuid] = copy.uuid
            chain.append(copy)
        stored = await step.append(*chain)
        await marks.copy_marks(step.db, session_id, session_id, copies)
        if micro is not None:  # the kept part's older results, cleared now (settled_kept)
            anchor = uuid.UUID(planned.kept[micro.watermark].uuid)
            await marks.add_watermark(step.db, session_id, copies[anchor], micro.tokens_freed)
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
                "post_tokens": post_tokens,
            },
        )
    run.resources.views.forget_marks(session_id)  # the run's copy of the row is older
    return CompactionOutcome(
        boundary_uuid=boundary.uuid,
        summary_uuid=summary_row.uuid,
        summary=summary,
        pre_tokens=pre_tokens,
        post_tokens=post_tokens,
        tokens_saved=pre_tokens - post_tokens,
        messages_compacted=len(covered),
        trigger=trigger,
    )
