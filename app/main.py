"""The FastAPI application: `create_app(settings)`; `uvicorn app.main:app` serves it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import Scope

from app import __version__
from app.api import (
    compaction,
    files,
    messages,
    openapi,
    ops,
    playground,
    runs,
    sessions,
    tokens,
    transcripts,
    usage,
    webhooks,
)
from app.api.middleware import BodyLimitMiddleware, RequestContextMiddleware, route_template
from app.api.problems import install_handlers
from app.config import Settings
from app.engine.runtime import Runtime
from app.logs import configure_logging

log = logging.getLogger("parley")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings.log_level)
    runtime = Runtime(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(
        title="Parley",
        version=__version__,
        summary="Conversation sessions for Claude agents, streamed over Server-Sent Events.",
        lifespan=lifespan,
        redoc_url=None,
    )
    app.state.runtime = runtime
    install_handlers(app)
    openapi.install(app)
    # runs first: it has the turn routes, and routes are matched in order; transcripts
    # before sessions: its `/sessions/import` must win over `/sessions/{session_id}`
    for module in (
        runs,
        ops,
        playground,
        transcripts,
        sessions,
        messages,
        compaction,
        files,
        webhooks,
        usage,
        tokens,
    ):
        app.include_router(module.router)

    def body_limit(scope: Scope) -> int:
        path = scope.get("path", "")
        if path == "/sessions/import":
            return settings.max_import_bytes
        if "/files/" in path:
            return settings.max_file_bytes
        return settings.max_body_bytes

    app.add_middleware(BodyLimitMiddleware, limit_for=body_limit)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["X-Request-Id"],
        )
    # Added last, so it wraps everything: every answer gets an X-Request-Id.
    app.add_middleware(RequestContextMiddleware, route_name=route_template)
    return app


_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    """`app.main:app` is built on first access, so importing this module (tests, tools)
    does not read the environment or build an app nobody asked for."""
    global _app
    if name == "app":
        if _app is None:
            _app = create_app()
        return _app
    raise AttributeError(name)
