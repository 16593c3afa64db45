"""Routes: posting turns, regenerating, and the runs of a session (events, cancel,
client tool results)."""

from __future__ import annotations

import re
import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response

from app.api.delivery import SSE_RESPONSES, deliver, delivery_mode, sse_stream
from app.api.deps import AfterQuery, DbDep, PostedTurnDep, RuntimeDep, SessionDep, count_turn
from app.conversation.payloads import run_out
from app.domain import FINAL_RUN_STATUSES
from app.engine import runs
from app.engine.admission import request_hash
from app.engine.webhooks import endpoints
from app.errors import Invalid
from app.schemas import DeliveryMode, Page, RunOut, ToolResultsIn, TurnIn, TurnResult

MAX_EVENT_ID = 2**63 - 1  # event ids are bigint
_EVENT_ID = re.compile(r"[0-9]{1,19}")

router = APIRouter(prefix="/sessions/{session_id}", tags=["runs"])

# 1 to 255 visible ASCII characters (RFC 9110 VCHAR); anything else is a 422 naming the
# header, never a key stored as sent.
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$"),
]
TURN_RESPONSES = {
    **SSE_RESPONSES,
    200: {**SSE_RESPONSES[200], "model": TurnResult},
    202: {"model": RunOut, "description": "Started in the background"},
    409: {"description": "The session has an active run (if_busy=reject)"},
    429: {
        "description": "rate_limited (with Retry-After: the key's turns per minute or the "
        "tenant's running runs) or budget_exceeded (a token budget is used up)"
    },
}


@router.post(
    "/messages",
    responses=TURN_RESPONSES,
    response_model=None,
    summary="Post a turn",
)
async def post_turn(
    body: TurnIn,
    request: Request,
    turn: PostedTurnDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Store a user message after the head (or after `parent_uuid`) and run the agent loop
    on it. Delivery: an SSE stream (`stream: true` or `Accept: text/event-stream`), 202
    with the run (`background: true`), or by default 200 with the run and its messages
    once it settles. While a run is active, `if_busy` rejects (409), enqueues or
    interrupts; a repeated `Idempotency-Key` answers with the same run (422 if the body
    differs). `webhook_url` is told of this run's events too (422 when refused)."""
    mode = delivery_mode(request, stream=body.stream, background=body.background)
    # what a retry with the same key must repeat (a post without a key has no retry)
    digest = (
        request_hash(body.model_dump(mode="json", exclude={"stream", "background"}))
        if idempotency_key is not None
        else ""
    )
    runtime, session = turn.runtime, turn.session
    if body.webhook_url is not None:
        await endpoints.check_turn_url(runtime.settings, body.webhook_url)
    run = await runtime.admission.post_turn(
        turn.db,
        session.row,
        version=session.version,
        content=body.content,
        parent_uuid=body.parent_uuid,
        if_busy=body.if_busy,
        idempotency_key=idempotency_key,
        digest=digest,
        webhook_url=body.webhook_url,
    )
    return deliver(runtime, run, mode)


@router.post(
    "/messages/{message_uuid}/regenerate",
    responses=TURN_RESPONSES,
    response_model=None,
    dependencies=[Depends(count_turn)],
    summary="Regenerate a reply",
)
async def regenerate(
    message_uuid: uuid.UUID,
    body: DeliveryMode,
    request: Request,
    session: SessionDep,
    db: DbDep,
    runtime: RuntimeDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """A new assistant reply to the parent of assistant message `message_uuid`, as its
    sibling (the old reply stays in the tree) and the new head; delivered like a posted
    turn. 422 for a message that is not an assistant reply with a parent; 409 while a run
    is active. A repeated `Idempotency-Key` answers with the same run, as for a post."""
    mode = delivery_mode(request, stream=body.stream, background=body.background)
    digest = request_hash({"regenerate": str(message_uuid)})
    run = await runtime.admission.regenerate(
        db, session, message_uuid, idempotency_key=idempotency_key, digest=digest
    )
    return deliver(runtime, run, mode)


@router.get("/runs", summary="List runs")
async def list_runs(
    session: SessionDep,
    db: DbDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: AfterQuery = None,
) -> Page[RunOut]:
    """The session's runs, newest first, a page at a time (`after`: the `next_cursor` of
    the previous page; 422 for a cursor that is not one)."""
    rows, cursor = await runs.list_page(db, session.id, after=after, limit=limit)
    return Page[RunOut](data=[run_out(r) for r in rows], next_cursor=cursor)


@router.get("/runs/{run_id}", summary="Get a run")
async def get_run(run_id: uuid.UUID, session: SessionDep, db: DbDep) -> RunOut:
    """One run: its kind, status, usage and error, and in `requires_action` the client tool
    calls it waits for. 404 when the session has no such run."""
    return run_out(await runs.load(db, session.id, run_id))


@router.get(
    "/runs/{run_id}/events",
    response_class=Response,
    responses={200: SSE_RESPONSES[200]},
    summary="Stream a run's events",
)
async def run_events(
    run_id: uuid.UUID,
    session: SessionDep,
    db: DbDep,
    runtime: RuntimeDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_EVENT_ID)] = None,
) -> Response:
    """The run's events as Server-Sent Events: the stored ones after `Last-Event-ID` (or the
    `after` query parameter), byte for byte as first sent, then live ones until the run
    settles. Event ids grow and are never reused, so a client that reconnects (to any
    replica) misses nothing stored. 422 for an id that is not a whole number from 0 to
    2^63-1, or is past the last event of a finished run (past that of a live one, nothing
    is replayed)."""
    run = await runs.load(db, session.id, run_id)
    start = after or 0
    if last_event_id is not None:
        start = _event_id(last_event_id)
    if run.status in FINAL_RUN_STATUSES and start > run.last_event_seq:
        where: list[str | int] = (
            ["header", "Last-Event-ID"] if last_event_id is not None else ["query", "after"]
        )
        raise Invalid.field(
            where, "past the run's last event", f"The run's last event is {run.last_event_seq}"
        )
    return sse_stream(runtime, run_id, start)


