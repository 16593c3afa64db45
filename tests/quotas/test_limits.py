"""Rate limits, running runs and token budgets, held in the database so two replicas
enforce the same figures."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.main import create_app
from tests.conftest import live_server, make_settings, on_fake
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import messages, new_session
from tests.webhooks.test_delivery import settled


def own_key() -> tuple[str, str]:
    """A tenant and key of this test alone: counters are per key and minute."""
    tag = uuid.uuid4().hex[:12]
    return f"tenant-{tag}", f"key-{tag}-0123456789"


@contextlib.asynccontextmanager
async def replicas(
    database_url: str, key: str, tenant: str, n: int = 2, **overrides: Any
) -> AsyncIterator[list[httpx.AsyncClient]]:
    """`n` app instances on one database (no background loops: requests only)."""
    apps = [
        create_app(make_settings(database_url, api_keys=[f"{tenant}:{key}"], **overrides))
        for _ in range(n)
    ]
    clients = [
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://test",
            headers={"Authorization": f"Bearer {key}"},
        )
        for app in apps
    ]
    try:
        yield clients
    finally:
        for client, app in zip(clients, apps, strict=True):
            await client.aclose()
            await app.state.runtime.db.dispose()


async def fresh_minute() -> None:
    """Start a burst early in a minute, so one fixed window holds all of it."""
    second = datetime.now(UTC).second
    if second >= 50:
        await asyncio.sleep(61 - second)


async def test_request_rate_holds_across_replicas(database_url: str, engine: AsyncEngine) -> None:
    tenant, key = own_key()
    async with replicas(database_url, key, tenant, rate_requests_per_minute=5) as (a, b):
        await fresh_minute()
        burst = [(a if i % 2 else b).get("/sessions") for i in range(12)]
        answers = await asyncio.gather(*burst)
        codes = sorted(r.status_code for r in answers)
        assert codes == [200] * 5 + [429] * 7
        refused = next(r for r in answers if r.status_code == 429)
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["type"] == "rate_limited"
        assert refused.json()["limit"] == "requests"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        metrics = (await b.get("/metrics")).text
        assert 'parley_throttled_requests_total{limit="requests"}' in metrics
        # Another key of the same service has its own count.
        other_tenant, other_key = own_key()
        async with replicas(
            database_url, other_key, other_tenant, n=1, rate_requests_per_minute=5
        ) as (c,):
            assert (await c.get("/sessions")).status_code == 200


async def test_turn_rate_counts_posts_only(database_url: str, engine: AsyncEngine) -> None:
    tenant, key = own_key()
    async with replicas(database_url, key, tenant, rate_turns_per_minute=2) as (a, b):
        await fresh_minute()
        sid = await new_session(a)
        codes = [
            (await client.post(f"/sessions/{sid}/messages", json={"content": "hi"})).status_code
            for client in (a, b, a)
        ]
        assert codes == [200, 200, 429]
        refused = await b.post(f"/sessions/{sid}/messages", json={"content": "again"})
        assert refused.json()["limit"] == "turns"
        assert "Retry-After" in refused.headers
        # Reads are not turns; the refused posts stored nothing.
        assert (await a.get(f"/sessions/{sid}")).status_code == 200
        assert len(await messages(a, sid)) == 4


async def test_running_runs_per_tenant(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    tenant, key = own_key()
    settings = {**on_fake(fake), "api_keys": [f"{tenant}:{key}"], "max_running_runs": 1}
    async with (
        live_server(database_url, engine, **settings) as one,
        live_server(database_url, engine, **settings) as two,
        one.client(key) as a,
        two.client(key) as b,
    ):
        fake.configure(first_token_delay=1.0)
        s1, s2 = await new_session(a), await new_session(b)
        first = await a.post(f"/sessions/{s1}/messages", json={"content": "x", "background": True})
        assert first.status_code == 202
        refused = await b.post(f"/sessions/{s2}/messages", json={"content": "y"})
        assert refused.status_code == 429, refused.text
        assert refused.json()["limit"] == "running_runs"
        assert refused.headers["Retry-After"] == "5"
        assert await messages(b, s2) == []
        queued = await b.post(
            f"/sessions/{s2}/messages",
            json={"content": "y", "background": True, "if_busy": "enqueue"},
        )
        assert queued.status_code == 202
        assert queued.json()["status"] == "queued"
        fake.configure(first_token_delay=0.0)
        await settled(a, s1, first.json()["id"], "completed")
        # The queued run starts once the tenant has room (a reaper picks it up).
        await settled(b, s2, queued.json()["id"], "completed")


async def test_budgets_refuse_posts_and_stop_runs(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    tenant, key = own_key()
    settings = {**on_fake(fake), "api_keys": [f"{tenant}:{key}"]}
    async with (
        live_server(database_url, engine, **settings) as one,
        live_server(database_url, engine, **settings, tenant_token_budget=0) as two,
        one.client(key) as a,
        two.client(key) as b,
    ):
        # A session budget: the post that uses it up finishes; the next is refused.
        sid = await new_session(a, token_budget=1)
        assert (await a.get(f"/sessions/{sid}")).json()["token_budget"] == 1
        fake.script(items.message("Done."))
        assert (
            await a.post(f"/sessions/{sid}/messages", json={"content": "hi"})
        ).status_code == 200
        refused = await b.post(f"/sessions/{sid}/messages", json={"content": "more"})
        assert refused.status_code == 429
        body = refused.json()
        assert body["type"] == "budget_exceeded"
        assert body["budget"] == "session"
        assert body["limit"] == 1
        assert body["used"] > 1
        shown = (await a.get("/metrics")).text
        assert 'parley_budget_refusals_total{scope="session",stage="post"}' in shown
        # Raising it lets the session go on.
        patched = await b.patch(f"/sessions/{sid}", json={"token_budget": 1_000_000})
        assert patched.status_code == 200
        fake.script(items.message("Fine."))
        assert (await b.post(f"/sessions/{sid}/messages", json={"content": "x"})).status_code == 200

        # Mid-run: the first call crosses the session's budget; its tool runs, the run
        # stops before a second call.
        stop = await new_session(a, builtin_tools=["Glob"], token_budget=1)
        fake.script(items.message(items.tool_use("Glob", {"pattern": "*"}, id="toolu_g")))
        sent_before = len(fake.records)
        answer = await a.post(f"/sessions/{stop}/messages", json={"content": "look"})
        run = answer.json()["run"]
        assert run["status"] == "failed"
        assert run["error"]["type"] == "budget_exceeded"
        assert run["error"]["budget"] == "session"
        assert len(fake.records) == sent_before + 1
        stored = await messages(a, stop)
        assert [m["role"] for m in stored] == ["user", "assistant", "user"]
        assert stored[-1]["content"][0]["type"] == "tool_result"

        # Usage per tenant: every model call of both sessions, as the sessions counted it.
        usage = (await b.get("/usage")).json()
        sessions = {u["session_id"]: u for u in usage["sessions"]}
        assert set(sessions) == {sid, stop}
        for session_id in (sid, stop):
            counted = (await a.get(f"/sessions/{session_id}")).json()["usage"]
            read = (
                counted["input_tokens"]
                + counted["cache_read_input_tokens"]
                + counted["cache_creation_input_tokens"]
            )
            assert sessions[session_id]["input_tokens"] == read
            assert sessions[session_id]["output_tokens"] == counted["output_tokens"]
        assert usage["input_tokens"] == sum(u["input_tokens"] for u in sessions.values())
        assert (await a.get("/usage", params={"from": "2000-01-01T00:00:00Z"})).json()[
            "output_tokens"
        ] == usage["output_tokens"]
        empty = await a.get(
            "/usage", params={"from": "2000-01-01T00:00:00Z", "to": "2000-01-02T00:00:00Z"}
        )
        assert empty.json()["sessions"] == []
        assert (
            await a.get(
                "/usage", params={"from": "2001-01-01T00:00:00Z", "to": "2000-01-01T00:00:00Z"}
            )
        ).status_code == 422


async def test_tenant_budget(database_url: str, engine: AsyncEngine, fake: FakeAnthropic) -> None:
    tenant, key = own_key()
    settings = {**on_fake(fake), "api_keys": [f"{tenant}:{key}"]}
    limits = {"tenant_limits": {tenant: {"token_budget": 5}}}
    async with live_server(database_url, engine, **settings, **limits) as one, one.client(key) as a:
        s1, s2 = await new_session(a), await new_session(a)
        fake.script(items.message("Done."))
        assert (await a.post(f"/sessions/{s1}/messages", json={"content": "hi"})).status_code == 200
        refused = await a.post(f"/sessions/{s2}/messages", json={"content": "hi"})
        assert refused.status_code == 429
        assert refused.json()["budget"] == "tenant"
        assert await messages(a, s2) == []
