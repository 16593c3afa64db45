"""Token figures of a session's view: estimates, the cache clock, the context report."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.context.tokens import estimate_content, estimate_system, estimate_tools
from app.context.tools import tool_definitions
from app.context.types import COMPACT_SUMMARY, Node
from app.conversation import store
from app.conversation.sessions import Limits, estimate_from_rows
from app.conversation.views import ChainView, load_view
from app.engine.llm.models import model_info
from app.models import AgentSession

if TYPE_CHECKING:
    from app.engine.runtime import Runtime

log = logging.getLogger("parley.compaction")


def view_estimate(session: AgentSession, nodes: list[Node]) -> int:
    """A pure estimate of a request built from `nodes` (system and tools included), in
    the session model's tokens."""
    chars_based = (
        estimate_system(session.system)
        + estimate_tools(tool_definitions(session.builtin_tools or [], session.tools or []))
        + sum(node.token_estimate or estimate_content(node.content) for node in nodes)
    )
    return int(chars_based * model_info(session.model).tokens_per_char_factor)


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
            "tools": estimate_tools(
                tool_definitions(session.builtin_tools or [], session.tools or [])
            ),
            "messages": messages,
            "tool_results": tool_results,
        },
        "last_compaction": last,
    }
