"""Posting turns over HTTP against the fake Anthropic API through the real SDK: client
tools over the routes, reconnects, `if_busy`, idempotency, delivery modes, branches.
The loop itself is tested below HTTP (tests/engine)."""

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
    stream,
)


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


async def test_busy_session_refuses_enqueues_and_interrupts(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """`if_busy` over HTTP; the engine tests cover the runs themselves. A run paused
    for a client tool holds the session without anything to wait for."""
    weather = {"name": "get_weather", "input_schema": {"type": "object"}}
    fake.script(
        items.message(items.tool_use("get_weather", {}, id="toolu_w")),
        "after interrupt",
        "queued reply",
    )
    async with live_fake.client() as client:
        sid = await new_session(client, tools=[weather])
        first = (await client.post(f"/sessions/{sid}/messages", json={"content": "one"})).json()
        assert first["run"]["status"] == "requires_action"
        held = first["run"]["id"]
        busy = await client.post(f"/sessions/{sid}/messages", json={"content": "two"})
        assert busy.status_code == 409
        assert busy.json()["run_id"] == held
        assert held in busy.json()["detail"]
        queued = await client.post(
            f"/sessions/{sid}/messages",
            json={"content": "two", "if_busy": "enqueue", "background": True},
        )
        assert queued.status_code == 202
        assert queued.json()["status"] == "queued"
        new = await client.post(
            f"/sessions/{sid}/messages", json={"content": "three", "if_busy": "interrupt"}
        )
        assert new.status_code == 200, new.text
        assert new.json()["run"]["status"] == "completed"
        old = (await client.get(f"/sessions/{sid}/runs/{held}")).json()
        assert old["status"] == "cancelled"
        # The queued turn starts once the session is free.
        rest = await stream(client, "GET", f"/sessions/{sid}/runs/{queued.json()['id']}/events")
        assert names(rest)[-1] == "run.completed"
        texts = [m["content"][0].get("text") for m in await messages(client, sid)]
        assert texts == ["one", None, None, "three", "after interrupt", "two", "queued reply"]
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


async def test_a_regeneration_repeated_with_its_key_is_one_run(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """A client whose connection dropped re-posts the regeneration with the same key: it
    gets the same run, and the tree one new reply, not two."""
    fake.script("first answer", "second answer", "third answer")
    async with live_fake.client() as client:
        sid = await new_session(client)
        first = (await client.post(f"/sessions/{sid}/messages", json={"content": "q"})).json()
        reply = first["messages"][1]
        path = f"/sessions/{sid}/messages/{reply['uuid']}/regenerate"
        key = {"Idempotency-Key": "regen-1"}
        once = await client.post(path, json={}, headers=key)
        again = await client.post(path, json={}, headers=key)
        assert once.status_code == again.status_code == 200
        assert once.json()["run"]["id"] == again.json()["run"]["id"]
        tree = (await client.get(f"/sessions/{sid}/tree")).json()["data"]
        assert len(tree) == 3  # the question and two sibling replies
        sibling = once.json()["messages"][-1]["uuid"]
        reused = await client.post(
            f"/sessions/{sid}/messages/{sibling}/regenerate", json={}, headers=key
        )
        assert reused.status_code == 422  # the key was used for another regeneration
        assert reused.json()["errors"][0]["loc"] == ["header", "Idempotency-Key"]


async def test_wait_mode_answers_what_is_stored(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    """The 200 answer of a turn run by the process that admitted it comes from memory:
    it equals the stored run and the messages the run stored, finished or paused."""
    weather = {"name": "get_weather", "input_schema": {"type": "object"}}
    fake.script(
        items.message(items.tool_use("Glob", {"pattern": "*"}, id="toolu_glob")),
        "No files here.",
        items.message(items.tool_use("get_weather", {}, id="toolu_w")),
    )
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Glob"], tools=[weather])
        seen = 0
        for text, status in (("list files", "completed"), ("weather?", "requires_action")):
            answer = await client.post(f"/sessions/{sid}/messages", json={"content": text})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["run"]["status"] == status
            stored = await client.get(f"/sessions/{sid}/runs/{body['run']['id']}")
            assert body["run"] == stored.json()
            chain = await messages(client, sid)
            assert body["messages"] == chain[seen:]
            seen = len(chain)
        assert [m["role"] for m in chain] == ["user", "assistant"] * 3
    all_accepted(fake)
