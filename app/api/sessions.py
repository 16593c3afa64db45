"""Routes: /sessions (create, list, get, patch, delete)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from app.api.deps import DbDep, RuntimeDep, SessionDep, SettingsDep, TenantDep
from app.conversation import sessions
from app.schemas import Page, SessionCreate, SessionOut, SessionPatch

router = APIRouter(prefix="/sessions", tags=["sessions"])

Limit = Annotated[int, Query(ge=1, le=500)]


@router.post("", status_code=201)
async def create_session(
    body: SessionCreate, db: DbDep, tenant: TenantDep, settings: SettingsDep
) -> SessionOut:
    session = await sessions.create(db, tenant, body, settings)
    return await sessions.to_out(db, session, settings, status="idle")


@router.get("")
async def list_sessions(
    db: DbDep,
    tenant: TenantDep,
    settings: SettingsDep,
    limit: Limit = 50,
    after: str | None = None,
) -> Page[SessionOut]:
    rows, cursor = await sessions.list_page(db, tenant, limit=limit, after=after)
    status = await sessions.statuses(db, [row.id for row in rows])
    data = [await sessions.to_out(db, row, settings, status.get(row.id, "idle")) for row in rows]
    return Page[SessionOut](data=data, next_cursor=cursor)


@router.get("/{session_id}")
async def get_session(session: SessionDep, db: DbDep, settings: SettingsDep) -> SessionOut:
    return await sessions.to_out(db, session, settings)


@router.patch("/{session_id}")
async def patch_session(
    body: SessionPatch, session: SessionDep, db: DbDep, settings: SettingsDep
) -> SessionOut:
    await sessions.patch(db, session, body)
    return await sessions.to_out(db, session, settings)


@router.delete("/{session_id}", status_code=204)
async def delete_session(session: SessionDep, db: DbDep, runtime: RuntimeDep) -> Response:
    await runtime.runs.cancel_all_for_session(db, session.id, reason="session deleted")
    await sessions.delete_session(db, session)
    return Response(status_code=204)
