"""Delivering a run to an HTTP client: as an SSE stream, as 202 + Run, or by waiting."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import select
from sse_starlette import EventSourceResponse, ServerSentEvent

from app import metrics
from app.conversation.payloads import message_out, run_out
from app.engine.events import SHUTDOWN
from app.engine.runtime import Runtime
from app.models import Message, Run
from app.schemas import TurnResult

Mode = Literal["stream", "background", "wait"]

SSE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The run's result (wait mode) or its event stream (stream mode)",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
}


def delivery_mode(request: Request, *, stream: bool, background: bool) -> Mode:
    if stream or "text/event-stream" in request.headers.get("accept", ""):
        return "background" if background else "stream"
    return "background" if background else "wait"


def sse_stream(runtime: Runtime, run_id: uuid.UUID, after: int) -> EventSourceResponse:
    shutdown = anyio.Event()

    async def status() -> str | None:
        async with runtime.db.sessionmaker() as db:
            return await db.scalar(select(Run.status).where(Run.id == run_id))

    async def events() -> AsyncIterator[ServerSentEvent]:
        metrics.sse_streams.inc()
        source = runtime.events.follow(run_id, after, status=status, stop=shutdown)
        try:
            async for event in source:
                if event is SHUTDOWN:  # not part of the run's log: no id
                    yield ServerSentEvent(event=event.event, data=event.data)
                else:
                    yield ServerSentEvent(id=str(event.seq), event=event.event, data=event.data)
        finally:
            with contextlib.suppress(Exception):
                await source.aclose()
            metrics.sse_streams.dec()

    return EventSourceResponse(
        events(),
        ping=runtime.settings.sse_ping_seconds,
        shutdown_event=shutdown,
        shutdown_grace_period=1.0,
        headers={"Cache-Control": "no-cache"},
    )


async def deliver(
    runtime: Runtime, run: Run, mode: Mode, *, after_seq: int = 0, messages_after: int = 0
) -> Response:
    """Answer a started (or retried) run in the client's mode."""
    if mode == "stream":
        return sse_stream(runtime, run.id, after_seq)
    if mode == "background":
        return JSONResponse(run_out(run).model_dump(mode="json"), status_code=202)
    await runtime.runs.wait_settled(run.id)
    return JSONResponse(await turn_result(runtime, run.id, messages_after))


async def turn_result(runtime: Runtime, run_id: uuid.UUID, after_seq: int) -> dict[str, Any]:
    async with runtime.db.sessionmaker() as db:
        run = await db.get(Run, run_id)
        assert run is not None
        rows = (
            await db.execute(
                select(Message.__table__)
                .where(Message.run_id == run_id, Message.seq >= after_seq)
                .order_by(Message.seq)
            )
        ).all()
    result = TurnResult(run=run_out(run), messages=[message_out(row) for row in rows])
    return result.model_dump(mode="json")
