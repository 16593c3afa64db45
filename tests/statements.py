"""The SQL a test's database runs while a block executes (asserting how many round trips a
path takes, or that it reads no row it should not)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import TextClause, event

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
