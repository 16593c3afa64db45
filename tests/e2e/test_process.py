"""End to end: the service and the fake Anthropic API each in their own process, driven
by a real HTTP client reading SSE (httpx + httpx-sse). Two service processes share one
database to show that runs, events and leases hold across processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_KEY, free_port
from tests.fake_anthropic import items
from tests.runs.helpers import assert_gap_free, names, stream

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


class Fake:
    def __init__(self, tmp: Path) -> None:
        port_file = tmp / "fake.port"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fake_anthropic",
                "--port",
                "0",
                "--port-file",
                str(port_file),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert self.proc.poll() is None, self.proc.stdout.read() if self.proc.stdout else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text().strip()}"

    def control(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx.request(method, f"{self.url}/_fake/{path}", json=body, timeout=10)
        response.raise_for_status()
        return response.json()

    def script(self, *entries: Any) -> None:
        self.control("POST", "script", list(entries))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Service:
    def __init__(self, database_url: str, fake_url: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "PARLEY_API_KEYS": f"tenant-a:{TEST_KEY}",
            "ANTHROPIC_API_KEY": "test-key",
            "ANTHROPIC_BASE_URL": fake_url,
            "PARLEY_RETRY_BASE_SECONDS": "0.01",
            "PARLEY_RETRY_MAX_SECONDS": "0.05",
            "PARLEY_LOG_LEVEL": "WARNING",
            **env,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(self.port)],
            cwd=ROOT,
            env=self.env,
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, "the service exited"
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the service did not become ready"
            time.sleep(0.1)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {TEST_KEY}"}
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


@pytest.fixture(scope="module")
def fake_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fake]:
    fake = Fake(tmp_path_factory.mktemp("fake"))
    yield fake
    fake.stop()


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
            fake_process.control("POST", "config", {"chunk_delay": 0.02, "text_chunk_chars": 4})
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

            # A process dies mid-run: its lease expires and the survivor fails the run.
            fake_process.control("POST", "config", {"chunk_delay": 0.3})
            fake_process.script(items.message("this reply never finishes " * 5))
            sid2 = (await b.post("/sessions", json={})).json()["id"]
            doomed = (
                await b.post(
                    f"/sessions/{sid2}/messages", json={"content": "x", "background": True}
                )
            ).json()
            await stream(b, "GET", f"/sessions/{sid2}/runs/{doomed['id']}/events", limit=3)
            other.stop(signal.SIGKILL)
            deadline = time.monotonic() + 30
            while True:
                status = (await a.get(f"/sessions/{sid2}/runs/{doomed['id']}")).json()
                if status["status"] == "failed":
                    break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            assert status["error"]["type"] == "interrupted"
            tail = await stream(a, "GET", f"/sessions/{sid2}/runs/{doomed['id']}/events")
            assert_gap_free(tail)
            assert names(tail)[-1] == "run.failed"
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
