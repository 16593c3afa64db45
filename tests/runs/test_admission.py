"""Exactly-once admission under real concurrency: many posts racing on one session through
HTTP against a live server on Postgres, with the exact counts the database must decide."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import all_accepted, messages, new_session

WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}


async def settled_runs(client: httpx.AsyncClient, sid: str, count: int) -> list[dict[str, Any]]:
    """The session's runs, oldest first, once `count` of them have finished."""
    for _ in range(600):
        page = (await client.get(f"/sessions/{sid}/runs", params={"limit": 500})).json()
        runs = page["data"]
        if len(runs) == count and all(r["finished_at"] for r in runs):
            return list(reversed(runs))
        await asyncio.sleep(0.05)
    raise AssertionError(f"runs did not settle: {runs}")


async def test_concurrent_enqueue_posts_are_all_queued_in_order(live: LiveServer) -> None:
    async with live.client() as client:
        sid = await new_session(client)
        posts = await asyncio.gather(
            *(
                client.post(
                    f"/sessions/{sid}/messages",
                    json={"content": f"m{i}", "if_busy": "enqueue", "background": True},
                )
                for i in range(30)
            )
        )
        assert [p.status_code for p in posts] == [202] * 30, [p.text for p in posts]
        assert len({p.json()["id"] for p in posts}) == 30
        statuses = sorted(p.json()["status"] for p in posts)
        assert statuses == ["queued"] * 29 + ["running"]
        runs = await settled_runs(client, sid, 30)
        assert [r["status"] for r in runs] == ["completed"] * 30
        # Each turn ran after the one admitted before it: the chain holds the user
        # messages in the order the runs were created, each followed by its reply.
        chain = await messages(client, sid)
        users = [m for m in chain if m["role"] == "user"]
        assert [m["uuid"] for m in users] == [r["user_message_uuid"] for r in runs]
        assert [m["role"] for m in chain] == ["user", "assistant"] * 30


async def test_concurrent_posts_with_one_key_get_one_run(live: LiveServer) -> None:
    async with live.client() as client:
        sid = await new_session(client)
        posts = await asyncio.gather(
            *(
                client.post(
                    f"/sessions/{sid}/messages",
                    json={"content": "once", "if_busy": "enqueue", "background": True},
                    headers={"Idempotency-Key": "same-key"},
                )
                for _ in range(10)
            )
        )
        assert [p.status_code for p in posts] == [202] * 10, [p.text for p in posts]
        assert len({p.json()["id"] for p in posts}) == 1
        [run] = await settled_runs(client, sid, 1)
        assert run["status"] == "completed"
        assert [m["role"] for m in await messages(client, sid)] == ["user", "assistant"]
        # The same races without `if_busy` (reject): still one run, no 409, no 500.
        posts = await asyncio.gather(
            *(
                client.post(
                    f"/sessions/{sid}/messages",
                    json={"content": "twice", "background": True},
                    headers={"Idempotency-Key": "other-key"},
                )
                for _ in range(10)
            )
        )
        assert [p.status_code for p in posts] == [202] * 10, [p.text for p in posts]
        assert len({p.json()["id"] for p in posts}) == 1
        await settled_runs(client, sid, 2)
        assert len(await messages(client, sid)) == 4


