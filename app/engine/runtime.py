"""Everything one process holds: settings, database, model client, event hub, runs.

Start-up checks the configuration against the bind address and the database, then
starts the background loops (lease heartbeat and reaper). Shutdown stops accepting
work, tells open streams to reconnect, and hands unfinished runs back to the lease
mechanism so nothing a client sent is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import sys

from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from app.config import Settings
from app.conversation.views import VIEW_CACHE
from app.db import Database, make_engine
from app.engine.compaction import CompactionHooks, WebhookHook
from app.engine.events import EventHub
from app.engine.llm.client import ModelClient, make_model_client
from app.engine.runs import RunManager
from app.migrate import head_revision
from app.models import ApiKey

log = logging.getLogger("parley.runtime")


def bind_host(settings: Settings) -> str:
    """The address uvicorn was told to bind (its CLI flag or env), else our setting."""
    argv = sys.argv
    for i, arg in enumerate(argv):
        if arg == "--host" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--host="):
            return arg.split("=", 1)[1]
    return os.environ.get("UVICORN_HOST") or settings.host


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(make_engine(settings))
        self.events = EventHub(self.db, settings.event_flush_seconds)
        self.llm: ModelClient = make_model_client(settings)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.migration_head = head_revision()
        self.open_mode = not settings.api_keys
        self.runs = RunManager(self)
        VIEW_CACHE.max_messages = settings.view_cache_messages
        self.compaction_hooks: list[CompactionHooks] = []
        if settings.compaction_webhook_url:
            self.compaction_hooks.append(WebhookHook(settings.compaction_webhook_url))
        self.shutting_down = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if self.open_mode:
            self.open_mode = not await self._has_stored_keys()
        if self.open_mode:
            self.settings.check_bind(bind_host(self.settings))
            log.warning(
                "no API keys configured: running OPEN as a single tenant; "
                "set PARLEY_API_KEYS to require keys"
            )
        if not self.db.is_sqlite:
            url = self.db.engine.url.set(drivername="postgresql")
            await self.events.start_listener(url.render_as_string(hide_password=False))
        self._loops = [
            asyncio.create_task(self.runs.heartbeat_loop(), name="parley-heartbeat"),
            asyncio.create_task(self.runs.reaper_loop(), name="parley-reaper"),
        ]
        log.info(
            "Parley started (model provider: %s, database: %s)",
            self.settings.provider,
            self.db.engine.dialect.name,
        )
        # Start-up objects live for the whole process; keep them out of GC scans so a
        # full collection cannot stall a turn.
        gc.collect()
        gc.freeze()

    async def _has_stored_keys(self) -> bool:
        try:
            async with self.db.sessionmaker() as db:
                count = await db.scalar(
                    select(func.count()).select_from(ApiKey).where(ApiKey.revoked_at.is_(None))
                )
                return bool(count)
        except DBAPIError:
            log.warning("could not read stored API keys (database not migrated yet?)")
            return False

    async def stop(self) -> None:
        self.shutting_down.set()
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.runs.shutdown()
        await self.events.stop()
        await self.llm.aclose()
        await self.db.dispose()
