"""Request dependencies as Annotated aliases: the runtime and its settings, the request's
transaction, the caller's tenant, and the session named in the path (404 when absent or
not the tenant's)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app import auth
from app.config import Settings
from app.conversation import sessions
from app.conversation.views import ChainCache
from app.db import commit, rollback
from app.engine.runtime import Runtime
from app.errors import Unauthorized
from app.models import AgentSession
from app.pagination import MAX_CURSOR_CHARS
from app.schemas import Text

# `after` of every list: the `next_cursor` of the previous page (opaque, bounded).
AfterQuery = Annotated[Text | None, Query(max_length=MAX_CURSOR_CHARS)]


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_settings(runtime: RuntimeDep) -> Settings:
    return runtime.settings


def get_views(runtime: RuntimeDep) -> ChainCache:
    return runtime.views


async def get_db(runtime: RuntimeDep) -> AsyncIterator[AsyncSession]:
    """One transaction per request: services flush, this commits when the route returns
    (before the answer is sent), then starts what waited for the commit (a claimed run)."""
    async with runtime.db.sessionmaker() as db:
        try:
            yield db
            await commit(db)
        except BaseException:
            await rollback(db)
            raise


SettingsDep = Annotated[Settings, Depends(get_settings)]
ViewsDep = Annotated[ChainCache, Depends(get_views)]
# scope="function": the commit happens when the route returns, not after the response,
# so a streamed or awaited answer always sees committed state.
DbDep = Annotated[AsyncSession, Depends(get_db, scope="function")]


async def get_tenant(request: Request, db: DbDep, runtime: RuntimeDep) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        if runtime.open_mode and not header:
            return auth.OPEN_TENANT
        raise Unauthorized()
    tenant = await auth.tenant_for_key(db, runtime.settings, presented.strip())
    if tenant is None:
        raise Unauthorized("The API key is not valid")
    return tenant


TenantDep = Annotated[str, Depends(get_tenant)]


async def load_session(
    db: DbDep, tenant: TenantDep, session_id: Annotated[uuid.UUID, Path()]
) -> AgentSession:
    return await sessions.get(db, tenant, session_id)


SessionDep = Annotated[AgentSession, Depends(load_session)]
