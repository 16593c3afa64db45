"""A turn the model API refuses as invalid does not poison the session: the run fails
with the API's message, the refused user message stays in the tree marked `refused`,
the head goes back to its parent, and later turns are sent without it. A transient
failure (retries used up) keeps the turn at the head, as before."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import all_accepted, assert_next_request_valid, messages, new_session


async def post(client: httpx.AsyncClient, sid: str, content: Any) -> dict[str, Any]:
    response = await client.post(f"/sessions/{sid}/messages", json={"content": content})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def head_of(client: httpx.AsyncClient, sid: str) -> str | None:
    return (await client.get(f"/sessions/{sid}")).json()["head_uuid"]  # type: ignore[no-any-return]


async def tree(client: httpx.AsyncClient, sid: str) -> dict[str, dict[str, Any]]:
    page = (await client.get(f"/sessions/{sid}/tree", params={"limit": 1000})).json()
    return {node["uuid"]: node for node in page["data"]}


def texts_sent(body: dict[str, Any]) -> list[str]:
    return [
        block.get("text", block["type"])
        for message in body["messages"]
        for block in (
            message["content"]
            if isinstance(message["content"], list)
            else [{"type": "text", "text": message["content"]}]
        )
    ]


async def test_refused_turns_leave_the_chain(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.script("Hello.")
    async with live_fake.client() as client:
        sid = await new_session(client)
        first = await post(client, sid, "hi")
        reply = first["messages"][-1]["uuid"]
        # The API answers 400 invalid_request_error (a bogus image, say: Parley checks
        # images itself now, so the fake is told to refuse).
        refusal = "messages.2.content.1: the image does not appear to be a valid png image"
        fake.script(items.error(400, refusal))
        bad = await post(
            client, sid, [{"type": "text", "text": "look"}, {"type": "text", "text": "here"}]
        )
        run = bad["run"]
        assert run["status"] == "failed"
        assert run["error"]["type"] == "request_refused"
        assert refusal in run["error"]["message"]
        refused = run["user_message_uuid"]
        assert await head_of(client, sid) == reply
        nodes = await tree(client, sid)
        assert nodes[refused]["subtype"] == "refused"
        assert nodes[refused]["parent_uuid"] == reply
        marked = (await client.get(f"/sessions/{sid}/messages/{refused}")).json()
        assert marked["subtype"] == "refused"
        assert marked["content"][1]["text"] == "here"  # nothing the client sent is lost
        # An oversized message: the API answers 413 request_too_large.
        fake.configure(max_request_bytes=20_000)
        big = await post(client, sid, "x" * 30_000)
        assert big["run"]["error"]["type"] == "request_refused"
        assert await head_of(client, sid) == reply
        assert (await tree(client, sid))[big["run"]["user_message_uuid"]]["subtype"] == "refused"
        # The session goes on without them.
        after = await post(client, sid, "again")
        assert after["run"]["status"] == "completed", after
        assert texts_sent(fake.requests[-1]) == ["hi", "Hello.", "again"]
        chain = await messages(client, sid)
        assert [m["uuid"] for m in chain][:2] == [first["messages"][0]["uuid"], reply]
        assert all(m["subtype"] != "refused" for m in chain)
        await assert_next_request_valid(client, sid)
    # The 413 was the fake's validation doing its job; everything else was valid.
    assert len(fake.rejections) == 1


async def test_transient_failure_keeps_the_turn(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.script(*[items.overloaded() for _ in range(10)])
    async with live_fake.client() as client:
        sid = await new_session(client)
        failed = await post(client, sid, "hi")
        assert failed["run"]["status"] == "failed"
        assert failed["run"]["error"]["type"] == "upstream_error"
        user = failed["run"]["user_message_uuid"]
        assert await head_of(client, sid) == user
        assert (await tree(client, sid))[user]["subtype"] is None
    all_accepted(fake)
