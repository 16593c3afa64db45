"""How full a session's context is, what fills it, and the next request's exact body."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.context.cache import cache_cold
from app.context.compaction import (
    NothingToCompact,
    NothingToGain,
    gains,
    plan_compaction,
    post_floor,
    quoted_prompts,
    settle_kept,
)
from app.context.estimates import anchored_estimate
from app.context.limits import Limits
from app.context.request import build_body
from app.context.tokens import estimate_content, estimate_system, estimate_tools
from app.context.types import COMPACT_SUMMARY
from app.conversation import store
from app.conversation.sessions import config_of
from app.conversation.views import ChainCache, load_view
from app.errors import Conflict, Invalid, NoGain
from app.models import AgentSession
from app.schemas import ContextOut


async def context_report(
    db: AsyncSession, session: AgentSession, settings: Settings, views: ChainCache
) -> ContextOut:
    config = config_of(session, settings)
    limits = Limits.of(config)
    view = await load_view(db, views, session.id, session.head_uuid, config.compactable)
    estimated = anchored_estimate(config, view.projected)
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
    first = view.records[0] if view.records else None
    if first is not None and first.subtype == COMPACT_SUMMARY and first.parent_uuid:
        boundary = await store.get_message(db, session.id, first.parent_uuid)
        if boundary is not None:
            last = {
                "boundary_uuid": str(boundary.uuid),
                "summary_uuid": str(first.uuid),
                "created_at": boundary.created_at.isoformat(),
                **(boundary.metadata or {}),
            }
    return ContextOut.model_validate(
        {
            "estimated_tokens": estimated,
            "context_window": limits.context_window,
            "max_output_tokens": limits.max_output_tokens,
            "auto_compact_threshold": limits.auto_compact_threshold,
            "warning_threshold": limits.warning_threshold,
            "percent_used": round(100 * estimated / limits.context_window, 2),
            "breakdown": {
                "system": estimate_system(config.system),
                "tools": estimate_tools(config.tool_definitions),
                "messages": messages,
                "tool_results": tool_results,
            },
            "last_compaction": last,
        }
    )


async def next_request(
    db: AsyncSession, session: AgentSession, settings: Settings, views: ChainCache
) -> dict[str, Any]:
    """The exact JSON body of the next model request, built but not sent. A view that
    ends with a finished reply has no next request until the next user message; its
    body is the conversation so far as a prefill (the final reply without thinking
    blocks and the request without thinking, as the API takes a prefill only so).
    409 for a session with no message yet."""
    config = config_of(session, settings)
    view = await load_view(db, views, session.id, session.head_uuid, config.compactable)
    body = build_body(config, view.projected)
    if not body["messages"]:
        raise Conflict(
            f"Session {session.id} has no messages yet: its first request is built from "
            "the first turn"
        )
    if body["messages"][-1]["role"] == "assistant":
        body.pop("thinking", None)
    return body


async def check_compactable(
    db: AsyncSession, session: AgentSession, settings: Settings, views: ChainCache
) -> None:
    """422 before starting a manual compaction that could not compact anything
    (`invalid_request`, saying why) or that could not make the next request smaller by
    the minimum saving even with the shortest summary (`nothing_to_gain`, with both
    figures). Re-attached files are not counted here (they only add): the run checks
    again with them, and once more with the real summary."""
    config = config_of(session, settings)
    view = await load_view(db, views, session.id, session.head_uuid, config.compactable)
    threshold = Limits.of(config).auto_compact_threshold
    pre = anchored_estimate(config, view.projected)
    try:
        plan = plan_compaction(config, view.projected, view.nodes, view.collapses, threshold, pre)
    except NothingToCompact as exc:
        raise Invalid(str(exc)) from exc
    _, quoted = quoted_prompts(view.nodes, plan)
    cold = cache_cold(session.last_request_at, settings.cache_ttl_seconds, datetime.now(UTC))
    kept, _ = settle_kept(config, plan.kept, cold=cold)
    floor = post_floor(config, kept, quoted, [], continue_work=False)
    if not gains(pre, floor, settings.compaction_min_saving):
        refused = NothingToGain(pre, floor, settings.compaction_min_saving)
        raise NoGain(
            str(refused),
            extra={
                "pre_tokens": pre,
                "post_tokens": floor,
                "min_saving": settings.compaction_min_saving,
            },
        )
