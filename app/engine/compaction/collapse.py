"""Context collapse: older finished spans summarised in the background after a run."""

from __future__ import annotations

import logging
import uuid

from app.context.collapse import collapsed_node, plan_collapse_spans
from app.context.estimates import anchored_estimate
from app.context.limits import Limits
from app.context.projection import span_indices
from app.context.render import render_for_summary
from app.context.summary_prompt import extract_summary
from app.context.tokens import estimate_messages
from app.conversation import marks, sessions
from app.conversation.views import load_view
from app.engine.compaction.summary import CompactionFailed, complete
from app.engine.compaction.usage import charge_session
from app.engine.llm.errors import ModelError
from app.engine.resources import Resources
from app.models import AgentSession

log = logging.getLogger("parley.compaction")


COLLAPSE_INSTRUCTION = (
    "Summarise the finished piece of work below in at most five sentences for the "
    "assistant that did it: what was asked, what was done (files, commands, findings), "
    "and the outcome. Plain text, no preamble, call no tools."
)


def worth_checking(limits: Limits, estimate: int) -> bool:
    """Whether a view of `estimate` tokens is past half of the collapse point: below it
    no span is summarised, so short sessions never pay for the check."""
    return estimate >= 0.5 * limits.compaction.collapse_at * limits.auto_compact_threshold


async def collapse_spans(resources: Resources, session_id: uuid.UUID, *, max_spans: int = 3) -> int:
    """Summarise older completed spans of the chain into collapse rows (not applied yet).
    Runs only once the session is past half of the collapse point, so short sessions
    never pay for it. Returns how many spans were summarised."""
    # Its writes of the session row (usage, marks) land while turns are posted to it.
    with resources.session_rows.writing(session_id):
        return await _collapse_spans(resources, session_id, max_spans)


async def _collapse_spans(resources: Resources, session_id: uuid.UUID, max_spans: int) -> int:
    async with resources.db.sessionmaker() as db:
        session = await db.get(AgentSession, session_id)
        if session is None:
            return 0
        config = sessions.config_of(session, resources.settings)
        limits = Limits.of(config)
        view = await load_view(
            db, resources.views, session_id, session.head_uuid, config.compactable
        )
    if not worth_checking(limits, anchored_estimate(config, view.projected)):
        return 0
    existing = [(start, end) for start, end, _ in span_indices(view.nodes, view.collapses)]
    spans = plan_collapse_spans(view.nodes, skip=existing)[:max_spans]
    done = 0
    model = resources.settings.compaction_model or session.model
    for start, end in spans:
        nodes = view.nodes[start : end + 1]
        prompt = f"{COLLAPSE_INSTRUCTION}\n\n<work>\n{render_for_summary(nodes)}\n</work>"
        body = {
            "model": model,
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
        }
        try:
            result = await complete(resources, body)
        except (CompactionFailed, ModelError) as exc:
            log.warning("collapse summary failed: %s", exc)
            break
        await charge_session(resources, session_id, result.usage)
        resources.session_rows.forget(session_id)  # the usage changed the row
        text = "".join(b.get("text", "") for b in result.content if b.get("type") == "text")
        text = extract_summary(text)
        if not text:
            continue
        saved = estimate_messages(nodes) - collapsed_node(text, "").token_estimate
        if saved <= 0:
            continue
        async with resources.db.transaction() as db:
            await marks.add_collapse(
                db,
                session_id,
                start_uuid=uuid.UUID(nodes[0].uuid),
                end_uuid=uuid.UUID(nodes[-1].uuid),
                summary=text,
                tokens_saved=saved,
                model=model,
            )
        resources.session_rows.forget(session_id)  # the marks version changed the row
        done += 1
    return done
