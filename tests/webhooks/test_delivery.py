"""Run webhooks end to end: two replicas on one database, the fake Anthropic API, and a
receiver that verifies every signature with `standardwebhooks`. It is down while the
runs happen (deliveries are retried), then sees each event exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.engine.webhooks.outbox import WEBHOOK_EVENTS
from tests.conftest import live_server, on_fake
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import new_session, stream
from tests.webhooks.receiver import Receiver

WEBHOOK_SETTINGS: dict[str, Any] = {
    "webhook_allow_networks": ["127.0.0.0/8"],
    "webhook_retry_base_seconds": 0.1,
    "webhook_retry_max_seconds": 0.3,
    "webhook_poll_seconds": 0.05,
    "webhook_timeout_seconds": 2,
    "secret_key": "s" * 40,
}
WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def settled(client: httpx.AsyncClient, sid: str, run_id: str, status: str) -> None:
    async def check() -> bool:
        run = (await client.get(f"/sessions/{sid}/runs/{run_id}")).json()
        return bool(run["status"] == status)

    await until(check)


async def webhook_events(client: httpx.AsyncClient, sid: str) -> list[tuple[str, str]]:
    """(run id, event) of every webhook event in the session's run logs."""
    found = []
    for run in (await client.get(f"/sessions/{sid}/runs")).json()["data"]:
        for event in await stream(client, "GET", f"/sessions/{sid}/runs/{run['id']}/events"):
            if event.event in WEBHOOK_EVENTS:
                found.append((run["id"], event.event))
    return found


async def test_every_event_once_across_replicas_and_an_outage(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    settings = {**on_fake(fake), **WEBHOOK_SETTINGS}
    receiver = Receiver()
    async with (
        live_server(database_url, engine, **settings) as one,
        live_server(database_url, engine, **settings) as two,
        one.client() as a,
        two.client() as b,
    ):
        created = await a.post(
            "/webhooks", json={"url": receiver.url("hook"), "events": list(WEBHOOK_EVENTS)}
        )
        assert created.status_code == 201, created.text
        hook = created.json()
        assert hook["secret"].startswith("whsec_")
        receiver.secrets["hook"] = hook["secret"]
        receiver.secrets["turn"] = (await b.get("/webhooks/turn_secret")).json()["secret"]
        listed = (await b.get("/webhooks")).json()["data"]
        assert [h["id"] for h in listed] == [hook["id"]]
        assert "secret" not in listed[0]

        # A client tool pauses a run (on one replica); its answer completes it (on the other).
        fake.script(items.message(items.tool_use("get_weather", {}, id="toolu_1")))
        s1 = await new_session(a, tools=[WEATHER])
        paused = (await a.post(f"/sessions/{s1}/messages", json={"content": "hi"})).json()
        run1 = paused["run"]["id"]
        assert paused["run"]["status"] == "requires_action"
        fake.script(items.message("Sunny."))
        answered = await b.post(
            f"/sessions/{s1}/runs/{run1}/tool_results",
            json={"results": [{"tool_use_id": "toolu_1", "content": "sun"}]},
        )
        assert answered.json()["run"]["status"] == "completed"
        # A failed run in the background, also told to its own webhook_url.
        fake.script(items.error(400, "no"))
        s2 = await new_session(b)
        posted = await b.post(
            f"/sessions/{s2}/messages",
            json={"content": "x", "background": True, "webhook_url": receiver.url("turn")},
        )
        assert posted.status_code == 202, posted.text
        await settled(b, s2, posted.json()["id"], "failed")
        # A paused run cancelled.
        fake.script(items.message(items.tool_use("get_weather", {}, id="toolu_2")))
        s3 = await new_session(b, tools=[WEATHER])
        run3 = (await b.post(f"/sessions/{s3}/messages", json={"content": "x"})).json()["run"]
        assert (await a.post(f"/sessions/{s3}/runs/{run3['id']}/cancel")).status_code == 200
        # A compaction.
        for i in range(4):
            await a.post(f"/sessions/{s2}/messages", json={"content": f"turn {i} " * 600})
        fake.script(items.message("A summary."))
        compacted = await a.post(f"/sessions/{s2}/compact", json={})
        assert compacted.status_code == 200, compacted.text

        expected = sorted([e for sid in (s1, s2, s3) for e in await webhook_events(a, sid)])
        kinds = {name for _, name in expected}
        assert kinds == set(WEBHOOK_EVENTS)

        # The receiver is down: the deliveries wait, retried with their errors recorded.
        async def retried() -> bool:
            page = (await a.get(f"/webhooks/{hook['id']}/deliveries")).json()["data"]
            return len(page) == len(expected) and all(
                d["status"] == "pending" and d["attempts"] >= 2 and d["last_error"] for d in page
            )

        await until(retried)
        await receiver.start()
        try:

            async def delivered() -> bool:
                page = (await b.get(f"/webhooks/{hook['id']}/deliveries")).json()["data"]
                done = all(d["status"] == "delivered" for d in page)
                return done and len(receiver.events("turn")) >= 1

            await until(delivered)
            await asyncio.sleep(0.5)  # time for a double to show up, if there were one
        finally:
            await receiver.stop()
        assert receiver.rejected == []
        assert receiver.events("hook") == expected
        ids = [r.msg_id for r in receiver.received]
        assert len(ids) == len(set(ids))
        run2 = posted.json()["id"]
        assert receiver.events("turn") == [(run2, "run.failed")]
        of_run = (await a.get("/webhooks/deliveries", params={"run_id": run2})).json()["data"]
        assert {(d["endpoint_id"], d["status"]) for d in of_run} == {
            (hook["id"], "delivered"),
            (None, "delivered"),
        }
        body = next(r.body for r in receiver.received if r.path == "turn")
        assert body["session_id"] == s2
        assert body["data"]["error"]["type"] == "request_refused"  # the API's 400

        # Redeliver sends the same message again, with the same webhook-id: an endpoint's
        # (by its route) and a turn's own (by the tenant-wide route).
        first = (await a.get(f"/webhooks/{hook['id']}/deliveries", params={"limit": 1})).json()
        delivery = first["data"][0]
        own = next(d for d in of_run if d["endpoint_id"] is None)
        await receiver.start()
        try:
            again = await a.post(f"/webhooks/{hook['id']}/deliveries/{delivery['id']}/redeliver")
            assert again.status_code == 200
            assert again.json()["status"] == "pending"
            assert (await b.post(f"/webhooks/deliveries/{own['id']}/redeliver")).status_code == 200
            # Not through another endpoint's route.
            wrong = await a.post(f"/webhooks/{hook['id']}/deliveries/{own['id']}/redeliver")
            assert wrong.status_code == 404

            async def resent() -> bool:
                ids = [r.msg_id for r in receiver.received]
                return ids.count(delivery["id"]) == 2 and ids.count(own["id"]) == 2

            await until(resent)
        finally:
            await receiver.stop()
        shown = (await a.get("/metrics")).text
        assert 'parley_webhook_deliveries_total{event="run.completed",outcome="delivered"}' in shown
        assert 'parley_webhook_deliveries_total{event="run.completed",outcome="retry"}' in shown
        assert (await a.delete(f"/webhooks/{hook['id']}")).status_code == 204
        assert (await a.get(f"/webhooks/{hook['id']}/deliveries")).status_code == 404
