"""Routes: context accounting, the next request, manual compaction and snips."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from app.api.deps import DbDep, RuntimeDep, SessionDep
from app.api.streaming import deliver
from app.conversation import snips
from app.conversation.payloads import run_out
from app.conversation.views import load_view
from app.engine import compaction
from app.engine.requests import build_body
from app.errors import Invalid, NotFound, UpstreamError
from app.models import Run
from app.schemas import CompactIn, CompactResult, ContextOut, RunOut, SnipIn, SnipOut

router = APIRouter(prefix="/sessions/{session_id}", tags=["compaction"])


@router.get("/context", summary="Get context usage")
async def get_context(session: SessionDep, db: DbDep, runtime: RuntimeDep) -> ContextOut:
    """How full the session's context is (estimated tokens against the window, the warning
    and auto-compaction thresholds) and what fills it (system, tools, messages, tool
    results), with the last compaction."""
    return ContextOut.model_validate(await compaction.context_report(db, session, runtime))


@router.get("/context/request", summary="Preview the next model request")
async def get_next_request(session: SessionDep, db: DbDep) -> dict[str, Any]:
    """The exact JSON body of the next model request (system, tools, the compacted and
    normalized messages, cache breakpoints), built but not sent."""
    view = await load_view(db, session)
    return build_body(session, view.projected)


@router.post(
    "/compact",
    response_model=CompactResult,
    responses={
        202: {"model": RunOut, "description": "Started in the background"},
        409: {"description": "Another run is active"},
        422: {"description": "Nothing can be compacted safely"},
        502: {"description": "The summary request failed; nothing changed"},
    },
    summary="Compact the context",
)
async def compact_now(
    session: SessionDep, db: DbDep, runtime: RuntimeDep, body: CompactIn | None = None
) -> Response:
    """Summarise the conversation now: a run of kind `compact` that holds the session and
    leaves a compact boundary and a summary. Answers 200 with the result once done, or
    202 with the run when `background: true`; 409 while another run is active, 422 when
    nothing can be compacted safely, 502 when the summary request failed (nothing
    changed)."""
    body = body or CompactIn()
    await compaction.precheck(db, session, runtime)
    run = await runtime.runs.submit_turn(
        db,
        session,
        content=None,
        parent_uuid=None,
        if_busy="reject",
        idempotency_key=None,
        digest="",
        kind="compact",
        params={"instructions": body.instructions},
    )
    await db.commit()
    runtime.runs.launch(run, session)
    if body.background:
        return await deliver(runtime, run, "background")
    await runtime.runs.wait_settled(run.id)
    async with runtime.db.sessionmaker() as fresh:
        done = await fresh.get(Run, run.id)
    if done is None:
        raise NotFound(f"Run {run.id} not found")
    error = done.error or {}
    if done.status != "completed":
        if error.get("type") == "nothing_to_compact":
            raise Invalid(error.get("message", "Nothing can be compacted safely"))
        raise UpstreamError(error.get("message", "The compaction failed; nothing changed"))
    outcome = (done.state or {}).get("compaction", {})
    result = CompactResult.model_validate({"run": run_out(done), **outcome})
    return JSONResponse(result.model_dump(mode="json"))


@router.post("/snip", summary="Snip messages")
async def snip_messages(body: SnipIn, session: SessionDep, db: DbDep) -> SnipOut:
    """Leave messages out of every later model request; they stay in the history. 422 for
    compaction rows and messages outside the model's current view; 409 when snipping
    would split a tool call from its result or leave the view without a first user
    message."""
    return SnipOut(snipped=await snips.snip(db, session, body.uuids))
