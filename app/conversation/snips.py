"""Snip: leave chosen messages out of every later model request (they stay in history)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.context.blocks import is_model_visible, tool_result_ids, tool_use_ids
from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY, Node
from app.conversation import marks
from app.conversation.history import message
from app.conversation.sessions import config_of
from app.conversation.views import ChainCache, load_view
from app.errors import Conflict, Invalid
from app.models import AgentSession


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
    db: AsyncSession,
    session: AgentSession,
    settings: Settings,
    views: ChainCache,
    uuids: Sequence[uuid.UUID],
) -> list[uuid.UUID]:
    compactable = config_of(session, settings).compactable
    view = await load_view(db, views, session.id, session.head_uuid, compactable)
    on_chain = {node.uuid for node in view.nodes}
    for message_uuid in uuids:
        record = await message(db, session.id, message_uuid)
        if record.subtype in (COMPACT_BOUNDARY, COMPACT_SUMMARY):
            raise Invalid(f"Message {message_uuid} is a compaction row and cannot be snipped")
        if str(message_uuid) not in on_chain:
            raise Invalid(f"Message {message_uuid} is not in the model's current view")
    wanted = {str(u) for u in uuids}
    problem = pair_problem(view.nodes, view.snipped | wanted)
    if problem is not None:
        raise Conflict(problem)
    unique = list(dict.fromkeys(uuids))
    existing = await marks.snipped_among(db, unique)
    await marks.add_snips(db, session.id, [u for u in unique if u not in existing])
    await db.flush()
    return unique
