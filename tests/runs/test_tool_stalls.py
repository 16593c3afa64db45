"""Tools cannot stall the process: patterns that make a backtracking engine take
minutes run in linear time while /healthz keeps answering, and a tool call past its time
limit is stopped and answered as an error."""

from __future__ import annotations

import asyncio
import time

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import LiveServer, live_server, on_fake
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import new_session, post_stream

# Each more "a" doubles the time a backtracking engine takes: at 40, hours.
CATASTROPHIC = {"a.txt": "a" * 40 + "b\n", "a" * 200: "x"}


async def put_files(client: httpx.AsyncClient, sid: str, files: dict[str, str]) -> None:
    for path, content in files.items():
        response = await client.put(f"/sessions/{sid}/files/{path}", content=content.encode())
        assert response.status_code == 201, response.text


async def health_while(client: httpx.AsyncClient, done: asyncio.Event) -> list[float]:
    """Seconds each /healthz took, asked back to back until `done`."""
    took: list[float] = []
    while not done.is_set():
        started = time.perf_counter()
        assert (await client.get("/healthz")).status_code == 200
        took.append(time.perf_counter() - started)
        await asyncio.sleep(0.005)
    return took


def tool_results(events: list) -> list[dict]:
    results = []
    for event in events:
        if event.event == "message.completed":
            for block in event.json["content"]:
                if block.get("type") == "tool_result":
                    results.append(block)
    return results


async def test_catastrophic_patterns_leave_healthz_fast(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(
        items.message(
            items.tool_use("Grep", {"pattern": "(a+)+$"}, id="toolu_grep"),
            items.tool_use("Grep", {"pattern": "(a|aa)+$", "output_mode": "count"}, id="toolu_g2"),
            items.tool_use("Glob", {"pattern": "*a*a*a*a*a*a*a*a*ab"}, id="toolu_glob"),
        ),
        items.message("done"),
    )
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Grep", "Glob"])
        await put_files(client, sid, CATASTROPHIC)
        done = asyncio.Event()
        probe = asyncio.create_task(health_while(client, done))
        try:
            events = await post_stream(client, sid, "search")
        finally:
            done.set()
        took = await probe
    assert events[-1].event == "run.completed", events[-1].data
    results = {r["tool_use_id"]: r for r in tool_results(events)}
    assert results["toolu_grep"]["content"] == "No matches found."
    assert results["toolu_g2"]["content"] == "No matches found."
    assert results["toolu_glob"]["content"].startswith("No files found")
    assert took, "healthz was never asked while the tools ran"
    # The behaviour the issue asks for: the event loop stays free while tools run.
    assert max(took) < 0.1, took


async def test_a_tool_past_its_time_limit_is_an_error(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    fake.script(
        items.message(items.tool_use("Grep", {"pattern": "needle"}, id="toolu_slow")),
        items.message("ok"),
    )
    overrides = {**on_fake(fake), "tool_timeout_seconds": 0.001}
    big = ("hay " * 250 + "\n") * 2000  # 2 MB to read and search
    async with (
        live_server(database_url, engine, **overrides) as live,
        live.client() as client,
    ):
        sid = await new_session(client, builtin_tools=["Grep"])
        await put_files(client, sid, {f"f{i}.txt": big for i in range(3)})
        events = await post_stream(client, sid, "search")
    assert events[-1].event == "run.completed", events[-1].data
    [result] = tool_results(events)
    assert result["is_error"] is True
    assert "stopped after 0.001 seconds" in result["content"]
