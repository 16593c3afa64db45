"""Request dependencies as Annotated aliases: settings, the transactional db handle,
the caller's tenant, and resources loaded by id (404 when absent or not the tenant's)."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Path, Request
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.errors import NotFound, Unauthorized
from app.models import AgentSession, ApiKey

if TYPE_CHECKING:
    from app.engine.runtime import Runtime

OPEN_TENANT = "default"


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_settings(request: Request) -> Settings:
    return get_runtime(request).settings


async def get_db(request: Request) -> AsyncIterator[AsyncSession]:
    """One transaction per request: services flush, this commits before the response."""
    async with get_runtime(request).db.sessionmaker() as db:
        try:
            yield db
            await db.commit()
        except BaseException:
            await db.rollback()
            raise


RuntimeDep = Annotated["Runtime", Depends(get_runtime)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[AsyncSession, Depends(get_db, scope="function")]


async def get_tenant(request: Request, db: DbDep) -> str:
    runtime = get_runtime(request)
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        if runtime.open_mode and not header:
            return OPEN_TENANT
        raise Unauthorized()
    digest = hashlib.sha256(presented.strip().encode()).digest()
    tenant = None
    # Compare against every configured key, without stopping early, in constant time each.
    for key in runtime.settings.configured_keys:
        if hmac.compare_digest(digest, key.key_sha256):
            tenant = key.tenant
    if tenant is None:
        stored = await db.scalar(
            select(ApiKey.tenant).where(
                ApiKey.key_sha256 == digest.hex(), ApiKey.revoked_at.is_(None)
            )
        )
        tenant = stored
    if tenant is None:
        raise Unauthorized("The API key is not valid")
    return tenant


TenantDep = Annotated[str, Depends(get_tenant)]


async def load_session(
    db: DbDep, tenant: TenantDep, session_id: Annotated[uuid.UUID, Path()]
) -> AgentSession:
    session = await db.get(AgentSession, session_id)
    if session is None or session.tenant != tenant:
        raise NotFound(f"Session {session_id} not found")
    return session


SessionDep = Annotated[AgentSession, Depends(load_session)]
