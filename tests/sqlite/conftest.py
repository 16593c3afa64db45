"""A live server on a migrated SQLite file of its own, for the embedded-mode tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from app.main import create_app
from app.migrate import upgrade
from tests.conftest import LiveServer, free_port, make_settings


@asynccontextmanager
async def sqlite_server(tmp_path: Path, **overrides: Any) -> AsyncIterator[LiveServer]:
    """Parley on `tmp_path/parley.db` (migrated first), with settings `overrides`."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'parley.db'}"
    engine = create_async_engine(url)
    await upgrade(engine)
    await engine.dispose()
    async with LiveServer(create_app(make_settings(url, **overrides)), free_port()) as server:
        yield server