def _event_id(header: str) -> int:
    value = header.strip()
    if not _EVENT_ID.fullmatch(value) or int(value) > MAX_EVENT_ID:
        raise Invalid.field(
            ["header", "Last-Event-ID"],
            "not an event id",
            "Last-Event-ID must be an event id (a whole number from 0 to 2^63-1)",
        )
    return int(value)


@router.post("/runs/{run_id}/cancel", summary="Cancel a run")
async def cancel_run(
    run_id: uuid.UUID, session: SessionDep, db: DbDep, runtime: RuntimeDep
) -> RunOut:
    """Stop the run; what it produced is kept and the history stays valid (open tool calls
    are answered as cancelled). Idempotent: a finished run is returned unchanged."""
    run = await runs.load(db, session.id, run_id)
    return run_out(await runtime.admission.cancel(db, session, run))


@router.post(
    "/runs/{run_id}/tool_results",
    responses=TURN_RESPONSES,
    response_model=None,
    summary="Submit client tool results",
)
async def submit_tool_results(
    run_id: uuid.UUID,
    body: ToolResultsIn,
    request: Request,
    session: SessionDep,
    db: DbDep,
    runtime: RuntimeDep,
) -> Response:
    """Answer the client tool calls of a run in `requires_action` (exactly the pending ones)
    and resume it; delivered like a posted turn. Accepted once: the same body again
    answers as the first post did; other results for the same calls are a 409, as is a
    run that is not waiting for tool results; 422 when the results do not match the
    pending calls."""
    run = await runs.load(db, session.id, run_id)
    mode = delivery_mode(request, stream=body.stream, background=body.background)
    after_seq, message_seq = await runtime.admission.submit_tool_results(db, session, run, body)
    return deliver(runtime, run, mode, after_seq=after_seq, messages_from=message_seq)
