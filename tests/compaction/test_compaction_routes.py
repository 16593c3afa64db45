"""Compaction over HTTP: the manual compaction route's answers (422, 502, 409) and the
context report. The compaction layers themselves run in real turns below HTTP
(tests/engine/test_compaction.py)."""

from __future__ import annotations

from typing import Any

from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import messages, new_session


def agent_responder(body: dict[str, Any]) -> dict[str, Any]:
    """Read a file, then answer."""
    last = body["messages"][-1]["content"]
    if any(b.get("type") == "tool_result" for b in last):
        return items.message("I read it.")
    n = len(body["messages"])
    return items.message(items.tool_use("Read", {"file_path": f"f{n % 3}.txt"}))


async def seed_files(client: Any, sid: str, size: int = 6000) -> None:
    for i in range(3):
        line = f"line {i} " + "x" * 60 + "\n"
        body = (line * (size // len(line))).encode()
        assert (
            await client.put(f"/sessions/{sid}/files/f{i}.txt", content=body)
        ).status_code == 201


async def test_manual_compaction_refusals_and_upstream_failure(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    weather = {"name": "get_weather", "input_schema": {"type": "object"}}
    async with live_fake.client() as client:
        sid = await new_session(client, tools=[weather])
        nothing = await client.post(f"/sessions/{sid}/compact", json={})
        assert nothing.status_code == 422
        for i in range(6):  # long enough that compacting would gain
            await client.post(f"/sessions/{sid}/messages", json={"content": f"turn {i} " * 600})
        before = await messages(client, sid)
        fake.script(items.error(400, "summary refused"))
        failed = await client.post(f"/sessions/{sid}/compact", json={})
        assert failed.status_code == 502
        assert failed.json()["type"] == "upstream_error"
        assert await messages(client, sid) == before
        # A run paused for a client tool holds the session.
        fake.script(items.message(items.tool_use("get_weather", {})))
        paused = await client.post(f"/sessions/{sid}/messages", json={"content": "x"})
        assert paused.json()["run"]["status"] == "requires_action"
        busy = await client.post(f"/sessions/{sid}/compact", json={})
        assert busy.status_code == 409


async def test_context_report(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.responder = agent_responder
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Read"], system="be brief")
        await seed_files(client, sid)
        await client.post(f"/sessions/{sid}/messages", json={"content": "read"})
        report = (await client.get(f"/sessions/{sid}/context")).json()
        assert report["context_window"] == 1_000_000
        assert report["auto_compact_threshold"] == 967_000
        assert report["breakdown"]["tool_results"] > report["breakdown"]["system"] > 0
        assert report["breakdown"]["tools"] > 0
        assert 0 < report["percent_used"] < 100
        assert report["estimated_tokens"] > 0
        assert report["last_compaction"] is None
