"""While the database is away, API requests answer 503 `unavailable` with `Retry-After`
(not 500 `internal`), and answer normally once it is back: a throwaway cluster of the
test's own is stopped under a running app."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy.ext.asyncio import create_async_engine

from app.config import normalize_database_url
from app.main import create_app
from app.migrate import upgrade
from tests.conftest import TEST_KEY, make_settings
from tests.pg_cluster import Cluster


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert int(response.headers["retry-after"]) > 0
    body = response.json()
    assert body["type"] == "unavailable"
    assert body["status"] == 503
    assert "Traceback" not in response.text


async def test_requests_during_an_outage_answer_503() -> None:
    with Cluster() as cluster:
        url = normalize_database_url(cluster.url)
        engine = create_async_engine(url)
        await upgrade(engine)
        await engine.dispose()
        app = create_app(make_settings(url))
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {TEST_KEY}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=headers
        ) as client:
            created = await client.post("/sessions", json={})
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            await asyncio.to_thread(cluster.stop)
            # The first requests find pooled connections cut, later ones are refused.
            for _ in range(3):
                assert_unavailable(await client.get(f"/sessions/{sid}"))
            assert_unavailable(await client.post("/sessions", json={}))
            assert_unavailable(
                await client.post(f"/sessions/{sid}/messages", json={"content": "hi"})
            )
            assert_unavailable(await client.get("/readyz"))
            await asyncio.to_thread(cluster.start)
            back = await client.get(f"/sessions/{sid}")
            assert back.status_code == 200, back.text
        await app.state.runtime.db.engine.dispose()
