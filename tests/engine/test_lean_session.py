"""`LeanSession`, the sessions of `Database`: a commit, rollback or close with nothing to
do skips SQLAlchemy's round trip through a greenlet, and nothing else is skipped: what a
session added, changed or read commits, rolls back and gives its connection back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, LeanSession, make_engine
from app.models import AgentSession
from tests.conftest import make_settings


@pytest.fixture
async def database(database_url: str, engine: AsyncEngine) -> AsyncIterator[Database]:
    """A pool of one connection: a session that kept its connection would block the next."""
    database = Database(make_engine(make_settings(database_url, db_pool_size=1)))
    try:
        yield database
    finally:
        await database.dispose()


def new_session_row() -> AgentSession:
    return AgentSession(id=uuid.uuid4(), tenant="tenant-a", model="claude-test")


async def stored_title(database: Database, session_id: uuid.UUID) -> str | None:
    async with database.sessionmaker() as db:
        row = await db.get(AgentSession, session_id)
        return None if row is None else row.title


async def test_what_a_session_added_or_changed_is_committed(database: Database) -> None:
    row = new_session_row()
    async with database.sessionmaker() as db:
        assert isinstance(db, LeanSession)
        db.add(row)
        await db.commit()
        # Changed after the commit: the change begins a transaction, which commits.
        row.title = "renamed"
        await db.commit()
    assert await stored_title(database, row.id) == "renamed"


async def test_what_a_session_changed_is_rolled_back(database: Database) -> None:
    row, dropped = new_session_row(), new_session_row()
    row_id, dropped_id = row.id, dropped.id
    row.title = "kept"
    async with database.sessionmaker() as db:
        db.add(row)
        await db.commit()
        db.add(dropped)
        await db.rollback()
        row.title = "not kept"  # begins a transaction again
        await db.rollback()
        await db.commit()  # a skipped rollback would have this store them
    assert await stored_title(database, row_id) == "kept"
    async with database.sessionmaker() as db:
        assert await db.get(AgentSession, dropped_id) is None


async def test_a_session_gives_its_connection_back(database: Database) -> None:
    row = new_session_row()
    async with database.sessionmaker() as db:
        db.add(row)
        await db.commit()
    for _ in range(3):  # each read holds the pool's only connection until its close
        async with database.sessionmaker() as db:
            assert await db.get(AgentSession, row.id) is not None
        db = database.sessionmaker()
        await db.get(AgentSession, row.id)
        await db.close()
    async with database.sessionmaker() as db:
        await db.commit()  # nothing to do
        await db.rollback()
    assert database.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
