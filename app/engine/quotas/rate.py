"""Requests and turns per minute per API key: a fixed-window counter row per key and
minute, incremented with one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING` in a short
transaction of its own (never the request's: that would hold the row lock, and so every
other request of the key, until the request ends)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import cast

from sqlalchemy import Table, delete

from app import metrics
from app.db import Database
from app.engine.quotas.upsert import insert_for
from app.errors import RateLimited
from app.models import RateWindow

windows_t = cast(Table, RateWindow.__table__)
WINDOW = timedelta(minutes=1)
PRUNE_EVERY_SECONDS = 60.0


class RateLimiter:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._pruned_at = 0.0

    async def hit(self, key: str, limit: int, what: str) -> None:
        """Count one use of `key` (`what`: requests or turns) in this minute; 429
        `rate_limited` with the seconds to the next window when past `limit` (0: none)."""
        if limit <= 0:
            return
        now = datetime.now(UTC)
        window = now.replace(second=0, microsecond=0)
        async with self.db.transaction() as db:
            statement = insert_for(db, windows_t).values(
                key=f"{what}:{key}", window_start=window, count=1
            )
            statement = statement.on_conflict_do_update(
                index_elements=[windows_t.c.key, windows_t.c.window_start],
                set_={"count": windows_t.c.count + 1},
            ).returning(windows_t.c.count)
            count = int((await db.execute(statement)).scalar_one())
            if time.monotonic() - self._pruned_at > PRUNE_EVERY_SECONDS:
                self._pruned_at = time.monotonic()
                await db.execute(delete(windows_t).where(windows_t.c.window_start < window))
        if count > limit:
            metrics.throttled.labels(what).inc()
            retry_after = max(1, int((window + WINDOW - now).total_seconds() + 0.999))
            raise RateLimited(
                f"Too many {what}: at most {limit} per minute for this key",
                retry_after=retry_after,
                extra={"limit": what},
            )
