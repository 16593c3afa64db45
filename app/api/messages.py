"""Routes: the message tree of a session (chain, one node, tree, head, fork, clear)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from app.api.deps import AfterQuery, DbDep, SessionDep, SettingsDep, TenantDep, ViewsDep
from app.conversation import branches, history, sessions
from app.conversation.payloads import message_out
from app.schemas import ForkIn, HeadIn, MessageOut, Page, SessionOut, TreeNode

router = APIRouter(prefix="/sessions/{session_id}", tags=["messages"])


@router.get("/messages", summary="List the messages of a chain")
async def list_messages(
    session: SessionDep,
    db: DbDep,
    settings: SettingsDep,
    views: ViewsDep,
    view: Literal["full", "api"] = "full",
    order: Literal["asc", "desc"] = "asc",
    after: AfterQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    head: uuid.UUID | None = None,
) -> Page[MessageOut]:
    """The chain from the head (or from `head`) back to the root, oldest first
    (`order=desc`: newest first). `view=full` shows every stored row, across compact
    boundaries; `view=api` shows what the model gets: from the last boundary on, snips
    left out, micro-compaction and collapses applied. Pages by `after`: the
    `next_cursor` of the previous page, or the uuid of the last message seen (422 when it
    is not on the chain)."""
    items, cursor = await history.chain_page(
        db, session, settings, views, view=view, order=order, after=after, limit=limit, head=head
    )
    return Page[MessageOut](data=items, next_cursor=cursor)


@router.get("/messages/{message_uuid}", summary="Get a message")
async def get_message(session: SessionDep, db: DbDep, message_uuid: uuid.UUID) -> MessageOut:
    """One message of the session by uuid, on any branch. 404 when the session has no such
    message."""
    return message_out(await history.message(db, session.id, message_uuid))


@router.get("/tree", summary="List the message tree")
async def get_tree(
    session: SessionDep,
    db: DbDep,
    after: AfterQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> Page[TreeNode]:
    """Every message of the session, on all branches, in the order they were stored, as
    tree nodes (uuid, parents, role, a short preview) for drawing the tree. Pages by
    `after`, the `next_cursor` of the previous page."""
    nodes, cursor = await history.tree_page(db, session.id, after=after, limit=limit)
    return Page[TreeNode](data=nodes, next_cursor=cursor)


ACTIVE_RUN: dict[int | str, dict[str, Any]] = {409: {"description": "A run is active"}}


@router.put("/head", responses=ACTIVE_RUN, summary="Move the head")
async def put_head(
    body: HeadIn, session: SessionDep, db: DbDep, settings: SettingsDep, views: ViewsDep
) -> SessionOut:
    """Make message `uuid` the session's head: the next turn continues from it (to switch
    branches or rewind; nothing is deleted). 404 for a message not in the session; 409
    while a run is active."""
    await branches.move_head(db, session, body.uuid)
    return await sessions.to_out(db, session, settings, views)


@router.post("/fork", status_code=201, summary="Fork a session")
async def fork_session(
    body: ForkIn,
    session: SessionDep,
    db: DbDep,
    tenant: TenantDep,
    settings: SettingsDep,
    views: ViewsDep,
) -> SessionOut:
    """A new session holding its own copy of the chain up to `at_uuid` (default: the head),
    with the snips, compaction state and workspace files that go with it; each copied
    message names its original in `copied_from`. Answers 201 with the new session."""
    target = await branches.fork(db, session, body.at_uuid, tenant=tenant)
    return await sessions.to_out(db, target, settings, views, status="idle")


@router.post("/clear", responses=ACTIVE_RUN, summary="Clear the conversation")
async def clear_session(
    session: SessionDep, db: DbDep, settings: SettingsDep, views: ViewsDep
) -> SessionOut:
    """Unset the head: the next turn starts a new root, and earlier messages stay in the
    tree. 409 while a run is active."""
    await branches.move_head(db, session, None)
    return await sessions.to_out(db, session, settings, views)
