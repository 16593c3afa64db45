"""Compaction hooks: the internal before/after interface and the optional webhook."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.engine.hooks import CompactionEvent, CompactionHooks
from tests.conftest import free_port, live_server
from tests.runs.helpers import new_session


class Recorder(CompactionHooks):
    def __init__(self) -> None:
        self.calls: list[tuple[str, CompactionEvent]] = []

    async def before(self, event: CompactionEvent) -> None:
        self.calls.append(("before", event))

    async def after(self, event: CompactionEvent) -> None:
        self.calls.append(("after", event))


class Broken(CompactionHooks):
    async def before(self, event: CompactionEvent) -> None:
        raise RuntimeError("a hook that fails")


async def test_hooks_and_webhook(database_url: str, engine: AsyncEngine) -> None:
    received: list[dict[str, Any]] = []

    async def webhook(request: Request) -> Response:
        received.append(await request.json())
        return Response(status_code=204)

    port = free_port()
    receiver = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Route("/hook", webhook, methods=["POST"])]),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    task = asyncio.create_task(receiver.serve())
    try:
        async with (
            live_server(
                database_url, engine, compaction_webhook_url=f"http://127.0.0.1:{port}/hook"
            ) as server,
            server.client() as client,
        ):
            recorder = Recorder()
            server.runtime.resources.hooks[:0] = [Broken(), recorder]
            sid = await new_session(client)
            # Long enough that the offline model's extractive summary makes it smaller
            # (a compaction that would not is refused).
            for i in range(10):
                await client.post(f"/sessions/{sid}/messages", json={"content": f"msg {i} " * 300})
            result = (await client.post(f"/sessions/{sid}/compact", json={})).json()
            assert result["run"]["status"] == "completed"
        assert [stage for stage, _ in recorder.calls] == ["before", "after"]
        after = recorder.calls[1][1]
        assert after.trigger == "manual"
        assert str(after.boundary_uuid) == result["boundary_uuid"]
        assert after.post_tokens == result["post_tokens"]
        assert len(received) == 1
        hook = received[0]
        assert hook["type"] == "compaction.completed"
        assert hook["session_id"] == sid
        assert hook["trigger"] == "manual"
        assert hook["pre_tokens"] == result["pre_tokens"]
        assert hook["summary"] == result["summary"]
    finally:
        receiver.should_exit = True
        await task
