"""Everything one process holds: the shared resources runs use, the supervisor of the
runs executing here, and admission of new work. Built by `create_app`; nothing of it
lives at module level.

Start-up checks the configuration against the bind address and the database, then
starts the background loops (lease heartbeat, reaper, webhook sender). Shutdown stops
accepting work (readyz answers 503), tells open streams to reconnect, lets short runs
end and hands the others over to another replica, so nothing a client sent is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys

from sqlalchemy.exc import DBAPIError

from app import auth
from app.config import Settings
from app.engine.admission import Admission
from app.engine.quotas.rate import RateLimiter
from app.engine.resources import Resources
from app.engine.supervisor import Supervisor
from app.engine.webhooks.sender import Sender
from app.migrate import head_revision

log = logging.getLogger("parley.runtime")

# A turn allocates thousands of containers, and some end in reference cycles only the
# collector frees (the tracebacks of an SSE stream's cancelled helper tasks, a run's
# callbacks). At Python's default (700, 10, 10) a young collection ran about once a
# turn and the collector took 8-9% of the process's CPU under load; at these, about 3%.
# A young collection lasts as long as it has live young objects to visit: much larger
# thresholds saved nothing more and paused for 60-80 ms (at 100,000).
GC_THRESHOLDS = (10_000, 10, 10)


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
        self.resources = Resources.of(settings)
        self.db = self.resources.db
        self.events = self.resources.events
        self.views = self.resources.views
        self.supervisor = Supervisor(self.resources)
        self.admission = Admission(self.resources, self.supervisor)
        self.webhooks = Sender(self.db, settings)
        self.rates = RateLimiter(self.db)
        self.migration_head = head_revision()
        self.open_mode = not settings.api_keys
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
            asyncio.create_task(self.supervisor.heartbeat_loop(), name="parley-heartbeat"),
            asyncio.create_task(self.supervisor.reaper_loop(), name="parley-reaper"),
            asyncio.create_task(self.webhooks.loop(), name="parley-webhooks"),
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
        gc.set_threshold(*GC_THRESHOLDS)

    async def _has_stored_keys(self) -> bool:
        try:
            async with self.db.sessionmaker() as db:
                return await auth.has_stored_keys(db)
        except DBAPIError:
            log.warning("could not read stored API keys (database not migrated yet?)")
            return False

    async def stop(self) -> None:
        # Leases are renewed until the runs here have ended or been handed over.
        await self.supervisor.shutdown()
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.events.stop()
        await self.resources.llm.aclose()
        await self.webhooks.aclose()
        await self.db.dispose()
