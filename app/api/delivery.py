"""Delivering a run to an HTTP client: as an SSE stream, as 202 + Run, or by waiting.

The answers are built when the route returns but act only when they are sent, after
the request's transaction has committed and the run was launched: a stream follows the
run's event log, a wait-mode answer waits for the run to settle, then reads its outcome.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Scope, Send

from app import metrics
from app.conversation.payloads import message_out, run_out
from app.conversation.records import MessageRecord
from app.domain import RunStatus
from app.engine import runs
from app.engine.events import SHUTDOWN, StoredEvent
from app.engine.runtime import Runtime
from app.models import Run
from app.schemas import RunOut, TurnResult

Mode = Literal["stream", "background", "wait"]
log = logging.getLogger("parley.http")

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


class EventStream(EventSourceResponse):
    """An SSE answer that lets go of a client that stopped reading: a send that waits
    longer than the send timeout ends the stream (the run goes on; the client may
    reconnect with Last-Event-ID)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            log.info("closed an event stream whose client stopped reading")


def encoded(event: StoredEvent) -> bytes:
    """The event as an SSE frame, as sse-starlette writes it. Stored data is JSON on one
    line and event names are ours, so the frame is written straight out; data with a
    line break goes through sse-starlette's encoder, which splits it into lines."""
    if event is SHUTDOWN:  # not part of the run's log: no id
        return ServerSentEvent(event=event.event, data=event.data).encode()
    if "\n" in event.data or "\r" in event.data:
        return ServerSentEvent(id=str(event.seq), event=event.event, data=event.data).encode()
    return f"id: {event.seq}\r\nevent: {event.event}\r\ndata: {event.data}\r\n\r\n".encode()


def sse_stream(runtime: Runtime, run_id: uuid.UUID, after: int) -> EventSourceResponse:
    shutdown = anyio.Event()

    async def status() -> RunStatus | None:
        async with runtime.db.sessionmaker() as db:
            return await runs.status_of(db, run_id)

    async def events() -> AsyncIterator[bytes]:
        metrics.sse_streams.inc()
        source = runtime.events.follow(run_id, after, status=status, stop=shutdown)
        try:
            async for batch in source:  # what is at hand goes out in one write
                yield b"".join(encoded(event) for event in batch)
        finally:
            with contextlib.suppress(Exception):
                await source.aclose()
            metrics.sse_streams.dec()

    return EventStream(
        events(),
        ping=runtime.settings.sse_ping_seconds,
        shutdown_event=shutdown,
        shutdown_grace_period=1.0,
        # a client that stops reading is let go once one send has waited this long
        send_timeout=runtime.settings.sse_send_timeout_seconds,
    )


class SettledResponse(Response):
    """An answer sent once a run has settled (finished, or paused for client tools)."""

    def __init__(
        self,
        runtime: Runtime,
        run_id: uuid.UUID,
        build: Callable[[Run, list[MessageRecord]], Response],
        messages_from: int = 0,
        *,
        from_memory: Callable[[RunOut, list[MessageRecord]], Response] | None = None,
    ) -> None:
        """`from_memory` builds the answer from the outcome a run executed here kept
        (the run row its last step stored), when it has one."""
        super().__init__(media_type="application/json")
        self.runtime = runtime
        self.run_id = run_id
        self.build = build
        self.messages_from = messages_from
        self.from_memory = from_memory
        if from_memory is not None:
            runtime.supervisor.want_outcome(run_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        supervisor = self.runtime.supervisor
        if self.from_memory is not None:
            # A run that executed here from its claim is answered from what it stored.
            known = await supervisor.settled_outcome(self.run_id)
            if known is not None:
                await self.from_memory(known.run, known.records)(scope, receive, send)
                return
        else:
            await supervisor.wait_settled(self.run_id)
        async with self.runtime.db.sessionmaker() as db:
            run, records = await runs.outcome(db, self.run_id, messages_from=self.messages_from)
        response = self.build(run, records)
        await response(scope, receive, send)


def _turn_result(run: Run | RunOut, records: list[MessageRecord]) -> Response:
    result = TurnResult(run=run_out(run), messages=[message_out(r) for r in records])
    return JSONResponse(result.model_dump(mode="json"))


def deliver(
    runtime: Runtime, run: Run, mode: Mode, *, after_seq: int = 0, messages_from: int = 0
) -> Response:
    """Answer a started (or retried) run in the client's mode."""
    if mode == "stream":
        return sse_stream(runtime, run.id, after_seq)
    if mode == "background":
        return JSONResponse(run_out(run).model_dump(mode="json"), status_code=202)
    # A new turn's messages are all the run's (a tool-result answer's are not in memory).
    return SettledResponse(
        runtime,
        run.id,
        _turn_result,
        messages_from,
        from_memory=None if messages_from else _turn_result,
    )
