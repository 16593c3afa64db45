"""Snip: messages left out of later requests, never splitting a tool pair."""

from __future__ import annotations

from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import all_accepted, assert_next_request_valid, messages, new_session


async def test_snip_rules_and_effect(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    fake.script(
        "plain answer",
        items.message(items.tool_use("Glob", {"pattern": "*"})),
        "after the tool",
        "third",
    )
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Glob"])
        await client.post(f"/sessions/{sid}/messages", json={"content": "first question"})
        await client.post(f"/sessions/{sid}/messages", json={"content": "use a tool"})
        chain = await messages(client, sid)
        # user, assistant, user, assistant(tool_use), user(tool_result), assistant
        uses, results = chain[3]["uuid"], chain[4]["uuid"]
        split = await client.post(f"/sessions/{sid}/snip", json={"uuids": [uses]})
        assert split.status_code == 409
        assert "tool_use" in split.json()["detail"]
        first_only = await client.post(f"/sessions/{sid}/snip", json={"uuids": [chain[0]["uuid"]]})
        assert first_only.status_code == 409  # the view would start with the assistant
        ok = await client.post(
            f"/sessions/{sid}/snip", json={"uuids": [chain[0]["uuid"], chain[1]["uuid"]]}
        )
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"snipped": [chain[0]["uuid"], chain[1]["uuid"]]}
        pair = await client.post(f"/sessions/{sid}/snip", json={"uuids": [uses, results]})
        assert pair.status_code == 200
        api_view = [m["uuid"] for m in await messages(client, sid, view="api")]
        assert chain[0]["uuid"] not in api_view
        assert uses not in api_view
        assert len(await messages(client, sid, view="full")) == 6
        await client.post(f"/sessions/{sid}/messages", json={"content": "next"})
        sent = str(fake.requests[-1]["messages"])
        assert "first question" not in sent
        assert "use a tool" in sent
        forked = (await client.post(f"/sessions/{sid}/fork", json={})).json()
        forked_view = await messages(client, forked["id"], view="api")
        assert "first question" not in str(forked_view)
        missing = await client.post(
            f"/sessions/{sid}/snip", json={"uuids": ["00000000-0000-0000-0000-000000000000"]}
        )
        assert missing.status_code == 404
        await assert_next_request_valid(client, sid)
    all_accepted(fake)


async def test_snip_refuses_compaction_rows(live_fake: LiveServer, fake: FakeAnthropic) -> None:
    async with live_fake.client() as client:
        sid = await new_session(client)
        for i in range(6):
            await client.post(f"/sessions/{sid}/messages", json={"content": f"turn {i} " * 200})
        fake.script("<summary>1. Primary Request and Intent: test</summary>")
        result = (await client.post(f"/sessions/{sid}/compact", json={})).json()
        for uuid in (result["boundary_uuid"], result["summary_uuid"]):
            refused = await client.post(f"/sessions/{sid}/snip", json={"uuids": [uuid]})
            assert refused.status_code == 422
