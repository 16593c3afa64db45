"""Routes: /sessions (create, list, get, patch, delete)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from app.api.deps import AfterQuery, DbDep, RuntimeDep, SessionDep, SettingsDep, TenantDep, ViewsDep
from app.conversation import sessions
from app.schemas import Page, SessionCreate, SessionOut, SessionPatch

router = APIRouter(prefix="/sessions", tags=["sessions"])

Limit = Annotated[int, Query(ge=1, le=500)]


@router.post("", status_code=201, summary="Create a session")
async def create_session(
    body: SessionCreate, db: DbDep, tenant: TenantDep, settings: SettingsDep, views: ViewsDep
) -> SessionOut:
    """Create an empty session for the caller's tenant: model, system prompt, client and
    built-in tools, thinking, and compaction settings (unset ones follow the service's
    defaults). Answers 201 with the session; 422 for settings that do not fit together
    (a thinking mode the model lacks, a thinking budget not below `max_tokens`, client
    tools named like built-in ones)."""
    session = await sessions.create(db, tenant, body, settings)
    return await sessions.to_out(db, session, settings, views, status="idle")


@router.get("", summary="List sessions")
async def list_sessions(
    db: DbDep,
    tenant: TenantDep,
    settings: SettingsDep,
    views: ViewsDep,
    limit: Limit = 50,
    after: AfterQuery = None,
) -> Page[SessionOut]:
    """The tenant's sessions, newest first, a page at a time: pass `next_cursor` back as
    `after` for the next page. A cursor that is not one answers 422."""
    rows, cursor = await sessions.list_page(db, tenant, limit=limit, after=after)
    status = await sessions.statuses(db, [row.id for row in rows])
    data = [
        await sessions.to_out(db, row, settings, views, status.get(row.id, "idle")) for row in rows
    ]
    return Page[SessionOut](data=data, next_cursor=cursor)


@router.get("/{session_id}", summary="Get a session")
async def get_session(
    session: SessionDep, db: DbDep, settings: SettingsDep, views: ViewsDep
) -> SessionOut:
    """One session with its status (`idle`, or the status of its active run), its
    accumulated usage and an estimate of how full its context is. 404 when it does not
    exist or belongs to another tenant."""
    return await sessions.to_out(db, session, settings, views)


@router.patch("/{session_id}", summary="Update a session")
async def patch_session(
    body: SessionPatch, session: SessionDep, db: DbDep, settings: SettingsDep, views: ViewsDep
) -> SessionOut:
    """Change a session's settings; later turns use them. `metadata` and `compaction` are
    merged as a JSON Merge Patch (RFC 7396: null removes a key). 422 when the result is
    invalid, and nothing changes."""
    await sessions.patch(db, session, body)
    return await sessions.to_out(db, session, settings, views)


@router.delete("/{session_id}", status_code=204, summary="Delete a session")
async def delete_session(session: SessionDep, db: DbDep, runtime: RuntimeDep) -> Response:
    """Cancel the session's active and queued runs, then delete the session with its
    messages, runs, events and files. Answers 204."""
    await runtime.admission.cancel_all(db, session, reason="session deleted")
    await sessions.delete_session(db, session)
    return Response(status_code=204)