async def test_bad_idempotency_keys_are_refused_and_store_nothing(live: LiveServer) -> None:
    async with live.client() as client:
        sid = await new_session(client)
        for key in (b"", b"k" * 256, b"caf\xc3\xa9", b"with space", b"tab\there"):
            response = await client.post(
                f"/sessions/{sid}/messages",
                json={"content": "hi"},
                headers={"Idempotency-Key": key},
            )
            assert response.status_code == 422, (key, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            locs = [e["loc"] for e in response.json()["errors"]]
            assert locs == [["header", "Idempotency-Key"]], (key, locs)
        assert await messages(client, sid) == []
        # The longest key allowed works, and the session takes turns as before.
        for key in (b"k" * 255, None, None):
            headers = {"Idempotency-Key": key} if key is not None else {}
            ok = await client.post(
                f"/sessions/{sid}/messages", json={"content": "hi"}, headers=headers
            )
            assert ok.status_code == 200, ok.text
            assert ok.json()["run"]["status"] == "completed"


async def test_concurrent_tool_results_are_accepted_once(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    fake.script(
        items.message(items.tool_use("get_weather", {}, id="toolu_w")),
        items.message("Sunny, then."),
    )
    async with live_fake.client() as client:
        sid = await new_session(client, tools=[WEATHER])
        paused = (await client.post(f"/sessions/{sid}/messages", json={"content": "w?"})).json()
        run = paused["run"]
        assert run["status"] == "requires_action"
        url = f"/sessions/{sid}/runs/{run['id']}/tool_results"
        body = {"results": [{"tool_use_id": "toolu_w", "content": "sunny"}]}
        posts = await asyncio.gather(*(client.post(url, json=body) for _ in range(10)))
        assert [p.status_code for p in posts] == [200] * 10, [p.text for p in posts]
        # Every post answers as the accepted one: the run and the messages it stored.
        answers = [p.json() for p in posts]
        assert all(a["run"]["status"] == "completed" for a in answers)
        assert all(a["messages"] == answers[0]["messages"] for a in answers)
        assert [m["role"] for m in answers[0]["messages"]] == ["user", "assistant"]
        chain = await messages(client, sid)
        results = [m for m in chain if m["content"][0]["type"] == "tool_result"]
        assert len(results) == 1
        assert results[0]["content"][0]["content"] == "sunny"
        assert len(fake.requests) == 2
        # Later: the same body answers the same; other results for those calls are a 409.
        again = await client.post(url, json=body)
        assert again.status_code == 200
        assert again.json()["messages"] == answers[0]["messages"]
        other = await client.post(
            url, json={"results": [{"tool_use_id": "toolu_w", "content": "rain"}]}
        )
        assert other.status_code == 409, other.text
        assert other.headers["content-type"] == "application/problem+json"
        assert other.json()["type"] == "conflict"
        assert len(await messages(client, sid)) == len(chain)
    all_accepted(fake)


async def test_concurrent_regenerates_with_one_key_get_one_run(live: LiveServer) -> None:
    async with live.client() as client:
        sid = await new_session(client)
        first = await client.post(f"/sessions/{sid}/messages", json={"content": "hi"})
        reply = first.json()["messages"][-1]["uuid"]
        posts = await asyncio.gather(
            *(
                client.post(
                    f"/sessions/{sid}/messages/{reply}/regenerate",
                    json={"background": True},
                    headers={"Idempotency-Key": "regen-1"},
                )
                for _ in range(10)
            )
        )
        assert [p.status_code for p in posts] == [202] * 10, [p.text for p in posts]
        assert len({p.json()["id"] for p in posts}) == 1
        runs = await settled_runs(client, sid, 2)
        assert [r["status"] for r in runs] == ["completed", "completed"]
        nodes = (await client.get(f"/sessions/{sid}/tree")).json()["data"]
        assert [n["role"] for n in nodes] == ["user", "assistant", "assistant"]


async def test_interrupting_a_streaming_run_with_a_key(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    """An interrupt stops a run executing in this process (whose last step needs the
    session row) before the post takes the row: no post waits on its own run. Posts
    with one key racing it all get the one new run."""
    fake.configure(chunk_delay=0.05, text_chunk_chars=2)
    fake.script("a slow reply " * 20, "the new turn")
    async with live_fake.client() as client:
        sid = await new_session(client)
        old = await client.post(
            f"/sessions/{sid}/messages", json={"content": "one", "background": True}
        )
        old_id = old.json()["id"]
        for _ in range(200):  # until its user message is stored: the run is streaming
            if (await client.get(f"/sessions/{sid}/messages")).json()["data"]:
                break
            await asyncio.sleep(0.05)
        posts = await asyncio.gather(
            *(
                client.post(
                    f"/sessions/{sid}/messages",
                    json={"content": "two", "if_busy": "interrupt"},
                    headers={"Idempotency-Key": "interrupt-1"},
                    timeout=15,  # well below the 30 s a post stuck on its own run would wait
                )
                for _ in range(3)
            )
        )
        assert [p.status_code for p in posts] == [200] * 3, [p.text for p in posts]
        assert len({p.json()["run"]["id"] for p in posts}) == 1
        assert posts[0].json()["run"]["status"] == "completed"
        assert (await client.get(f"/sessions/{sid}/runs/{old_id}")).json()["status"] == (
            "cancelled"
        )
