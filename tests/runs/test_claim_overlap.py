"""A plain turn's model request is sent while its claim is stored when the row this
process keeps shows the session idle, so a claim whose guard then fails wastes a model
request. The kept row must therefore follow every write this process makes to the
session (runs with tools, settings, snips, head moves): after each, the next turn's
guard holds, the turn after it starts its model request early again, and the model is
asked once per call the turns make."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text as sql
from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from tests.conftest import LiveServer
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import all_accepted, new_session
from tests.statements import CLAIM, wait_for_lock


def claims(outcome: str, overlapped: str) -> float:
    labels = {"outcome": outcome, "overlapped": overlapped}
    return metrics.REGISTRY.get_sample_value("parley_turn_claims_total", labels) or 0.0


async def turn(client: Any, sid: str, text: str) -> dict[str, Any]:
    response = await client.post(f"/sessions/{sid}/messages", json={"content": text})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["run"]["status"] == "completed", body["run"]
    return body


async def test_the_kept_row_follows_every_write_made_here(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    async with live_fake.client() as client:
        sid = await new_session(client, builtin_tools=["Write"], system="Be brief.")
        failed = claims("guard_failed", "true")
        early = claims("stored", "true")
        calls = 0

        async def two_turns(after: str) -> dict[str, Any]:
            """The first reads the changed row; the second goes early (its guard holds)."""
            nonlocal calls
            before = claims("stored", "true")
            body = await turn(client, sid, f"after {after}")
            assert claims("stored", "true") == before, f"early after {after}"
            await turn(client, sid, f"again after {after}")
            assert claims("stored", "true") == before + 1, f"not early again after {after}"
            calls += 2
            return body

        first = await two_turns("the start")
        # A turn whose steps write the session row (a tool call, its result, the reply).
        fake.script(
            items.message(items.tool_use("Write", {"file_path": "a.txt", "content": "x"})),
            items.message("written"),
        )
        await turn(client, sid, "write a file")  # early: the turn before ended here
        calls += 2
        await two_turns("the tool")
        # Writes through routes: settings, a snip, a head move.
        patched = await client.patch(f"/sessions/{sid}", json={"system": "Be terse."})
        assert patched.status_code == 200, patched.text
        await two_turns("the patch")
        snip = {"uuids": [m["uuid"] for m in first["messages"]]}
        assert (await client.post(f"/sessions/{sid}/snip", json=snip)).status_code == 200
        await two_turns("the snip")
        head = first["messages"][-1]["uuid"]
        assert (await client.put(f"/sessions/{sid}/head", json={"uuid": head})).status_code == 200
        body = await two_turns("the rewind")
        assert body["messages"][0]["parent_uuid"] == head

        assert claims("guard_failed", "true") == failed, "a model request was wasted"
        assert claims("stored", "true") == early + 6
        assert len(fake.requests) == calls
        assert fake.requests[-1]["system"][0]["text"] == "Be terse."
    all_accepted(fake)


async def test_a_turn_posted_while_a_request_writes_the_session_waits_for_its_claim(
    live_fake: LiveServer, fake: FakeAnthropic, engine: AsyncEngine
) -> None:
    """A PATCH is under way (its update waits for the row) when a turn is posted: the
    turn's guard would fail on the PATCH's write, so its model request waits for its
    claim. The guard fails before any request, the turn is claimed from the row as the
    PATCH left it, and the model is asked once."""
    async with live_fake.client() as client:
        sid = await new_session(client, system="Be brief.")
        await turn(client, sid, "hello")  # the row kept here shows the session idle
        failed, calls = claims("guard_failed", "true"), len(fake.requests)
        async with engine.connect() as other:
            await other.execute(
                sql("SELECT 1 FROM agent_sessions WHERE id = :id FOR UPDATE"), {"id": sid}
            )
            patching = asyncio.create_task(
                client.patch(f"/sessions/{sid}", json={"system": "Be terse."})
            )
            await wait_for_lock(engine, "UPDATE agent_sessions%")
            posting = asyncio.create_task(turn(client, sid, "and now?"))
            await wait_for_lock(engine, CLAIM)
            await other.rollback()
        assert (await patching).status_code == 200
        await posting
        assert claims("guard_failed", "true") == failed, "a model request was wasted"
        assert len(fake.requests) == calls + 1
        assert fake.requests[-1]["system"][0]["text"] == "Be terse."
    all_accepted(fake)
