"""Model API faults: retries with backoff, mid-stream drops, exhausted retries, and the
limits that end a run."""

from __future__ import annotations

from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import (
    all_accepted,
    assert_gap_free,
    assert_next_request_valid,
    messages,
    names,
    new_session,
    post_stream,
)


async def test_429_and_529_are_retried(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.script(
        items.error(429, retry_after_ms=20),
        items.overloaded(),
        items.error(500),
        "made it",
    )
    async with live_fake.client() as client:
        sid = await new_session(client)
        events = await post_stream(client, sid, "hi")
    assert names(events)[-1] == "run.completed"
    assert [r["status"] for r in fake.records] == [429, 529, 500, 200]
    text = "".join(e.json["text"] for e in events if e.event == "text.delta")
    assert text == "made it"
    all_accepted(fake)


async def test_stream_broken_midway_is_discarded_and_retried(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(
        items.drop(6, "partial text that will be lost"),
        items.stream_error(5, "also lost"),
        "the whole reply",
    )
    async with live_fake.client() as client:
        sid = await new_session(client)
        events = await post_stream(client, sid, "hi")
        assert_gap_free(events)
        discarded = [e.json for e in events if e.event == "message.discarded"]
        assert len(discarded) == 2
        started = [e.json["uuid"] for e in events if e.event == "message.started"]
        assert len(started) == 3
        assert [d["uuid"] for d in discarded] == started[:2]
        assert names(events)[-1] == "run.completed"
        stored = await messages(client, sid)
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[1]["content"] == [{"type": "text", "text": "the whole reply"}]
        assert stored[1]["uuid"] == started[2]


async def test_retries_exhausted_fail_the_run_keeping_the_turn(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(*[items.overloaded() for _ in range(10)])
    async with live_fake.client() as client:
        sid = await new_session(client)
        response = await client.post(f"/sessions/{sid}/messages", json={"content": "keep me"})
        assert response.status_code == 200
        run = response.json()["run"]
        assert run["status"] == "failed"
        assert run["error"]["type"] == "upstream_error"
        assert run["error"]["request_id"].startswith("req_")
        stored = await messages(client, sid)
        assert [m["content"][0]["text"] for m in stored] == ["keep me"]
        session = (await client.get(f"/sessions/{sid}")).json()
        assert session["status"] == "idle"
        # 1 try + max_retries (4) retries
        assert len([r for r in fake.records if r["status"] == 529]) == 5
        # The session goes on: the next turn answers (and carries the kept message).
        fake.reset()
        again = await client.post(f"/sessions/{sid}/messages", json={"content": "retry"})
        assert again.json()["run"]["status"] == "completed"
        assert len(fake.requests[-1]["messages"]) == 1  # both user turns merged into one


async def test_bad_request_is_not_retried(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.script(items.error(400, "some invalid_request_error"), "unused")
    async with live_fake.client() as client:
        sid = await new_session(client)
        run = (await client.post(f"/sessions/{sid}/messages", json={"content": "x"})).json()["run"]
    assert run["status"] == "failed"
    assert run["error"]["type"] == "upstream_error"
    assert len(fake.records) == 1


async def test_max_tokens_is_continued_and_cut_tool_use_answered(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(
        items.message("part one, ", stop_reason="max_tokens"),
        items.message("part two.", stop_reason="end_turn"),
    )
    async with live_fake.client() as client:
        sid = await new_session(client)
        body = (await client.post(f"/sessions/{sid}/messages", json={"content": "x"})).json()
        assert body["run"]["status"] == "completed"
        roles = [(m["role"], m["is_meta"]) for m in body["messages"]]
        assert roles == [
            ("user", False),
            ("assistant", False),
            ("user", True),
            ("assistant", False),
        ]
        await assert_next_request_valid(client, sid)
    all_accepted(fake)


async def test_max_tokens_bound_ends_completed(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.script(*[items.message(f"chunk {i} ", stop_reason="max_tokens") for i in range(6)])
    async with live_fake.client() as client:
        sid = await new_session(client)
        body = (await client.post(f"/sessions/{sid}/messages", json={"content": "x"})).json()
    assert body["run"]["status"] == "completed"
    assert body["messages"][-1]["stop_reason"] == "max_tokens"
    # the first reply plus max_continuations (3) continuations
    assert len(fake.requests) == 4


async def test_model_call_limit_ends_a_runaway_loop(
    database_url: str, engine: object, fake: FakeAnthropic
) -> None:
    from tests.conftest import live_server, on_fake

    fake.responder = lambda body: items.message(items.tool_use("Glob", {"pattern": "*"}))
    async with (
        live_server(
            database_url,
            engine,
            **on_fake(fake),
            max_model_calls_per_run=3,
        ) as server,
        server.client() as client,
    ):
        sid = await new_session(client, builtin_tools=["Glob"])
        body = (await client.post(f"/sessions/{sid}/messages", json={"content": "loop"})).json()
        assert body["run"]["status"] == "failed"
        assert body["run"]["error"]["type"] == "model_call_limit"
        assert "3 model calls" in body["run"]["error"]["message"]
        await assert_next_request_valid(client, sid)
    assert len(fake.requests) == 3


async def test_unknown_tool_gets_an_error_result(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(items.message(items.tool_use("Bash", {"command": "ls"})), "ok, no bash")
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Read"])
        events = await post_stream(client, sid, "run ls")
    result = next(e.json for e in events if e.event == "tool_result")
    assert result["is_error"] is True
    assert "Bash" in result["content"]
    all_accepted(fake)
