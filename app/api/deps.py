"""Request dependencies as Annotated aliases: the runtime and its settings, the request's
transaction, the caller's tenant, and the session named in the path (404 when absent or
not the tenant's)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app import auth
from app.config import Settings
from app.conversation import session_rows, sessions
from app.conversation.session_rows import TurnSession
from app.conversation.views import ChainCache
from app.db import after_commit, after_rollback
from app.engine.runtime import Runtime
from app.errors import Forbidden, NotFound, Unauthorized
from app.models import AgentSession
from app.pagination import MAX_CURSOR_CHARS
from app.schemas import Text

# `after` of every list: the `next_cursor` of the previous page (opaque, bounded).
AfterQuery = Annotated[Text | None, Query(max_length=MAX_CURSOR_CHARS)]


# The dependencies are coroutines, even those that do no I/O: FastAPI runs a plain
# function in its thread pool, a thread hop per request for nothing.
async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_settings(runtime: RuntimeDep) -> Settings:
    return runtime.settings


async def get_views(runtime: RuntimeDep) -> ChainCache:
    return runtime.views


async def get_db(runtime: RuntimeDep) -> AsyncIterator[AsyncSession]:
    """One transaction per request: services flush, this commits when the route returns
    (before the answer is sent), then starts what waited for the commit (a claimed run)."""
    async with runtime.db.transaction() as db:
        yield db


SettingsDep = Annotated[Settings, Depends(get_settings)]
ViewsDep = Annotated[ChainCache, Depends(get_views)]
# scope="function": the commit happens when the route returns, not after the response,
# so a streamed or awaited answer always sees committed state.
DbDep = Annotated[AsyncSession, Depends(get_db, scope="function")]


# What a browser token may do besides reading its session (GET under SESSION_PATH).
SESSION_PATH = "/sessions/{session_id}"
TOKEN_WRITES = frozenset(
    {
        ("POST", SESSION_PATH + "/messages"),
        ("POST", SESSION_PATH + "/runs/{run_id}/tool_results"),
    }
)


async def authenticate(request: Request, db: AsyncSession, runtime: Runtime) -> auth.Caller:
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        if runtime.open_mode and not header:
            return auth.Caller(auth.OPEN_TENANT, "open")
        raise Unauthorized()
    if presented.startswith(auth.TOKEN_PREFIX):
        caller = auth.read_token(runtime.settings, presented)
        check_token_scope(request, caller)
        return caller
    tenant = await auth.tenant_for_key(db, runtime.settings, presented)
    if tenant is None:
        raise Unauthorized("The API key is not valid")
    return auth.Caller(tenant, auth.key_id(presented))


def check_token_scope(request: Request, caller: auth.Caller) -> None:
    """A browser token reads its session and posts turns and tool results there; 403
    for anything else (its session is checked by `load_session`: 404 for another)."""
    route = request.scope.get("route")
    path = getattr(route, "path", "")
    method = request.method
    if path == SESSION_PATH or path.startswith(SESSION_PATH + "/"):
        if method in ("GET", "HEAD"):
            return
        if (method, path) in TOKEN_WRITES:
            if caller.read_only:
                raise Forbidden("This browser token is read-only")
            return
    raise Forbidden("A browser token may only read its session, post turns and answer tools")


async def get_caller(request: Request, db: DbDep, runtime: RuntimeDep) -> auth.Caller:
    """The authenticated caller, counted against its key's request rate."""
    caller = await authenticate(request, db, runtime)
    limits = runtime.settings.limits_of(caller.tenant)
    await runtime.rates.hit(caller.key_id, limits.requests_per_minute or 0, "requests")
    return caller


CallerDep = Annotated[auth.Caller, Depends(get_caller)]


async def get_tenant(caller: CallerDep) -> str:
    return caller.tenant


TenantDep = Annotated[str, Depends(get_tenant)]


async def count_turn(caller: CallerDep, runtime: RuntimeDep) -> None:
    """A dependency of the routes that start a turn: the key's turns per minute."""
    limits = runtime.settings.limits_of(caller.tenant)
    await runtime.rates.hit(caller.key_id, limits.turns_per_minute or 0, "turns")


def check_token_session(caller: auth.Caller, session_id: uuid.UUID) -> None:
    """A browser token's own session only: any other is as absent as a missing one."""
    if caller.session_id is not None and caller.session_id != session_id:
        raise NotFound(f"Session {session_id} not found")


async def load_session(
    request: Request,
    db: DbDep,
    caller: CallerDep,
    runtime: RuntimeDep,
    session_id: Annotated[uuid.UUID, Path()],
) -> AgentSession:
    """The caller's session. A request that may change it (any method but GET and HEAD)
    is writing the row until it ends, and forgets the copy kept in memory once it
    commits (`session_rows`)."""
    check_token_session(caller, session_id)
    session = await sessions.get(db, caller.tenant, session_id)
    if request.method not in ("GET", "HEAD"):
        rows = runtime.resources.session_rows
        rows.begin_writing(session_id)

        def committed() -> None:
            rows.forget(session_id)
            rows.end_writing(session_id)

        after_commit(db, committed)
        after_rollback(db, lambda: rows.end_writing(session_id))
    return session


@dataclass(frozen=True, slots=True)
class PostedTurn:
    """What the route of a posted turn works with: the request's transaction, the
    runtime, and the session the turn goes to."""

    db: AsyncSession
    runtime: Runtime
    session: TurnSession


async def open_turn(
    request: Request, session_id: Annotated[uuid.UUID, Path()]
) -> AsyncIterator[PostedTurn]:
    """`get_db`'s transaction, for a caller counted against its key's request and turn
    rates, and the session the turn is posted to: from the row this process keeps when
    it has it (`session_rows`: the claim is guarded on its version). One dependency
    where another route has five (`RuntimeDep`, `DbDep`, `CallerDep`, `count_turn`,
    `SessionDep`): FastAPI's work per dependency is a noticeable part of a turn's."""
    runtime: Runtime = request.app.state.runtime
    async with runtime.db.transaction() as db:
        caller = await get_caller(request, db, runtime)
        await count_turn(caller, runtime)
        check_token_session(caller, session_id)
        rows = runtime.resources.session_rows
        session = await session_rows.for_turn(db, rows, caller.tenant, session_id)
        yield PostedTurn(db, runtime, session)


SessionDep = Annotated[AgentSession, Depends(load_session)]
# scope="function", as `DbDep`: the commit happens when the route returns.
PostedTurnDep = Annotated[PostedTurn, Depends(open_turn, scope="function")]
