"""The Files routes keep the workspace rules the tools keep: no file under a file, no
file named like a directory, the size limit and the session's quota (413)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, async_sessionmaker

from app.main import create_app
from tests.conftest import TEST_KEY, make_settings


@pytest.fixture
async def small(database_url: str, conn: AsyncConnection) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        database_url, max_file_bytes=1024, workspace_max_bytes=2048, workspace_max_files=3
    )
    app = create_app(settings)
    app.state.runtime.db.sessionmaker = async_sessionmaker(
        bind=conn, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )
    headers = {"Authorization": f"Bearer {TEST_KEY}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as c:
        yield c
    await app.state.runtime.db.engine.dispose()


async def session_files(client: httpx.AsyncClient) -> tuple[str, str]:
    sid = (await client.post("/sessions", json={})).json()["id"]
    return sid, f"/sessions/{sid}/files"


async def paths(client: httpx.AsyncClient, files: str) -> list[str]:
    return [f["path"] for f in (await client.get(files)).json()["data"]]


async def test_a_file_and_a_directory_cannot_share_a_name(api: httpx.AsyncClient) -> None:
    _, files = await session_files(api)
    assert (await api.put(f"{files}/d", content=b"x")).status_code == 201
    under = await api.put(f"{files}/d/e", content=b"y")
    assert under.status_code == 422, under.text
    assert "d is a file" in under.json()["detail"]
    assert (await api.put(f"{files}/p/q/r", content=b"z")).status_code == 201
    for clash in ("p", "p/q"):
        response = await api.put(f"{files}/{clash}", content=b"w")
        assert response.status_code == 422, response.text
        assert "is a directory" in response.json()["detail"]
    # a name that only starts like a directory is fine; replacing a file is too
    assert (await api.put(f"{files}/p_q", content=b"1")).status_code == 201
    assert (await api.put(f"{files}/d", content=b"2")).status_code == 200
    assert await paths(api, files) == ["d", "p/q/r", "p_q"]


async def test_the_quota_answers_413(small: httpx.AsyncClient) -> None:
    _, files = await session_files(small)
    too_big = await small.put(f"{files}/big", content=b"x" * 1025)
    assert too_big.status_code == 413
    for name in ("a", "b"):
        assert (await small.put(f"{files}/{name}", content=b"x" * 1000)).status_code == 201
    over = await small.put(f"{files}/c", content=b"x" * 49)
    assert over.status_code == 413, over.text
    assert over.headers["content-type"] == "application/problem+json"
    assert over.json()["type"] == "payload_too_large"
    assert "quota of 2048 bytes" in over.json()["detail"]
    assert (await small.put(f"{files}/c", content=b"x" * 48)).status_code == 201
    many = await small.put(f"{files}/d", content=b"")
    assert many.status_code == 413
    assert "holds 3 files" in many.json()["detail"]
    assert await paths(small, files) == ["a", "b", "c"]
    # another session has a quota of its own
    _, other = await session_files(small)
    assert (await small.put(f"{other}/a", content=b"x" * 1000)).status_code == 201
