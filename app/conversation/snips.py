"""Snip: leave chosen messages out of every later model request (they stay in history)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.context.blocks import is_model_visible, tool_result_ids, tool_use_ids
from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY, Node
from app.conversation import store
from app.conversation.views import load_view
from app.errors import Conflict, Invalid, NotFound
from app.models import AgentSession, Snip


def pair_problem(nodes: Sequence[Node], snipped: set[str]) -> str | None:
    """Why leaving `snipped` out would break the history the model sees, if it would."""
    owner: dict[str, str] = {}
    for node in nodes:
        for use_id in tool_use_ids(node.content):
            owner[use_id] = node.uuid
    for node in nodes:
        for result_id in tool_result_ids(node.content):
            use_node = owner.get(result_id)
            if use_node is not None and (use_node in snipped) != (node.uuid in snipped):
                return (
                    f"snipping would split tool_use {result_id} from its tool_result; "
                    "snip both messages or neither"
                )
    first = next((n for n in nodes if n.uuid not in snipped and is_model_visible(n)), None)
    if first is not None and first.role != "user":
        return "snipping would leave the model's view starting without a user message"
    return None


async def snip(
    db: AsyncSession, session: AgentSession, uuids: Sequence[uuid.UUID]
) -> list[uuid.UUID]:
    view = await load_view(db, session)
    on_chain = {node.uuid for node in view.nodes}
    for message_uuid in uuids:
        row = await store.get_message(db, session.id, message_uuid)
        if row is None:
            raise NotFound(f"Message {message_uuid} not found in this session")
        if row.subtype in (COMPACT_BOUNDARY, COMPACT_SUMMARY):
            raise Invalid(f"Message {message_uuid} is a compaction row and cannot be snipped")
        if str(message_uuid) not in on_chain:
            raise Invalid(f"Message {message_uuid} is not in the model's current view")
    wanted = {str(u) for u in uuids}
    problem = pair_problem(view.nodes, view.snipped | wanted)
    if problem is not None:
        raise Conflict(problem)
    existing = set(
        await db.scalars(select(Snip.message_uuid).where(Snip.message_uuid.in_(list(uuids))))
    )
    for message_uuid in dict.fromkeys(uuids):
        if message_uuid not in existing:
            db.add(Snip(session_id=session.id, message_uuid=message_uuid))
    await db.flush()
    return list(dict.fromkeys(uuids))
