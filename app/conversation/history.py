"""Reading a session's history: the active chain (the full history or the model's view),
one message, and every node of the tree."""

from __future__ import annotations

import uuid
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.conversation import store
from app.conversation.payloads import collapsed_out, message_out, tree_node
from app.conversation.records import MessageRecord
from app.conversation.sessions import config_of
from app.conversation.views import ChainCache, load_view
from app.errors import NotFound
from app.models import AgentSession
from app.pagination import as_int, as_str, bad_cursor, decode_cursor, page
from app.schemas import MessageOut, TreeNode


async def message(
    db: AsyncSession, session_id: uuid.UUID, message_uuid: uuid.UUID
) -> MessageRecord:
    record = await store.get_message(db, session_id, message_uuid)
    if record is None:
        raise NotFound(f"Message {message_uuid} not found in this session")
    return record


async def chain_page(
    db: AsyncSession,
    session: AgentSession,
    settings: Settings,
    views: ChainCache,
    *,
    view: Literal["full", "api"],
    order: Literal["asc", "desc"],
    after: str | None,
    limit: int,
    head: uuid.UUID | None,
) -> tuple[list[MessageOut], str | None]:
    """A page of the chain from the root (or the model view's start) to `head`
    (default: the session's head). `after` is a cursor of this list, or the uuid of a
    message on the chain to start after."""
    if head is not None:
        await message(db, session.id, head)
    head = head or session.head_uuid
    items: list[MessageOut]
    if view == "full":
        items = [message_out(record) for record in await store.chain(db, head, full=True)]
    else:
        compactable = config_of(session, settings).compactable
        chain = await load_view(db, views, session.id, head, compactable)
        items = []
        collapses = {str(span.id): span for span in chain.collapses}
        for node in chain.projected:
            record = chain.record_of(node)
            items.append(
                message_out(record, node.content)
                if record is not None
                else collapsed_out(node, collapses[node.uuid])
            )
    if order == "desc":
        items.reverse()
    start = 0
    if after is not None:
        positions = {str(item.uuid): i for i, item in enumerate(items)}
        position = positions.get(_message_cursor(after))
        if position is None:
            raise bad_cursor(f"after={after} is not on this chain")
        start = position + 1
    return page(items[start:], limit, lambda item: (str(item.uuid),))


def _message_cursor(after: str) -> str:
    """A message uuid, given as such or as a cursor of this list."""
    try:
        return str(uuid.UUID(after))
    except ValueError:
        (value,) = decode_cursor(after, as_str)
        return str(value)


async def tree_page(
    db: AsyncSession, session_id: uuid.UUID, *, after: str | None, limit: int
) -> tuple[list[TreeNode], str | None]:
    """Every node of the session in insertion order, for branch navigation."""
    (after_seq,) = decode_cursor(after, as_int) if after else (0,)
    records = await store.tree_page(db, session_id, after_seq=after_seq, limit=limit + 1)
    shown, cursor = page(records, limit, lambda r: (r.seq,))
    return [tree_node(record) for record in shown], cursor
