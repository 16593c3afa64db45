"""Routes: transcript export and import in Claude Code's JSONL shape."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from app.api.deps import DbDep, SessionDep, SettingsDep, TenantDep, ViewsDep
from app.api.problems import refuse_other_methods
from app.conversation import sessions, transcripts
from app.schemas import SessionOut, Text

router = APIRouter(tags=["transcripts"])

NDJSON = "application/x-ndjson"

_JSONL_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A Claude Code session file: one JSON object a line "
        "(application/x-ndjson, application/jsonl or text/plain).",
        "content": {
            media: {"schema": {"type": "string"}}
            for media in (NDJSON, "application/jsonl", "text/plain")
        },
    }
}


@router.get(
    "/sessions/{session_id}/transcript",
    response_class=StreamingResponse,
    responses={200: {"content": {NDJSON: {"schema": {"type": "string"}}}}},
    summary="Export a transcript",
)
async def export_transcript(session: SessionDep, db: DbDep) -> StreamingResponse:
    """The session's full chain (across compact boundaries), oldest first, one JSON object a
    line in the shape of Claude Code's session files, as a `.jsonl` attachment."""
    # Rows are loaded here, while the request's database session is open; only the
    # rendering is streamed.
    rows = await transcripts.export_rows(db, session)
    return StreamingResponse(
        transcripts.render(rows, session.id),
        media_type=NDJSON,
        headers={"Content-Disposition": f'attachment; filename="{session.id}.jsonl"'},
    )


refuse_other_methods(router, "/sessions/import", {"POST"})


@router.post(
    "/sessions/import", status_code=201, openapi_extra=_JSONL_BODY, summary="Import a transcript"
)
async def import_transcript(
    request: Request,
    db: DbDep,
    tenant: TenantDep,
    settings: SettingsDep,
    views: ViewsDep,
    title: Annotated[Text | None, Query(max_length=500)] = None,
    model: Annotated[Text | None, Query(min_length=1, max_length=200)] = None,
) -> SessionOut:
    """A new session holding the transcript's messages (fresh uuids, the originals kept as
    `metadata.source_uuid`), ready to be continued. Answers 201 with the session; a
    malformed line answers 422 naming its line number, and nothing is stored."""
    session = await transcripts.import_session(
        db, tenant, settings, request.stream(), title=title, model=model
    )
    return await sessions.to_out(db, session, settings, views, status="idle")
