"""The SQL a test's database runs while a block executes (asserting how many round trips a
path takes, or that it reads no row it should not), and waiting for a statement to wait
for a lock (to order writers that race)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import TextClause, event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database


@contextmanager
def recorded(database: Database) -> Iterator[list[str]]:
    """The statements `database` runs meanwhile, in order: those SQLAlchemy executes and
    those `execute_once` hands to the driver itself."""
    seen: list[str] = []
    engine = database.engine.sync_engine
    execute_once = database.execute_once

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    async def once(statement: TextClause, params: dict[str, Any]) -> list[Any]:
        if database.through_driver:
            seen.append(statement.text)  # what SQLAlchemy's events never see
        return await execute_once(statement, params)

    event.listen(engine, "before_cursor_execute", record)
    database.execute_once = once  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del database.execute_once
        event.remove(engine, "before_cursor_execute", record)


CLAIM = "%WITH claimed AS%"  # the one-statement claim (`runs.claim_at_once`), LIKE it


async def wait_for_lock(engine: AsyncEngine, query: str) -> None:
    """Until a statement LIKE `query` waits for a lock (Postgres)."""
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :q"
    )
    for _ in range(500):
        async with engine.connect() as conn:  # pg_stat_activity: a snapshot per transaction
            if await conn.scalar(waiting, {"q": query}):
                return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no statement like {query!r} waited for a lock")
