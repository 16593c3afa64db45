"""End to end: the service and the fake Anthropic API each in their own process, driven
by a real HTTP client reading SSE (httpx + httpx-sse). Two service processes share one
database to show that runs, events and leases hold across processes."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.processes import Fake, Service
from tests.fake_anthropic import items
from tests.runs.helpers import assert_gap_free, names, stream

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def service(database_url: str, fake_process: Fake) -> Iterator[Service]:
    server = Service(database_url, fake_process.url)
    yield server
    server.stop()


@pytest.fixture
async def client(service: Service, fake_process: Fake) -> AsyncIterator[httpx.AsyncClient]:
    fake_process.control("POST", "reset")
    async with service.client() as c:
        yield c
    assert fake_process.control("GET", "rejections") == []


WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}


async def test_the_whole_story(client: httpx.AsyncClient, fake_process: Fake) -> None:
    fake_process.script(
        items.message("Writing.", items.tool_use("Write", {"file_path": "a.txt", "content": "hi"})),
        items.message(
            items.tool_use("Read", {"file_path": "a.txt"}),
            items.tool_use("get_weather", {"city": "Oslo"}, id="toolu_w"),
        ),
        items.rate_limit(retry_after=None, message="slow down"),
        items.overloaded(),
        items.message("All done: a.txt says hi and Oslo is sunny."),
    )
    sid = (
        await client.post(
            "/sessions", json={"builtin_tools": ["Read", "Write"], "tools": [WEATHER]}
        )
    ).json()["id"]
    first = await stream(
        client, "POST", f"/sessions/{sid}/messages", json={"content": "go", "stream": True}
    )
    assert_gap_free(first)
    assert names(first)[-1] == "run.requires_action"
    run = first[-1].json
    busy = await client.post(f"/sessions/{sid}/messages", json={"content": "again"})
    assert busy.status_code == 409
    # Answer the client tool in the background, then follow with Last-Event-ID.
    resumed = await client.post(
        f"/sessions/{sid}/runs/{run['id']}/tool_results",
        json={"results": [{"tool_use_id": "toolu_w", "content": "sunny"}], "background": True},
    )
    assert resumed.status_code == 202
    rest = await stream(
        client,
        "GET",
        f"/sessions/{sid}/runs/{run['id']}/events",
        headers={"Last-Event-ID": first[-1].id},
    )
    assert_gap_free(first + rest)
    assert names(rest)[-1] == "run.completed"
    text = "".join(e.json["text"] for e in rest if e.event == "text.delta")
    assert text == "All done: a.txt says hi and Oslo is sunny."
    statuses = [r["status"] for r in fake_process.control("GET", "requests")]
    assert statuses == [200, 200, 429, 529, 200]


async def test_cancel_a_streaming_turn(client: httpx.AsyncClient, fake_process: Fake) -> None:
    fake_process.control("POST", "config", {"chunk_delay": 0.05, "text_chunk_chars": 2})
    try:
        fake_process.script(items.message("a slow reply that will be cancelled part way"))
        sid = (await client.post("/sessions", json={})).json()["id"]
        run = (
            await client.post(
                f"/sessions/{sid}/messages", json={"content": "x", "background": True}
            )
        ).json()
        await stream(client, "GET", f"/sessions/{sid}/runs/{run['id']}/events", limit=5)
        cancelled = await client.post(f"/sessions/{sid}/runs/{run['id']}/cancel")
        assert cancelled.json()["status"] == "cancelled"
        events = await stream(client, "GET", f"/sessions/{sid}/runs/{run['id']}/events")
        assert names(events)[-1] == "run.cancelled"
        assert_gap_free(events)
    finally:
        fake_process.control("POST", "config", {"chunk_delay": 0, "text_chunk_chars": 16})


async def test_two_processes_share_runs_events_and_leases(
    database_url: str, service: Service, fake_process: Fake, tmp_path: Path
) -> None:
    fake_process.control("POST", "reset")
    other = Service(
        database_url,
        fake_process.url,
        PARLEY_RUN_LEASE_SECONDS="2",
        PARLEY_REAPER_INTERVAL_SECONDS="0.5",
    )
    try:
        async with service.client() as a, other.client() as b:
            fake_process.control("POST", "config", {"chunk_delay": 0.1, "text_chunk_chars": 4})
            fake_process.script(items.message("streamed by process A, followed from process B"))
            sid = (await a.post("/sessions", json={})).json()["id"]
            run = (
                await a.post(f"/sessions/{sid}/messages", json={"content": "x", "background": True})
            ).json()
            # B follows A's run live (LISTEN/NOTIFY), and B refuses a concurrent turn.
            refused = await b.post(f"/sessions/{sid}/messages", json={"content": "y"})
            assert refused.status_code == 409
            events = await stream(b, "GET", f"/sessions/{sid}/runs/{run['id']}/events")
            assert_gap_free(events)
            assert names(events)[-1] == "run.completed"
            text = "".join(e.json["text"] for e in events if e.event == "text.delta")
            assert text == "streamed by process A, followed from process B"

            # A process dies mid-run: its lease expires and the survivor resumes the run.
            fake_process.control("POST", "config", {"chunk_delay": 0.3})
            fake_process.script(items.message("this reply is cut off " * 5))
            sid2 = (await b.post("/sessions", json={})).json()["id"]
            doomed = (
                await b.post(
                    f"/sessions/{sid2}/messages", json={"content": "x", "background": True}
                )
            ).json()
            await stream(b, "GET", f"/sessions/{sid2}/runs/{doomed['id']}/events", limit=3)
            other.stop(signal.SIGKILL)
            fake_process.control("POST", "config", {"chunk_delay": 0})
            tail = await stream(a, "GET", f"/sessions/{sid2}/runs/{doomed['id']}/events")
            assert names(tail)[-1] == "run.completed"
            assert "message.discarded" in names(tail)
            status = (await a.get(f"/sessions/{sid2}/runs/{doomed['id']}")).json()
            assert status["status"] == "completed"
            user_turn = (await a.get(f"/sessions/{sid2}/messages")).json()["data"][0]
            assert user_turn["content"][0]["text"] == "x"  # nothing the client sent is lost
    finally:
        other.stop(signal.SIGKILL)
        fake_process.control("POST", "config", {"chunk_delay": 0, "text_chunk_chars": 16})


async def test_graceful_shutdown_tells_streams_to_reconnect(
    database_url: str, fake_process: Fake
) -> None:
    fake_process.control("POST", "reset")
    server = Service(database_url, fake_process.url, PARLEY_SHUTDOWN_GRACE_SECONDS="1")
    try:
        fake_process.script(items.message(items.tool_use("get_weather", {}, id="t1")))
        async with server.client() as c:
            sid = (await c.post("/sessions", json={"tools": [WEATHER]})).json()["id"]
            run = (await c.post(f"/sessions/{sid}/messages", json={"content": "x"})).json()["run"]
            assert run["status"] == "requires_action"
            fake_process.script(items.message("late", delay=30))
            await c.post(
                f"/sessions/{sid}/runs/{run['id']}/tool_results",
                json={"results": [{"tool_use_id": "t1"}], "background": True},
            )
            collected: list[Any] = []

            async def follow() -> None:
                collected.extend(await stream(c, "GET", f"/sessions/{sid}/runs/{run['id']}/events"))

            follower = asyncio.create_task(follow())
            await asyncio.sleep(0.5)
            server.stop(signal.SIGTERM)
            await asyncio.wait_for(follower, 30)
        last = collected[-1]
        assert last.event in ("error", "run.failed")
    finally:
        server.stop(signal.SIGKILL)
