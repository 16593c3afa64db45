"""Run lifecycle over HTTP: the cancel route, a dead process's run followed and reaped,
thinking and prompt caching on the wire, pings, deleting a busy session. Cancelling
mid-stream, shutdown and expiry are tested below HTTP (tests/engine)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.models import Run, RunEvent
from tests.conftest import LiveServer, live_server, on_fake
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import (
    all_accepted,
    assert_gap_free,
    assert_next_request_valid,
    messages,
    names,
    new_session,
    post_stream,
    stream,
)

WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}


async def test_cancel_requires_action_answers_open_tools(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(items.message(items.tool_use("get_weather", {}, id="toolu_w")))
    async with live_fake.client() as client:
        sid = await new_session(client, tools=[WEATHER])
        first = await post_stream(client, sid, "weather")
        run = first[-1].json
        assert run["status"] == "requires_action"
        cancelled = (await client.post(f"/sessions/{sid}/runs/{run['id']}/cancel")).json()
        assert cancelled["status"] == "cancelled"
        assert cancelled["required_action"] is None
        stored = await messages(client, sid)
        result = stored[-1]["content"][0]
        assert result["type"] == "tool_result"
        assert result["tool_use_id"] == "toolu_w"
        assert result["is_error"] is True
        events = await stream(client, "GET", f"/sessions/{sid}/runs/{run['id']}/events")
        assert names(events)[-1] == "run.cancelled"
        assert_gap_free(events)
        await assert_next_request_valid(client, sid)


async def _dead_run(engine: AsyncEngine, sid: str, **values: object) -> uuid.UUID:
    """A running run left by a dead process (lease expired) with a stored prefix of events;
    its owner was streaming a message that was never stored."""
    run_id = uuid.uuid4()
    async with AsyncSession(engine) as db:
        run = Run(
            id=run_id,
            session_id=uuid.UUID(sid),
            kind="turn",
            status="running",
            worker_id="dead-host:1",
            params={},
            state={},
            usage={},
            epoch=1,
            last_event_seq=2,
            reserved_seq=9,
            streaming_uuid=uuid.uuid4(),
            lease_expires_at=datetime.now(UTC) - timedelta(seconds=1),
            **values,
        )
        db.add(run)
        await db.flush()
        db.add(RunEvent(run_id=run.id, seq=1, event="run.started", data="{}"))
        db.add(RunEvent(run_id=run.id, seq=2, event="text.delta", data='{"text":"hi"}'))
        await db.commit()
    return run_id


async def test_run_of_a_dead_process_is_resumed(live: LiveServer, engine: AsyncEngine) -> None:
    """A run whose lease expired (its process died) is taken over and completes; the new
    owner's ids start after the reserved block, and it withdraws the cut-off message."""
    async with live.client() as client:
        sid = await new_session(client)
        run_id = await _dead_run(engine, sid)
        events = await stream(client, "GET", f"/sessions/{sid}/runs/{run_id}/events")
        assert names(events)[:3] == ["run.started", "text.delta", "message.discarded"]
        assert names(events)[-1] == "run.completed"
        ids = [int(e.id) for e in events]
        assert ids[:3] == [1, 2, 10]  # 3..9 were reserved by the dead owner: never reused
        assert_gap_free(events[2:], start=10)
        replay = await stream(
            client, "GET", f"/sessions/{sid}/runs/{run_id}/events", headers={"Last-Event-ID": "5"}
        )
        assert [e.id for e in replay] == [e.id for e in events[2:]]  # from the next stored id
        run = (await client.get(f"/sessions/{sid}/runs/{run_id}")).json()
        assert run["status"] == "completed"


async def test_run_taken_over_too_often_fails(live: LiveServer, engine: AsyncEngine) -> None:
    """Past max_takeovers a dead process's run fails and frees the session."""
    async with live.client() as client:
        sid = await new_session(client)
        run_id = await _dead_run(engine, sid, takeovers=live.runtime.settings.max_takeovers)
        events = await stream(client, "GET", f"/sessions/{sid}/runs/{run_id}/events")
        assert names(events) == ["run.started", "text.delta", "run.failed"]
        assert events[-1].id == "10"
        assert events[-1].json["error"]["type"] == "interrupted"
        reply = await client.post(f"/sessions/{sid}/messages", json={"content": "again"})
        assert reply.json()["run"]["status"] == "completed"


