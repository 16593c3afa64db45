"""Routes: the message tree of a session (chain, one node, tree, head, fork, clear)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from app.api.deps import DbDep, SessionDep, SettingsDep, TenantDep
from app.context.blocks import preview
from app.conversation import sessions, store
from app.conversation.payloads import message_out
from app.conversation.views import load_view
from app.errors import Invalid, NotFound
from app.schemas import ForkIn, HeadIn, MessageOut, Page, SessionOut, TreeNode

router = APIRouter(prefix="/sessions/{session_id}", tags=["messages"])


def paginate(
    items: list[Any], key: Any, *, after: str | None, limit: int
) -> tuple[list[Any], str | None]:
    """Page through an ordered list by the key of the last item seen."""
    start = 0
    if after is not None:
        positions = {str(key(item)): i for i, item in enumerate(items)}
        if after not in positions:
            raise Invalid(
                f"after={after} is not on this chain",
                errors=[
                    {"loc": ["query", "after"], "msg": "not on the chain", "type": "value_error"}
                ],
            )
        start = positions[after] + 1
    page = items[start : start + limit]
    more = start + limit < len(items)
    return page, (str(key(page[-1])) if more and page else None)


async def _check_on_session(db: DbDep, session_id: uuid.UUID, message_uuid: uuid.UUID) -> None:
    if await store.get_message(db, session_id, message_uuid) is None:
        raise NotFound(f"Message {message_uuid} not found in this session")


@router.get("/messages", summary="List the messages of a chain")
async def list_messages(
    session: SessionDep,
    db: DbDep,
    view: Literal["full", "api"] = "full",
    order: Literal["asc", "desc"] = "asc",
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    head: uuid.UUID | None = None,
) -> Page[MessageOut]:
    """The chain from the head (or from `head`) back to the root, oldest first
    (`order=desc`: newest first). `view=full` shows every stored row, across compact
    boundaries; `view=api` shows what the model gets: from the last boundary on, snips
    left out, micro-compaction and collapses applied. Pages by `after`, the uuid of the
    last message seen (422 when it is not on the chain)."""
    if head is not None:
        await _check_on_session(db, session.id, head)
    head = head or session.head_uuid
    items: list[MessageOut]
    if view == "full":
        items = [message_out(row) for row in await store.chain_rows(db, head, full=True)]
    else:
        chain = await load_view(db, session, head)
        by_uuid = {str(row.uuid): row for row in chain.rows}
        items = []
        for node in chain.projected:
            row = by_uuid.get(node.uuid)
            items.append(message_out(row, node.content) if row else _synthetic(node, chain))
    if order == "desc":
        items.reverse()
    page, cursor = paginate(items, lambda m: m.uuid, after=after, limit=limit)
    return Page[MessageOut](data=page, next_cursor=cursor)


def _synthetic(node: Any, chain: Any) -> MessageOut:
    """A collapsed span shown as its summary (no stored row of its own)."""
    span = next(s for s in chain.collapses if str(s.id) == node.uuid)
    return MessageOut(
        uuid=span.id,
        parent_uuid=None,
        logical_parent_uuid=span.end_uuid,
        type="user",
        subtype=node.subtype,
        role="user",
        content=node.content,
        model=span.model,
        stop_reason=None,
        usage=None,
        is_meta=True,
        copied_from=None,
        created_at=span.created_at,
        metadata={
            "collapse": {
                "start_uuid": str(span.start_uuid),
                "end_uuid": str(span.end_uuid),
                "tokens_saved": span.tokens_saved,
            }
        },
    )


@router.get("/messages/{message_uuid}", summary="Get a message")
async def get_message(session: SessionDep, db: DbDep, message_uuid: uuid.UUID) -> MessageOut:
    """One message of the session by uuid, on any branch. 404 when the session has no such
    message."""
    row = await store.get_message(db, session.id, message_uuid)
    if row is None:
        raise NotFound(f"Message {message_uuid} not found in this session")
    return message_out(row)


@router.get("/tree", summary="List the message tree")
async def get_tree(
    session: SessionDep,
    db: DbDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> Page[TreeNode]:
    """Every message of the session, on all branches, in the order they were stored, as
    tree nodes (uuid, parents, role, a short preview) for drawing the tree. Pages by
    `after`, the `next_cursor` of the previous page."""
    after_seq = 0
    if after is not None:
        if not after.isdigit():
            raise Invalid("The cursor is not valid")
        after_seq = int(after)
    rows = await store.tree_page(db, session.id, after_seq=after_seq, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    data = [
        TreeNode(
            uuid=row.uuid,
            parent_uuid=row.parent_uuid,
            logical_parent_uuid=row.logical_parent_uuid,
            type=row.type,
            subtype=row.subtype,
            role=row.role,
            preview=preview(row.content),
            created_at=row.created_at,
        )
        for row in rows
    ]
    return Page[TreeNode](data=data, next_cursor=str(rows[-1].seq) if more and rows else None)


@router.put("/head", summary="Move the head")
async def put_head(
    body: HeadIn, session: SessionDep, db: DbDep, settings: SettingsDep
) -> SessionOut:
    """Make message `uuid` the session's head: the next turn continues from it (to switch
    branches or rewind; nothing is deleted). 404 for a message not in the session; 409
    while a run is active."""
    await _check_on_session(db, session.id, body.uuid)
    await sessions.require_idle(db, session)
    await store.set_head(db, session.id, body.uuid)
    await db.refresh(session)
    return await sessions.to_out(db, session, settings)


@router.post("/fork", status_code=201, summary="Fork a session")
async def fork_session(
    body: ForkIn, session: SessionDep, db: DbDep, tenant: TenantDep, settings: SettingsDep
) -> SessionOut:
    """A new session holding its own copy of the chain up to `at_uuid` (default: the head),
    with the snips, compaction state and workspace files that go with it; each copied
    message names its original in `copied_from`. Answers 201 with the new session."""
    at = body.at_uuid or session.head_uuid
    if body.at_uuid is not None:
        await _check_on_session(db, session.id, body.at_uuid)
    target = await store.fork(db, session, at, tenant=tenant)
    return await sessions.to_out(db, target, settings, status="idle")


@router.post("/clear", summary="Clear the conversation")
async def clear_session(session: SessionDep, db: DbDep, settings: SettingsDep) -> SessionOut:
    """Unset the head: the next turn starts a new root, and earlier messages stay in the
    tree. 409 while a run is active."""
    await sessions.require_idle(db, session)
    await store.set_head(db, session.id, None)
    await db.refresh(session)
    return await sessions.to_out(db, session, settings)
