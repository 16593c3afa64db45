"""Webhooks, rate limits and budgets on the embedded SQLite database: the same statements
without Postgres' row locks (one writer at a time there)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer
from tests.quotas.test_limits import fresh_minute
from tests.runs.helpers import new_session
from tests.sqlite.conftest import sqlite_server
from tests.webhooks.receiver import Receiver
from tests.webhooks.test_delivery import WEBHOOK_SETTINGS, until

pytestmark = pytest.mark.sqlite


@pytest.fixture
async def sqlite_live(tmp_path: Path) -> AsyncIterator[LiveServer]:
    async with sqlite_server(tmp_path, **WEBHOOK_SETTINGS, rate_turns_per_minute=3) as server:
        yield server


async def test_webhook_rate_limit_and_budget_on_sqlite(sqlite_live: LiveServer) -> None:
    receiver = Receiver()
    await receiver.start()
    try:
        async with sqlite_live.client() as client:
            hook = (
                await client.post(
                    "/webhooks", json={"url": receiver.url("hook"), "events": ["run.completed"]}
                )
            ).json()
            receiver.secrets["hook"] = hook["secret"]
            sid = await new_session(client, token_budget=1)
            await fresh_minute()
            done = await client.post(f"/sessions/{sid}/messages", json={"content": "hi"})
            assert done.json()["run"]["status"] == "completed"
            over = await client.post(f"/sessions/{sid}/messages", json={"content": "again"})
            assert over.json()["type"] == "budget_exceeded"
            # The third turn this minute is still counted (and refused for the budget);
            # the fourth is past the rate.
            await client.post(f"/sessions/{sid}/messages", json={"content": "x"})
            limited = await client.post(f"/sessions/{sid}/messages", json={"content": "x"})
            assert limited.status_code == 429
            assert limited.json()["type"] == "rate_limited"

            async def delivered() -> bool:
                return len(receiver.received) == 1

            await until(delivered)
            usage = (await client.get("/usage")).json()
            assert usage["output_tokens"] > 0
    finally:
        await receiver.stop()
    assert receiver.events("hook") == [(done.json()["run"]["id"], "run.completed")]
