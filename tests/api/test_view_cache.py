"""The in-memory view cache always agrees with a fresh chain query: on growth, on a
branch, on a rewind and across a new compact boundary."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.conversation import store
from app.conversation.views import ChainCache
from app.models import AgentSession
from tests.api.seed import add, text


async def fresh(conn: AsyncConnection, head: uuid.UUID) -> list[str]:
    async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as db:
        rows = await store.chain(db, head, full=False)
    return [str(r.uuid) for r in rows if r.subtype != "compact_boundary"]


async def test_cached_views_match_the_store(conn: AsyncConnection) -> None:
    sid = uuid.uuid4()
    async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as db:
        db.add(AgentSession(id=sid, tenant="t", model="m"))
        await db.commit()
    cache = ChainCache(max_messages=1000)
    ids = []
    parent = None
    for i in range(6):
        parent = await add(
            conn, str(sid), parent, **text("user" if i % 2 == 0 else "assistant", f"m{i}")
        )
        ids.append(parent)
    branch = await add(conn, str(sid), ids[2], **text("assistant", "other"))
    boundary = await add(
        conn,
        str(sid),
        None,
        type="system",
        subtype="compact_boundary",
        role=None,
        content=[],
        logical_parent_uuid=ids[5],
    )
    summary = await add(
        conn,
        str(sid),
        boundary,
        type="user",
        subtype="compact_summary",
        role="user",
        content=[{"type": "text", "text": "s"}],
    )
    after = await add(conn, str(sid), summary, **text("assistant", "after"))
    heads = [ids[1], ids[3], ids[5], ids[5], branch, ids[0], ids[4], after, summary, ids[5]]
    async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as db:
        for head in heads:
            rows, nodes = await cache.view_records(db, sid, head)
            assert [str(r.uuid) for r in rows] == await fresh(conn, head), head
            assert [n.uuid for n in nodes] == [str(r.uuid) for r in rows]
    assert cache.size == len(cache.entries[sid].records)


async def test_cache_stays_within_its_bound(conn: AsyncConnection) -> None:
    cache = ChainCache(max_messages=5)
    sessions = []
    async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as db:
        for _ in range(3):
            sid = uuid.uuid4()
            db.add(AgentSession(id=sid, tenant="t", model="m"))
            sessions.append(sid)
        await db.commit()
    heads = {}
    for sid in sessions:
        parent = None
        for i in range(2):
            parent = await add(conn, str(sid), parent, **text("user", f"{i}"))
        heads[sid] = parent
    async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as db:
        for sid in sessions:
            await cache.view_records(db, sid, heads[sid])
    assert cache.size <= 5
    assert list(cache.entries) == sessions[1:]
