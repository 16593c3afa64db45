"""The message tree: chains (full and api views), pagination, one node, the tree, head
moves, forks and clear."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.api.seed import add, new_session, text


async def linear(conn: AsyncConnection, sid: str, n: int) -> list[uuid.UUID]:
    ids: list[uuid.UUID] = []
    parent = None
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        parent = await add(conn, sid, parent, **text(role, f"m{i}"))
        ids.append(parent)
    return ids


async def chain(api: httpx.AsyncClient, sid: str, **params: Any) -> list[dict[str, Any]]:
    response = await api.get(f"/sessions/{sid}/messages", params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


async def test_chain_pages_in_both_orders(api: httpx.AsyncClient, conn: AsyncConnection) -> None:
    sid = await new_session(api)
    ids = await linear(conn, sid, 7)
    assert [m["uuid"] for m in await chain(api, sid)] == [str(i) for i in ids]
    seen: list[str] = []
    after = None
    while True:
        page = (
            await api.get(
                f"/sessions/{sid}/messages",
                params={"limit": 3, "order": "desc", **({"after": after} if after else {})},
            )
        ).json()
        seen += [m["uuid"] for m in page["data"]]
        after = page["next_cursor"]
        if after is None:
            break
    assert seen == [str(i) for i in reversed(ids)]
    pinned = await chain(api, sid, head=str(ids[2]))
    assert [m["uuid"] for m in pinned] == [str(i) for i in ids[:3]]
    assert (
        await api.get(f"/sessions/{sid}/messages", params={"after": str(uuid.uuid4())})
    ).status_code == 422
    assert (
        await api.get(f"/sessions/{sid}/messages", params={"head": str(uuid.uuid4())})
    ).status_code == 404


async def test_branches_and_head_moves(api: httpx.AsyncClient, conn: AsyncConnection) -> None:
    sid = await new_session(api)
    ids = await linear(conn, sid, 4)
    # Edit the second user message: a sibling of ids[2] under ids[1].
    branch = await add(conn, sid, ids[1], **text("user", "edited"))
    head = (await api.get(f"/sessions/{sid}")).json()["head_uuid"]
    assert head == str(branch)
    assert [m["uuid"] for m in await chain(api, sid)] == [str(ids[0]), str(ids[1]), str(branch)]
    moved = await api.put(f"/sessions/{sid}/head", json={"uuid": str(ids[3])})
    assert moved.status_code == 200
    assert moved.json()["head_uuid"] == str(ids[3])
    assert [m["uuid"] for m in await chain(api, sid)] == [str(i) for i in ids]
    tree = (await api.get(f"/sessions/{sid}/tree")).json()["data"]
    assert len(tree) == 5
    assert {n["uuid"]: n["parent_uuid"] for n in tree}[str(branch)] == str(ids[1])
    assert tree[-1]["preview"] == "edited"
    assert (
        await api.put(f"/sessions/{sid}/head", json={"uuid": str(uuid.uuid4())})
    ).status_code == 404
    one = await api.get(f"/sessions/{sid}/messages/{ids[1]}")
    assert one.json()["content"] == [{"type": "text", "text": "m1"}]


async def test_boundary_views(api: httpx.AsyncClient, conn: AsyncConnection) -> None:
    """view=api stops at the compact boundary (not listed); view=full crosses it."""
    sid = await new_session(api)
    ids = await linear(conn, sid, 4)
    boundary = await add(
        conn,
        sid,
        None,
        type="system",
        subtype="compact_boundary",
        role=None,
        content=[],
        logical_parent_uuid=ids[3],
    )
    summary = await add(
        conn,
        sid,
        boundary,
        type="user",
        subtype="compact_summary",
        role="user",
        content=[{"type": "text", "text": "summary"}],
    )
    after = await add(conn, sid, summary, **text("assistant", "after"))
    full = [m["uuid"] for m in await chain(api, sid, view="full")]
    assert full == [*(str(i) for i in ids), str(boundary), str(summary), str(after)]
    api_view = [m["uuid"] for m in await chain(api, sid, view="api")]
    assert api_view == [str(summary), str(after)]
    body = (await api.get(f"/sessions/{sid}/context/request")).json()
    assert body["messages"][0]["content"][0]["text"] == "summary"


async def test_fork_copies_chain_settings_and_files(
    api: httpx.AsyncClient, conn: AsyncConnection
) -> None:
    sid = await new_session(
        api, title="orig", system="sys", builtin_tools=["Read"], metadata={"k": 1}
    )
    ids = await linear(conn, sid, 4)
    await api.put(f"/sessions/{sid}/files/notes/a.md", content=b"hello")
    response = await api.post(f"/sessions/{sid}/fork", json={"at_uuid": str(ids[1])})
    assert response.status_code == 201, response.text
    forked = response.json()
    assert forked["id"] != sid
    assert (forked["title"], forked["system"], forked["builtin_tools"], forked["metadata"]) == (
        "orig",
        "sys",
        ["Read"],
        {"k": 1},
    )
    copied = await chain(api, forked["id"])
    assert [m["content"][0]["text"] for m in copied] == ["m0", "m1"]
    assert [m["copied_from"] for m in copied] == [str(ids[0]), str(ids[1])]
    assert not {m["uuid"] for m in copied} & {str(i) for i in ids}
    assert (await api.get(f"/sessions/{forked['id']}/files/notes/a.md")).content == b"hello"
    # The original is untouched.
    assert len(await chain(api, sid)) == 4
    whole = await api.post(f"/sessions/{sid}/fork", json={})
    assert len(await chain(api, whole.json()["id"])) == 4


async def test_clear_starts_a_new_root(api: httpx.AsyncClient, conn: AsyncConnection) -> None:
    sid = await new_session(api)
    await linear(conn, sid, 2)
    cleared = await api.post(f"/sessions/{sid}/clear")
    assert cleared.status_code == 200
    assert cleared.json()["head_uuid"] is None
    assert await chain(api, sid) == []
    assert len((await api.get(f"/sessions/{sid}/tree")).json()["data"]) == 2
    fresh = await add(conn, sid, None, **text("user", "again"))
    assert [m["uuid"] for m in await chain(api, sid)] == [str(fresh)]
