"""Exactly-once admission on the embedded default: the statements that let Postgres
decide (the session row lock, the conditional UPDATE on the awaited tool uses) run on
SQLite too, where one writer at a time decides."""

from __future__ import annotations

import pytest

from tests.conftest import LiveServer
from tests.runs.helpers import messages, new_session
from tests.sqlite.test_embedded import sqlite_live  # noqa: F401 (a fixture)

pytestmark = pytest.mark.sqlite
WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}


async def test_tool_results_once_and_keys_on_sqlite(sqlite_live: LiveServer) -> None:  # noqa: F811
    async with sqlite_live.client() as client:
        sid = await new_session(client, tools=[WEATHER])
        paused = await client.post(
            f"/sessions/{sid}/messages",
            json={"content": "/tool get_weather {}"},
            headers={"Idempotency-Key": "k1"},
        )
        run = paused.json()["run"]
        assert run["status"] == "requires_action", run
        [use] = run["required_action"]["tool_uses"]
        url = f"/sessions/{sid}/runs/{run['id']}/tool_results"
        body = {"results": [{"tool_use_id": use["id"], "content": "sunny"}]}
        first = await client.post(url, json=body)
        again = await client.post(url, json=body)
        assert first.status_code == again.status_code == 200, again.text
        assert first.json()["messages"] == again.json()["messages"]
        other = await client.post(
            url, json={"results": [{"tool_use_id": use["id"], "content": "rain"}]}
        )
        assert other.status_code == 409
        repeat = await client.post(
            f"/sessions/{sid}/messages",
            json={"content": "/tool get_weather {}"},
            headers={"Idempotency-Key": "k1"},
        )
        assert repeat.json()["run"]["id"] == run["id"]
        chain = await messages(client, sid)
        assert [m["content"][0]["type"] for m in chain].count("tool_result") == 1
