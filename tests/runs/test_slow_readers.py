"""An event stream whose client stops reading is closed after the send timeout, and
its follower is let go (the run is unaffected)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from app.api.delivery import sse_stream
from tests.conftest import live_server


async def test_a_client_that_stops_reading_is_let_go(
    database_url: str, engine: AsyncEngine
) -> None:
    async with live_server(database_url, engine, sse_send_timeout_seconds=0.2) as live:
        async with live.client() as client:
            session = (await client.post("/sessions", json={})).json()
            turn = await client.post(f"/sessions/{session['id']}/messages", json={"content": "hi"})
            run_id = turn.json()["run"]["id"]
        sent: list[dict[str, Any]] = []
        blocked = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body":
                blocked.set()
                await asyncio.Event().wait()  # a client whose buffers are full

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # it never disconnects either
            return {"type": "http.disconnect"}

        streams = metrics.sse_streams._value.get()
        response = sse_stream(live.runtime, run_id, 0)
        scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
        await asyncio.wait_for(response(scope, receive, send), timeout=10)
        assert blocked.is_set()
        assert sent[0]["type"] == "http.response.start"
        assert metrics.sse_streams._value.get() == streams  # the follower was closed
