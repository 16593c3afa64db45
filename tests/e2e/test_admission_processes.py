"""Exactly-once admission across two service processes on one database: posts racing
on one session through both decide in Postgres, never in one process's memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.processes import Fake, Service
from tests.fake_anthropic import items

pytestmark = pytest.mark.e2e
WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}


@pytest.fixture(scope="module")
def services(
    database_url: str, engine: AsyncEngine, fake_process: Fake
) -> Iterator[tuple[Service, Service]]:
    # `engine` has migrated the database: the two processes do not race to migrate it.
    with ThreadPoolExecutor(2) as pool:  # start both at once: a process takes seconds
        one, two = pool.map(lambda _: Service(database_url, fake_process.url), range(2))
    yield one, two
    one.stop()
    two.stop()


async def test_racing_posts_through_two_processes(
    services: tuple[Service, Service], fake_process: Fake
) -> None:
    fake_process.control("POST", "reset")
    fake_process.script(
        items.message(items.tool_use("get_weather", {}, id="toolu_w")),
        items.message("Sunny."),
    )
    async with services[0].client() as a, services[1].client() as b:
        clients = [a, b]
        sid = (await a.post("/sessions", json={"tools": [WEATHER]})).json()["id"]
        run = (await a.post(f"/sessions/{sid}/messages", json={"content": "w?"})).json()["run"]
        assert run["status"] == "requires_action"
        url = f"/sessions/{sid}/runs/{run['id']}/tool_results"
        body = {"results": [{"tool_use_id": "toolu_w", "content": "sunny"}]}
        posts = await asyncio.gather(*(clients[i % 2].post(url, json=body) for i in range(10)))
        assert [p.status_code for p in posts] == [200] * 10, [p.text for p in posts]
        assert all(p.json()["messages"] == posts[0].json()["messages"] for p in posts)
        assert posts[0].json()["run"]["status"] == "completed"
        chain = (await b.get(f"/sessions/{sid}/messages")).json()["data"]
        assert [m["content"][0]["type"] for m in chain].count("tool_result") == 1

        keyed = await asyncio.gather(
            *(
                clients[i % 2].post(
                    f"/sessions/{sid}/messages",
                    json={"content": "again", "if_busy": "enqueue", "background": True},
                    headers={"Idempotency-Key": "both"},
                )
                for i in range(10)
            )
        )
        assert [p.status_code for p in keyed] == [202] * 10, [p.text for p in keyed]
        assert len({p.json()["id"] for p in keyed}) == 1
    assert fake_process.control("GET", "rejections") == []
