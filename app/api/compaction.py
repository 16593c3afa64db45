"""Routes: context accounting, the next request, manual compaction and snips."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from app.api.delivery import SettledResponse, deliver
from app.api.deps import DbDep, RuntimeDep, SessionDep, SettingsDep, ViewsDep
from app.api.problems import PROBLEM_JSON, domain_problem
from app.conversation import snips
from app.conversation.context_report import check_compactable, context_report, next_request
from app.conversation.payloads import run_out
from app.conversation.records import MessageRecord
from app.domain import RunStatus
from app.errors import DomainError, Invalid, NoGain, UpstreamFailed
from app.models import Run
from app.schemas import (
    CompactIn,
    CompactRefused,
    CompactResult,
    ContextOut,
    RunOut,
    SnipIn,
    SnipOut,
)

router = APIRouter(prefix="/sessions/{session_id}", tags=["compaction"])

GAIN_FIGURES = ("pre_tokens", "post_tokens", "min_saving")


@router.get("/context", summary="Get context usage")
async def get_context(
    session: SessionDep, db: DbDep, settings: SettingsDep, views: ViewsDep
) -> ContextOut:
    """How full the session's context is (estimated tokens against the window, the warning
    and auto-compaction thresholds) and what fills it (system, tools, messages, tool
    results), with the last compaction."""
    return await context_report(db, session, settings, views)


@router.get(
    "/context/request",
    summary="Preview the next model request",
    responses={409: {"description": "The session has no messages yet"}},
)
async def get_next_request(
    session: SessionDep, db: DbDep, settings: SettingsDep, views: ViewsDep
) -> dict[str, Any]:
    """The exact JSON body of the next model request (system, tools, the compacted and
    normalized messages, cache breakpoints), built but not sent; always a body the
    Messages API accepts. When the conversation ends with a finished reply, the next
    request waits for the next user message: the body is the conversation so far, the
    final reply sent as a prefill (without its thinking blocks, and without `thinking`).
    409 when the session has no messages yet."""
    return await next_request(db, session, settings, views)


@router.post(
    "/compact",
    response_model=CompactResult,
    responses={
        202: {"model": RunOut, "description": "Started in the background"},
        409: {"description": "Another run is active"},
        422: {
            "model": CompactRefused,
            "description": (
                "Refused, nothing changed: `invalid_request` when nothing can be compacted "
                "(the detail says why), `nothing_to_gain` when compacting would not make "
                "the next request smaller by the minimum saving (with both figures)"
            ),
        },
        502: {"description": "The summary request failed; nothing changed"},
    },
    summary="Compact the context",
)
async def compact_now(
    session: SessionDep, db: DbDep, runtime: RuntimeDep, body: CompactIn | None = None
) -> Response:
    """Summarise the conversation now: a run of kind `compact` that holds the session and
    leaves a compact boundary and a summary. Answers 200 with the result once done, or
    202 with the run when `background: true`; 409 while another run is active; 422 when
    nothing can be compacted safely, or with the problem type `nothing_to_gain` (and
    `pre_tokens`, `post_tokens`, `min_saving`) when the compacted request would not be
    smaller than the current one by at least `PARLEY_COMPACTION_MIN_SAVING` (checked
    before the summary request with the shortest summary, and again with the real one);
    502 when the summary request failed (nothing changed). `pre_tokens` is the request
    that would have been sent, `post_tokens` the one that will be, `tokens_saved` their
    difference; the summary request's usage counts on the run and the session."""
    body = body or CompactIn()
    await check_compactable(db, session, runtime.settings, runtime.views)
    run = await runtime.admission.compact(db, session, body.instructions)
    if body.background:
        return deliver(runtime, run, "background")
    return SettledResponse(runtime, run.id, _compaction_result)


def _compaction_result(run: Run, _records: list[MessageRecord]) -> Response:
    """200 with what the compaction did; 422 when nothing could be compacted, 502 when the
    summary request failed (nothing changed either way)."""
    if run.status != RunStatus.COMPLETED or run.state.compaction is None:
        error = run.error or {}
        message = error.get("message", "The compaction failed; nothing changed")
        kind = error.get("type")
        failure: DomainError
        if kind == "nothing_to_gain":
            figures = {key: error[key] for key in GAIN_FIGURES if key in error}
            failure = NoGain(message, extra=figures)
        elif kind == "nothing_to_compact":
            failure = Invalid(message)
        else:
            failure = UpstreamFailed(message)
        status, problem = domain_problem(failure)
        return JSONResponse(problem, status_code=status, media_type=PROBLEM_JSON)
    outcome = run.state.compaction.model_dump(mode="json", exclude={"trigger"})
    result = CompactResult.model_validate({"run": run_out(run), **outcome})
    return JSONResponse(result.model_dump(mode="json"))


@router.post(
    "/snip",
    responses={409: {"description": "Snipping would split a tool call or leave no user turn"}},
    summary="Snip messages",
)
async def snip_messages(
    body: SnipIn, session: SessionDep, db: DbDep, settings: SettingsDep, views: ViewsDep
) -> SnipOut:
    """Leave messages out of every later model request; they stay in the history. 422 for
    compaction rows and messages outside the model's current view; 409 when snipping
    would split a tool call from its result or leave the view without a first user
    message."""
    uuids = await snips.snip(db, session, settings, views, body.uuids)
    return SnipOut(snipped=uuids)
