"""Routes: posting turns, regenerating, and the runs of a session (events, cancel,
client tool results)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from sqlalchemy import and_, or_, select

from app.api.deps import DbDep, RuntimeDep, SessionDep
from app.api.streaming import SSE_RESPONSES, deliver, delivery_mode, sse_stream
from app.conversation import store
from app.conversation.payloads import run_out
from app.engine.runs import load_run, request_hash
from app.errors import Invalid, NotFound
from app.models import Run
from app.schemas import DeliveryMode, Page, RunOut, ToolResultsIn, TurnIn, TurnResult

router = APIRouter(prefix="/sessions/{session_id}", tags=["runs"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)]
TURN_RESPONSES = {
    **SSE_RESPONSES,
    200: {**SSE_RESPONSES[200], "model": TurnResult},
    202: {"model": RunOut, "description": "Started in the background"},
    409: {"description": "The session has an active run (if_busy=reject)"},
}


@router.post("/messages", responses=TURN_RESPONSES, response_model=None, summary="Post a turn")
async def post_turn(
    body: TurnIn,
    request: Request,
    session: SessionDep,
    db: DbDep,
    runtime: RuntimeDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Store a user message after the head (or after `parent_uuid`) and run the agent loop
    on it. Delivery: an SSE stream (`stream: true` or `Accept: text/event-stream`), 202
    with the run (`background: true`), or by default 200 with the run and its messages
    once it settles. While a run is active, `if_busy` rejects (409), enqueues or
    interrupts; a repeated `Idempotency-Key` answers with the same run (422 if the body
    differs)."""
    mode = delivery_mode(request, stream=body.stream, background=body.background)
    digest = request_hash(body.model_dump(mode="json", exclude={"stream", "background"}))
    run = await runtime.runs.find_idempotent(db, session.id, idempotency_key, digest)
    if run is None:
        run = await runtime.runs.submit_turn(
            db,
            session,
            content=body.content,
            parent_uuid=body.parent_uuid,
            if_busy=body.if_busy,
            idempotency_key=idempotency_key,
            digest=digest,
        )
        await db.commit()
        if run.status == "running":
            runtime.runs.launch(run, session)
    return await deliver(runtime, run, mode)


@router.post(
    "/messages/{message_uuid}/regenerate",
    responses=TURN_RESPONSES,
    response_model=None,
    summary="Regenerate a reply",
)
async def regenerate(
    message_uuid: uuid.UUID,
    body: DeliveryMode,
    request: Request,
    session: SessionDep,
    db: DbDep,
    runtime: RuntimeDep,
) -> Response:
    """A new assistant reply to the parent of assistant message `message_uuid`, as its
    sibling (the old reply stays in the tree) and the new head; delivered like a posted
    turn. 422 for a message that is not an assistant reply with a parent; 409 while a run
    is active."""
    row = await store.get_message(db, session.id, message_uuid)
    if row is None:
        raise NotFound(f"Message {message_uuid} not found in this session")
    if row.role != "assistant" or row.parent_uuid is None:
        raise Invalid("Only an assistant reply with a parent can be regenerated")
    mode = delivery_mode(request, stream=body.stream, background=body.background)
    run = await runtime.runs.submit_turn(
        db,
        session,
        content=None,
        parent_uuid=row.parent_uuid,
        if_busy="reject",
        idempotency_key=None,
        digest="",
        params={"regenerate": str(message_uuid)},
    )
    await db.commit()
    runtime.runs.launch(run, session)
    return await deliver(runtime, run, mode)


@router.get("/runs", summary="List runs")
async def list_runs(
    session: SessionDep,
    db: DbDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: uuid.UUID | None = None,
) -> Page[RunOut]:
    """The session's runs, newest first, a page at a time (`after`: the id of the last run
    seen; 422 for an id that is not one of the session's runs)."""
    query = select(Run).where(Run.session_id == session.id)
    if after is not None:
        anchor = await db.get(Run, after)
        if anchor is None or anchor.session_id != session.id:
            raise Invalid("The cursor is not valid")
        query = query.where(
            or_(
                Run.created_at < anchor.created_at,
                and_(Run.created_at == anchor.created_at, Run.id < anchor.id),
            )
        )
    rows = list(
        await db.scalars(query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit + 1))
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return Page[RunOut](
        data=[run_out(r) for r in rows], next_cursor=str(rows[-1].id) if more and rows else None
    )


@router.get("/runs/{run_id}", summary="Get a run")
async def get_run(run_id: uuid.UUID, session: SessionDep, db: DbDep) -> RunOut:
    """One run: its kind, status, usage and error, and in `requires_action` the client tool
    calls it waits for. 404 when the session has no such run."""
    return run_out(await load_run(db, session.id, run_id))


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
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    after: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """The run's events as Server-Sent Events: the stored ones after `Last-Event-ID` (or the
    `after` query parameter), byte for byte as first sent, then live ones until the run
    settles. Event ids are gap-free per run, so a client that reconnects misses nothing."""
    await load_run(db, session.id, run_id)
    start = after or 0
    if last_event_id is not None:
        if not last_event_id.strip().isdigit():
            raise Invalid("Last-Event-ID must be an event id (a whole number)")
        start = int(last_event_id)
    return sse_stream(runtime, run_id, start)


@router.post("/runs/{run_id}/cancel", summary="Cancel a run")
async def cancel_run(
    run_id: uuid.UUID, session: SessionDep, db: DbDep, runtime: RuntimeDep
) -> RunOut:
    """Stop the run; what it produced is kept and the history stays valid (open tool calls
    are answered as cancelled). Idempotent: a finished run is returned unchanged."""
    run = await load_run(db, session.id, run_id)
    run = await runtime.runs.cancel(db, session, run)
    await db.commit()
    return run_out(run)


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
    and resume it; delivered like a posted turn. 409 when the run is not waiting for tool
    results; 422 when the results do not match the pending calls."""
    run = await load_run(db, session.id, run_id)
    mode = delivery_mode(request, stream=body.stream, background=body.background)
    after_seq = run.last_event_seq
    message_seq = await runtime.runs.submit_tool_results(db, session, run, body)
    await db.commit()
    runtime.runs.launch(run, session)
    return await deliver(runtime, run, mode, after_seq=after_seq, messages_after=message_seq)
