"""The in-memory view cache always agrees with a fresh chain query: on growth, on a
branch, on a rewind and across a new compact boundary."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.conversation import store
from app.conversation.views import ChainCache, record_bytes
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
    cache = ChainCache()
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
    assert cache.size == sum(map(record_bytes, cache.entries[sid].records))


async def test_cache_is_bounded_in_bytes(conn: AsyncConnection) -> None:
    """Least recently used sessions leave first, and a message's size is what it holds:
    one large tool result weighs more than many short messages."""
    sessions = []
    async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as db:
        for _ in range(4):
            sid = uuid.uuid4()
            db.add(AgentSession(id=sid, tenant="t", model="m"))
            sessions.append(sid)
        await db.commit()
    heads = {}
    for n, sid in enumerate(sessions):
        parent = None
        for i in range(2):
            body = "x" * 200_000 if n == 3 and i == 1 else f"{i}"
            parent = await add(conn, str(sid), parent, **text("user", body))
        heads[sid] = parent
    sizes = {}
    async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as db:
        for sid in sessions:
            rows, _ = await ChainCache().view_records(db, sid, heads[sid])
            sizes[sid] = sum(map(record_bytes, rows))
        small, large = sessions[:3], sessions[3]
        assert sizes[large] > 200_000 > 10 * max(sizes[sid] for sid in small)

        cache = ChainCache(max_bytes=sizes[small[1]] + sizes[small[2]])
        for sid in small:
            await cache.view_records(db, sid, heads[sid])
        assert list(cache.entries) == small[1:]
        assert cache.size == sizes[small[1]] + sizes[small[2]]

        await cache.view_records(db, large, heads[large])  # larger than the bound: not kept
        assert list(cache.entries) == small[1:]

        roomy = ChainCache(max_bytes=sizes[large] + sizes[small[0]])
        for sid in [*small, large]:
            await roomy.view_records(db, sid, heads[sid])
        assert list(roomy.entries) == [small[2], large]  # the big one pushed two out
        assert roomy.size <= roomy.max_bytes
