"""`Database.execute_once` on Postgres: one statement autocommitted through the driver,
its failures raised as SQLAlchemy raises them (so `is_transient` and the callers' except
clauses hold), and a connection the server ended never handed out again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, is_transient, make_engine
from tests.conftest import make_settings

PID = text("SELECT pg_backend_pid()")


@pytest.fixture
async def one_connection(database_url: str) -> AsyncIterator[Database]:
    """A database whose pool holds a single connection: every call reuses it."""
    database = Database(make_engine(make_settings(database_url, db_pool_size=1)))
    try:
        yield database
    finally:
        await database.dispose()


async def test_rows_by_position_and_autocommitted(
    one_connection: Database, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS execute_once_probe (k int UNIQUE)"))
        await conn.execute(text("TRUNCATE execute_once_probe"))
    insert = text("INSERT INTO execute_once_probe (k) VALUES (:k) RETURNING k, k * :times")
    try:
        rows = await one_connection.execute_once(insert, {"k": 3, "times": 2})
        assert [(row[0], row[1]) for row in rows] == [(3, 6)]
        # Visible at once to another connection: nothing waits for a commit.
        async with engine.connect() as other:
            stored = await other.execute(text("SELECT k FROM execute_once_probe"))
            assert stored.scalars().all() == [3]

        with pytest.raises(sa_exc.IntegrityError) as raised:
            await one_connection.execute_once(insert, {"k": 3, "times": 2})
        assert not is_transient(raised.value)
        assert getattr(raised.value.orig, "sqlstate", None) == "23505"
        # The statement's own fault: the connection goes on serving.
        assert await one_connection.execute_once(insert, {"k": 4, "times": 1})
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TABLE IF EXISTS execute_once_probe"))


async def test_a_connection_the_server_ended_is_transient_and_replaced(
    one_connection: Database, engine: AsyncEngine
) -> None:
    [(before,)] = await one_connection.execute_once(PID, {})
    async with engine.connect() as admin:
        await admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": before})

    with pytest.raises(sa_exc.DBAPIError) as raised:
        await one_connection.execute_once(PID, {})
    assert raised.value.connection_invalidated
    assert is_transient(raised.value)  # a run retries it, a request answers 503

    [(after,)] = await one_connection.execute_once(PID, {})
    assert after != before, "the dead connection was dropped from the pool"


async def test_the_echo_log_shows_what_goes_through_the_driver(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`PARLEY_DB_ECHO` shows every statement, these included (they bypass SQLAlchemy's
    execution, which writes the echo log)."""
    database = Database(make_engine(make_settings(database_url, db_echo=True)))
    try:
        with caplog.at_level("INFO", logger="sqlalchemy.engine.Engine"):
            await database.execute_once(text("SELECT :n + 1"), {"n": 41})
    finally:
        await database.dispose()
    assert any(
        "SELECT $1 + 1" in r.getMessage() and "[41]" in r.getMessage() for r in caplog.records
    )
