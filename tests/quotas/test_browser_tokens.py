"""Browser tokens: minted by a tenant key for one session; they read it, post turns,
stream and answer tools there, and nothing else."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from app import auth
from tests.conftest import OTHER_KEY, live_server, on_fake
from tests.fake_anthropic import FakeAnthropic, items
from tests.runs.helpers import names, new_session, post_stream, stream

SECRET = {"secret_key": "k" * 40}


async def test_a_token_reaches_its_session_only(database_url: str, engine: AsyncEngine) -> None:
    async with live_server(database_url, engine, **SECRET) as server, server.client() as tenant:
        mine, other = await new_session(tenant), await new_session(tenant)
        minted = await tenant.post("/tokens", json={"session_id": mine, "ttl_seconds": 300})
        assert minted.status_code == 201, minted.text
        token = minted.json()["token"]
        assert token.startswith("pbt_")
        async with server.client(token) as browser:
            assert (await browser.get(f"/sessions/{mine}")).status_code == 200
            events = await post_stream(browser, mine, "hello")
            assert names(events)[-1] == "run.completed"
            run_id = events[-1].json["id"]
            assert (await browser.get(f"/sessions/{mine}/runs/{run_id}")).status_code == 200
            assert (await browser.get(f"/sessions/{mine}/messages")).status_code == 200
            # Another session of the same tenant is not there for it.
            for answer in (
                await browser.get(f"/sessions/{other}"),
                await browser.post(f"/sessions/{other}/messages", json={"content": "x"}),
            ):
                assert answer.status_code == 404
            # Nor is anything but reading, posting turns and answering tools.
            for method, url in (
                ("GET", "/sessions"),
                ("POST", "/sessions"),
                ("POST", "/tokens"),
                ("GET", "/webhooks"),
                ("GET", "/usage"),
                ("PATCH", f"/sessions/{mine}"),
                ("DELETE", f"/sessions/{mine}"),
                ("POST", f"/sessions/{mine}/compact"),
                ("POST", f"/sessions/{mine}/runs/{run_id}/cancel"),
            ):
                answer = await browser.request(method, url, json={})
                assert answer.status_code == 403, (method, url, answer.text)
                assert answer.json()["type"] == "forbidden"
        # Another tenant cannot mint for this session.
        async with server.client(OTHER_KEY) as stranger:
            assert (await stranger.post("/tokens", json={"session_id": mine})).status_code == 404


async def test_read_only_expired_and_forged(database_url: str, engine: AsyncEngine) -> None:
    async with live_server(database_url, engine, **SECRET) as server, server.client() as tenant:
        sid = await new_session(tenant)
        minted = await tenant.post("/tokens", json={"session_id": sid, "read_only": True})
        token = minted.json()["token"]
        async with server.client(token) as browser:
            assert (await browser.get(f"/sessions/{sid}")).status_code == 200
            refused = await browser.post(f"/sessions/{sid}/messages", json={"content": "x"})
            assert refused.status_code == 403
        settings = server.runtime.settings
        caller = auth.Caller("tenant-a", "k")
        past = datetime.now(UTC) - timedelta(seconds=1)
        expired = auth.mint_token(
            settings, caller, uuid.UUID(sid), read_only=False, expires_at=past
        )
        forged = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
        for bad in (expired, forged, "pbt_nonsense"):
            async with server.client(bad) as browser:
                answer = await browser.get(f"/sessions/{sid}")
                assert answer.status_code == 401
                assert answer.headers["WWW-Authenticate"] == "Bearer"
        too_long = await tenant.post("/tokens", json={"session_id": sid, "ttl_seconds": 999_999})
        assert too_long.status_code == 422


async def test_no_tokens_without_a_server_secret(database_url: str, engine: AsyncEngine) -> None:
    async with live_server(database_url, engine) as server, server.client() as tenant:
        sid = await new_session(tenant)
        assert (await tenant.post("/tokens", json={"session_id": sid})).status_code == 422


async def test_a_token_answers_client_tools(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> None:
    weather = {"name": "get_weather", "input_schema": {"type": "object"}}
    async with (
        live_server(database_url, engine, **SECRET, **on_fake(fake)) as server,
        server.client() as tenant,
    ):
        sid = await new_session(tenant, tools=[weather])
        token = (await tenant.post("/tokens", json={"session_id": sid})).json()["token"]
        fake.script(
            items.message(items.tool_use("get_weather", {}, id="toolu_w")),
            items.message("Sunny."),
        )
        async with server.client(token) as browser:
            paused = await browser.post(f"/sessions/{sid}/messages", json={"content": "weather?"})
            run = paused.json()["run"]
            assert run["status"] == "requires_action"
            events = await stream(
                browser,
                "POST",
                f"/sessions/{sid}/runs/{run['id']}/tool_results",
                json={"results": [{"tool_use_id": "toolu_w", "content": "sun"}], "stream": True},
            )
            assert names(events)[-1] == "run.completed"