async def test_thinking_blocks_round_trip_verbatim(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(
        items.message(items.thinking("let me think"), items.tool_use("Glob", {"pattern": "*"})),
        items.message(items.thinking("done thinking"), "answer"),
    )
    async with live_fake.client() as client:
        sid = await new_session(
            client,
            builtin_tools=["Glob"],
            model="claude-opus-4-5",
            thinking={"type": "enabled", "budget_tokens": 2048},
            max_tokens=8000,
        )
        events = await post_stream(client, sid, "think")
        assert names(events)[-1] == "run.completed"
        assert "thinking.delta" in names(events)
    second = fake.requests[1]
    assert second["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assistant = second["messages"][1]
    assert assistant["content"][0]["type"] == "thinking"
    assert assistant["content"][0]["thinking"] == "let me think"
    assert assistant["content"][0]["signature"]
    all_accepted(fake)


async def test_prompt_cache_is_read_turn_after_turn(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.configure(min_cache_tokens=256)
    system = "You are a careful assistant. " * 200
    async with live_fake.client() as client:
        sid = await new_session(client, system=system, builtin_tools=["Read", "Glob"])
        for i in range(4):
            body = (
                await client.post(
                    f"/sessions/{sid}/messages", json={"content": f"question {i} " * 30}
                )
            ).json()
            assert body["run"]["status"] == "completed"
        usage = (await client.get(f"/sessions/{sid}")).json()["usage"]
    reads = [u["cache_read_input_tokens"] for u in fake.usages]
    assert reads[0] == 0
    assert all(r > 0 for r in reads[1:]), reads
    assert usage["cache_read_input_tokens"] == sum(reads)
    for request in fake.requests:
        marks = sum(1 for m in request["messages"] for b in m["content"] if "cache_control" in b)
        marks += sum(1 for b in request.get("system", []) if "cache_control" in b)
        marks += sum(1 for t in request.get("tools", []) if "cache_control" in t)
        assert marks <= 4
    all_accepted(fake)


async def test_pings_and_bad_last_event_id(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    fake.script(items.message(items.tool_use("get_weather", {}, id="t1")))
    async with (
        live_server(
            database_url,
            engine,
            sse_ping_seconds=0.2,
            **on_fake(fake),
        ) as server,
        server.client() as client,
    ):
        sid = await new_session(client, tools=[WEATHER])
        run = (await post_stream(client, sid, "x"))[-1].json
        url = f"/sessions/{sid}/runs/{run['id']}/events"
        bad = await client.get(url, headers={"Last-Event-ID": "abc"})
        assert bad.status_code == 422
        # A paused run's stream ends; a following client waits with pings meanwhile.
        fake.script(items.message("done", delay=0.7))
        async with client.stream(
            "POST",
            f"/sessions/{sid}/runs/{run['id']}/tool_results",
            json={"results": [{"tool_use_id": "t1"}], "stream": True},
        ) as r:
            raw = (await r.aread()).decode()
        assert ": ping" in raw
        assert "event: run.completed" in raw


async def test_delete_session_with_active_run(
    live_fake: LiveServer, fake: FakeAnthropic, engine: AsyncEngine
) -> None:
    fake.script(items.message("slow", delay=2))
    async with live_fake.client() as client:
        sid = await new_session(client)
        run = (
            await client.post(
                f"/sessions/{sid}/messages", json={"content": "x", "background": True}
            )
        ).json()
        await asyncio.sleep(0.1)
        assert (await client.delete(f"/sessions/{sid}")).status_code == 204
        assert (await client.get(f"/sessions/{sid}")).status_code == 404
    async with AsyncSession(engine) as db:
        assert await db.scalar(select(Run).where(Run.id == uuid.UUID(run["id"]))) is None
