"""Migrations: upgrade to head, down to base, up again, and no drift from the models,
on Postgres and on SQLite."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db import Base
from app.migrate import (
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from tests.conftest import server_url


@pytest.fixture(params=["postgres", "sqlite"])
async def scratch(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """An empty database of each backend."""
    if request.param == "sqlite":
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}")
        yield engine
        await engine.dispose()
        return
    admin_url = make_url(server_url())
    name = f"parley_mig_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = create_async_engine(admin_url.set(database=name))
    yield engine
    await engine.dispose()
    async with admin.connect() as conn:
        await conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    await admin.dispose()


async def tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names())) - {
            "alembic_version"
        }


async def drift(engine: AsyncEngine) -> list[object]:
    async with engine.connect() as conn:
        return list(
            await conn.run_sync(
                lambda c: compare_metadata(
                    MigrationContext.configure(c, opts={"compare_type": True}), Base.metadata
                )
            )
        )


async def test_up_down_up_and_no_drift(scratch: AsyncEngine) -> None:
    engine = scratch
    await upgrade(engine)
    assert await current_revision(engine) == head_revision()
    assert await tables(engine) == set(Base.metadata.tables)
    await downgrade(engine)
    assert await current_revision(engine) is None
    assert await tables(engine) == set()
    await upgrade(engine)
    assert await drift(engine) == []
    await alembic_check(engine)  # what `alembic check` runs: raises on any difference


async def alembic_check(engine: AsyncEngine) -> None:
    def check(sync_conn: object) -> None:
        config = alembic_config()
        config.attributes["connection"] = sync_conn
        command.check(config)

    async with engine.connect() as conn:
        await conn.run_sync(check)
