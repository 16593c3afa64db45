"""A turn posted to a session this replica served last starts from the row it keeps, with
no read of the session (`conversation.session_rows`); a change made through another
replica (its settings, a token budget, a delete) is never missed: the claim's guard on
the row's version fails and the turn reads the row."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.models import Message, Run
from tests.conftest import LiveServer, live_server, on_fake
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import all_accepted, new_session
from tests.statements import recorded

SESSION_READ = "FROM agent_sessions"  # any SELECT of the row (the claim's UPDATE is not)


def session_reads(seen: list[str]) -> list[str]:
    return [s for s in seen if s.lstrip().startswith("SELECT") and SESSION_READ in s]


def two_replicas(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> tuple[AbstractAsyncContextManager[LiveServer], AbstractAsyncContextManager[LiveServer]]:
    settings = on_fake(fake)
    return live_server(database_url, engine, **settings), live_server(
        database_url, engine, **settings
    )


def systems(fake: FakeAnthropic) -> list[str]:
    """The system prompt of each model request so far."""
    return ["".join(block["text"] for block in body["system"]) for body in fake.requests]


async def turn(client: Any, sid: str, text: str, **body: Any) -> dict[str, Any]:
    response = await client.post(f"/sessions/{sid}/messages", json={"content": text, **body})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["run"]["status"] == "completed"
    return body


async def test_a_turn_on_a_session_served_here_reads_no_session_row(
    live_fake: LiveServer, fake: FakeAnthropic
) -> None:
    async with live_fake.client() as client:
        sid = await new_session(client, system="Be brief.")
        fake.script(items.message("one"), items.message("two"), items.message("three"))
        await turn(client, sid, "first")
        for text in ("second", "third"):
            with recorded(live_fake.runtime.db) as seen:
                await turn(client, sid, text)
            assert session_reads(seen) == [], "the kept row stood in for the read"
        assert systems(fake) == ["Be brief."] * 3
    all_accepted(fake)


async def test_settings_changed_through_another_replica_are_used(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    first, second = two_replicas(database_url, engine, fake)
    async with first as one, second as two, one.client() as a, two.client() as b:
        sid = await new_session(a, system="Old rules.")
        fake.script(*(items.message(f"reply {i}") for i in range(5)))
        await turn(a, sid, "first")
        patched = await b.patch(f"/sessions/{sid}", json={"system": "New rules."})
        assert patched.status_code == 200, patched.text
        reads, replies = [], []
        for text in ("second", "third", "fourth"):
            with recorded(one.runtime.db) as seen:
                body = await turn(a, sid, text)
            reads.append(len(session_reads(seen)))
            replies.append(body["messages"][-1]["content"][0]["text"])
        # The guard failed and the row was read; the turn after reads it with its
        # version (the careful claim left none to keep); from then on it is kept.
        assert reads[0] > 0
        assert reads[2] == 0
        # The second turn's model request, built from the stale row, was sent while its
        # claim was and closed when the guard failed (its reply, "reply 1", is nowhere);
        # the session counts as shared since, so no other request went early.
        assert systems(fake) == ["Old rules.", "Old rules."] + ["New rules."] * 3
        assert replies == ["reply 2", "reply 3", "reply 4"]
    all_accepted(fake)


async def test_a_turn_on_the_careful_path_reads_the_changed_row(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    """`interrupt` claims after looking: a kept row is never what it claims from."""
    first, second = two_replicas(database_url, engine, fake)
    async with first as one, second as two, one.client() as a, two.client() as b:
        sid = await new_session(a, system="Old rules.")
        fake.script(*(items.message(f"reply {i}") for i in range(3)))
        await turn(a, sid, "first")
        moved = await turn(b, sid, "moves the head")
        assert (await b.patch(f"/sessions/{sid}", json={"system": "New rules."})).status_code == 200
        body = await turn(a, sid, "second", if_busy="interrupt")
        assert systems(fake) == ["Old rules.", "Old rules.", "New rules."]
        assert body["messages"][0]["parent_uuid"] == moved["messages"][-1]["uuid"]
    all_accepted(fake)


async def test_a_budget_set_through_another_replica_refuses_the_next_turn(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    first, second = two_replicas(database_url, engine, fake)
    async with first as one, second as two, one.client() as a, two.client() as b:
        sid = await new_session(a)
        fake.script(items.message("one"))
        await turn(a, sid, "first")
        assert (await b.patch(f"/sessions/{sid}", json={"token_budget": 1})).status_code == 200
        refused = await a.post(f"/sessions/{sid}/messages", json={"content": "more"})
        assert refused.status_code == 429, refused.text
        assert refused.json()["type"] == "budget_exceeded"
    async with engine.connect() as conn:
        runs = await conn.scalar(select(func.count()).where(Run.session_id == sid))
    assert runs == 1, "the refused turn stored no run"


@pytest.mark.parametrize("kept", [True, False])
async def test_a_session_deleted_through_another_replica_is_not_found(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic, kept: bool
) -> None:
    first, second = two_replicas(database_url, engine, fake)
    async with first as one, second as two, one.client() as a, two.client() as b:
        sid = await new_session(a)
        if kept:
            fake.script(items.message("one"))
            await turn(a, sid, "first")
        assert (await b.delete(f"/sessions/{sid}")).status_code == 204
        gone = await a.post(f"/sessions/{sid}/messages", json={"content": "hello?"})
        assert gone.status_code == 404, gone.text
        assert gone.headers["content-type"] == "application/problem+json"
    async with engine.connect() as conn:
        left = await conn.scalar(select(func.count()).where(Message.session_id == sid))
    assert left == 0
