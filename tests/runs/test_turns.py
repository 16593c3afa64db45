"""Posting turns against the fake Anthropic API through the real SDK: streaming, tools,
client tools, reconnects, modes."""

from __future__ import annotations

import asyncio

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
    stream,
)


async def test_streamed_multi_tool_turn(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.script(
        items.message(
            "I'll write then read.",
            items.tool_use("Write", {"file_path": "notes/a.txt", "content": "alpha\nbeta\n"}),
        ),
        items.message(
            items.tool_use("Read", {"file_path": "notes/a.txt"}),
            items.tool_use("Grep", {"pattern": "beta", "output_mode": "content"}),
        ),
        items.message("Done: the file has two lines."),
    )
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Read", "Write", "Grep"], system="sys")
        events = await post_stream(client, sid, "write a file")
    assert_gap_free(events)
    seq = names(events)
    assert seq[0] == "run.started"
    assert seq[1] == "message.completed"  # the user's message, as stored
    assert seq[-1] == "run.completed"
    assert seq.count("message.started") == 3
    assert seq.count("tool_use") == 3
    assert seq.count("tool_result") == 3
    text = "".join(e.json["text"] for e in events if e.event == "text.delta")
    assert text == "I'll write then read.Done: the file has two lines."
    results = [e.json for e in events if e.event == "tool_result"]
    assert not any(r["is_error"] for r in results), results
    assert "1\talpha" in results[1]["content"]
    assert "notes/a.txt:2:beta" in results[2]["content"]
    # Every delta belongs to a message that was then stored with the same uuid.
    completed = {e.json["uuid"] for e in events if e.event == "message.completed"}
    assert {e.json["message_uuid"] for e in events if e.event == "text.delta"} <= completed
    async with live_fake.client() as client:
        stored = await messages(client, sid)
        roles = [m["role"] for m in stored]
        assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert (await client.get(f"/sessions/{sid}/files/notes/a.txt")).content == b"alpha\nbeta\n"
        session = (await client.get(f"/sessions/{sid}")).json()
        assert session["usage"]["output_tokens"] > 0
        assert session["status"] == "idle"
        await assert_next_request_valid(client, sid)
    # The third request carried both results, answering both parallel tool uses.
    last = fake.requests[-1]["messages"]
    assert [b["type"] for b in last[-1]["content"]] == ["tool_result", "tool_result"]
    all_accepted(fake)


async def test_client_tool_pauses_and_resumes(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    weather = {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    fake.script(
        items.message(
            items.tool_use("get_weather", {"city": "Oslo"}, id="toolu_client"),
            items.tool_use("Glob", {"pattern": "*"}, id="toolu_builtin"),
        ),
        items.message("It is sunny in Oslo."),
    )
    async with live_fake.client() as client:
        sid = await new_session(client, tools=[weather], builtin_tools=["Glob"])
        first = await post_stream(client, sid, "weather?")
        assert names(first)[-1] == "run.requires_action"
        run = first[-1].json
        assert run["status"] == "requires_action"
        assert run["required_action"] == {
            "type": "tool_results",
            "tool_uses": [{"id": "toolu_client", "name": "get_weather", "input": {"city": "Oslo"}}],
        }
        session = (await client.get(f"/sessions/{sid}")).json()
        assert session["status"] == "requires_action"
        # Wrong ids are refused and change nothing.
        bad = await client.post(
            f"/sessions/{sid}/runs/{run['id']}/tool_results",
            json={"results": [{"tool_use_id": "nope", "content": "x"}]},
        )
        assert bad.status_code == 422
        rest = await stream(
            client,
            "POST",
            f"/sessions/{sid}/runs/{run['id']}/tool_results",
            json={
                "results": [{"tool_use_id": "toolu_client", "content": "sunny, 21C"}],
                "stream": True,
            },
        )
        assert_gap_free(rest, start=int(first[-1].id) + 1)
        assert names(rest)[-1] == "run.completed"
        results = [e.json for e in rest if e.event == "tool_result"]
        assert [r["tool_use_id"] for r in results] == ["toolu_client", "toolu_builtin"]
        assert results[0]["content"] == "sunny, 21C"
        replay = await stream(client, "GET", f"/sessions/{sid}/runs/{run['id']}/events")
        assert [(e.id, e.event, e.data) for e in replay] == [
            (e.id, e.event, e.data) for e in first + rest
        ]
        again = await client.post(
            f"/sessions/{sid}/runs/{run['id']}/tool_results",
            json={"results": [{"tool_use_id": "toolu_client"}]},
        )
        assert again.status_code == 409
    all_accepted(fake)


async def test_reconnect_with_last_event_id_loses_nothing(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.configure(chunk_delay=0.01, text_chunk_chars=4)
    fake.script(items.message("a fairly long reply that streams in many small chunks"))
    async with live_fake.client() as client:
        sid = await new_session(client)
        started = await client.post(
            f"/sessions/{sid}/messages", json={"content": "hi", "background": True}
        )
        assert started.status_code == 202
        run_id = started.json()["id"]
        url = f"/sessions/{sid}/runs/{run_id}/events"
        head = await stream(client, "GET", url, limit=4)
        tail = await stream(client, "GET", url, headers={"Last-Event-ID": head[-1].id})
        assert_gap_free(head + tail)
        assert names(tail)[-1] == "run.completed"
        full = await stream(client, "GET", url)
        assert [(e.id, e.event, e.data) for e in full] == [
            (e.id, e.event, e.data) for e in head + tail
        ]
        by_query = await stream(client, "GET", url, params={"after": 2})
        assert by_query[0].id == "3"


async def test_second_turn_refused_then_enqueue_and_interrupt(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(
        items.message("slow one", delay=1.0),
        "queued reply",
        "third reply",
        items.message("x", delay=5),
        "after interrupt",
    )
    async with live_fake.client() as client:
        sid = await new_session(client)
        first = (
            await client.post(
                f"/sessions/{sid}/messages", json={"content": "one", "background": True}
            )
        ).json()
        busy = await client.post(f"/sessions/{sid}/messages", json={"content": "two"})
        assert busy.status_code == 409
        assert busy.json()["run_id"] == first["id"]
        assert first["id"] in busy.json()["detail"]
        queued = await client.post(
            f"/sessions/{sid}/messages",
            json={"content": "two", "if_busy": "enqueue", "background": True},
        )
        assert queued.status_code == 202
        assert queued.json()["status"] == "queued"
        done = await client.post(
            f"/sessions/{sid}/messages", json={"content": "three", "if_busy": "enqueue"}
        )
        assert done.status_code == 200
        assert done.json()["run"]["status"] == "completed"
        texts = [m["content"][0].get("text") for m in await messages(client, sid)]
        assert texts == ["one", "slow one", "two", "queued reply", "three", "third reply"]
        # interrupt: cancels the active run, then starts
        slow = (
            await client.post(
                f"/sessions/{sid}/messages", json={"content": "four", "background": True}
            )
        ).json()
        await asyncio.sleep(0.2)
        new = await client.post(
            f"/sessions/{sid}/messages", json={"content": "five", "if_busy": "interrupt"}
        )
        assert new.status_code == 200, new.text
        assert new.json()["run"]["status"] == "completed"
        old = (await client.get(f"/sessions/{sid}/runs/{slow['id']}")).json()
        assert old["status"] == "cancelled"
        await assert_next_request_valid(client, sid)
    all_accepted(fake)


async def test_idempotency_key(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    async with live_fake.client() as client:
        sid = await new_session(client)
        headers = {"Idempotency-Key": "k-1"}
        one = await client.post(
            f"/sessions/{sid}/messages", json={"content": "hi"}, headers=headers
        )
        two = await client.post(
            f"/sessions/{sid}/messages", json={"content": "hi"}, headers=headers
        )
        assert one.status_code == two.status_code == 200
        assert one.json()["run"]["id"] == two.json()["run"]["id"]
        assert len(await messages(client, sid)) == 2
        replay = await stream(
            client,
            "POST",
            f"/sessions/{sid}/messages",
            json={"content": "hi", "stream": True},
            headers=headers,
        )
        assert replay[0].event == "run.started"
        assert replay[-1].event == "run.completed"
        other = await client.post(
            f"/sessions/{sid}/messages", json={"content": "bye"}, headers=headers
        )
        assert other.status_code == 422
        assert len(await messages(client, sid)) == 2
    assert len(fake.requests) == 1


async def test_modes_and_validation(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    async with live_fake.client() as client:
        sid = await new_session(client)
        both = await client.post(
            f"/sessions/{sid}/messages", json={"content": "x", "stream": True, "background": True}
        )
        assert both.status_code == 422
        for bad in (
            {"content": ""},
            {"content": "   "},
            {"content": []},
            {"content": [{"type": "tool_result", "tool_use_id": "x"}]},
            {},
        ):
            assert (await client.post(f"/sessions/{sid}/messages", json=bad)).status_code == 422
        assert await messages(client, sid) == []
        via_accept = await stream(
            client,
            "POST",
            f"/sessions/{sid}/messages",
            json={"content": "hi"},
            headers={"Accept": "text/event-stream"},
        )
        assert names(via_accept)[-1] == "run.completed"
        missing = await client.post(
            f"/sessions/{sid}/messages",
            json={"content": "x", "parent_uuid": "00000000-0000-0000-0000-000000000000"},
        )
        assert missing.status_code == 404


async def test_edit_and_regenerate_branch(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.script("first answer", "second answer", "edited answer")
    async with live_fake.client() as client:
        sid = await new_session(client)
        first = (await client.post(f"/sessions/{sid}/messages", json={"content": "q"})).json()
        user, reply = first["messages"]
        regen = await client.post(f"/sessions/{sid}/messages/{reply['uuid']}/regenerate", json={})
        assert regen.status_code == 200, regen.text
        sibling = regen.json()["messages"][-1]
        assert sibling["parent_uuid"] == user["uuid"]
        assert sibling["content"][0]["text"] == "second answer"
        edited = await client.post(
            f"/sessions/{sid}/messages", json={"content": "q2", "parent_uuid": None}
        )
        assert edited.status_code == 200
        tree = (await client.get(f"/sessions/{sid}/tree")).json()["data"]
        assert len(tree) == 5
        bad = await client.post(f"/sessions/{sid}/messages/{user['uuid']}/regenerate", json={})
        assert bad.status_code == 422
