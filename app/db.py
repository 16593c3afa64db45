"""Database plumbing: the declarative Base, the engine and the session factory.

Services flush and never commit; the request dependency (`api.deps.get_db`) commits
once per request, and background work (runs) opens its own short transactions. Work that
must wait for a commit (starting a claimed run) is registered with `after_commit`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from enum import StrEnum
from typing import Any, Generic, TypeVar, cast

from pydantic import BaseModel
from sqlalchemy import JSON, Dialect, MetaData, String, TextClause, TypeDecorator, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.pool import StaticPool
from sqlalchemy.util import await_, greenlet_spawn

from app.config import Settings

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# The logger SQLAlchemy's `echo` writes to.
_ECHO = logging.getLogger("sqlalchemy.engine.Engine")

# SQLSTATEs of a server that cannot serve now: connection exceptions (class 08), shutting
# down or starting up (57P01-57P03), too many connections (53300).
_TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300")


# Text Postgres cannot hold: a NUL in text (22021) or in JSON (22P05, `\u0000`).
_UNSTORABLE_TEXT_SQLSTATES = frozenset({"22021", "22P05"})


def _sqlstate(exc: BaseException) -> str | None:
    driver = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    sqlstate = getattr(driver, "sqlstate", None)
    return sqlstate if isinstance(sqlstate, str) else None


def is_transient(exc: BaseException) -> bool:
    """Whether a failure says the database cannot be reached now (refused, lost,
    restarting, no pooled connection free) rather than that a statement is wrong: the
    same work may succeed when it is tried again. Follows the chain of causes, since
    drivers and frameworks wrap what they catch."""
    seen: BaseException | None = exc
    while seen is not None:
        if _says_unreachable(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _says_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, sa_exc.TimeoutError):  # the pool had no connection in time
        return True
    if isinstance(exc, sa_exc.DBAPIError) and (
        exc.connection_invalidated
        or isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError))
    ):
        return True
    sqlstate = _sqlstate(exc)
    if sqlstate is not None and sqlstate.startswith(_TRANSIENT_SQLSTATES):
        return True
    # A refused or timed-out connect comes from the driver unwrapped.
    return isinstance(exc, (ConnectionError, TimeoutError))


def driver_error(
    exc: Exception, statement: str, params: dict[str, Any], *, closed: bool
) -> sa_exc.DBAPIError:
    """What SQLAlchemy would raise for an error the driver raised outside it
    (`Database.execute_once`), keeping the driver's error (and SQLSTATE) as `orig`: a
    constraint violation is an IntegrityError; a connection that is gone (`closed`, a
    socket error or timeout, a server that cannot serve) an OperationalError that
    invalidated it; anything else a DBAPIError."""
    sqlstate = _sqlstate(exc) or ""
    if sqlstate.startswith("23"):
        return sa_exc.IntegrityError(statement, params, exc)
    if (
        closed
        or isinstance(exc, (OSError, TimeoutError))
        or sqlstate.startswith(_TRANSIENT_SQLSTATES)
    ):
        return sa_exc.OperationalError(statement, params, exc, connection_invalidated=True)
    return sa_exc.DBAPIError(statement, params, exc)


def is_unstorable_text(exc: BaseException) -> bool:
    """Whether Postgres refused a value for holding a NUL character (which a client can
    send as `\u0000` in JSON): the request's fault, not the service's."""
    return _sqlstate(exc) in _UNSTORABLE_TEXT_SQLSTATES


# JSONB on Postgres (indexable, compact), plain JSON text on SQLite.
JSONType = JSON().with_variant(JSONB(), "postgresql")

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E", bound=StrEnum)


class PydanticJSON(TypeDecorator[M], Generic[M]):
    """A JSON column read and written as a Pydantic model (the stored JSON is unchanged)."""

    impl = JSON
    cache_ok = True

    def __init__(self, model: type[M]) -> None:
        super().__init__()
        self.model = model

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        return dialect.type_descriptor(JSONB() if dialect.name == "postgresql" else JSON())

    def process_bind_param(self, value: M | dict[str, Any] | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        model = value if isinstance(value, BaseModel) else self.model.model_validate(value)
        return model.model_dump(mode="json", exclude_defaults=True)

    def process_result_value(self, value: Any, dialect: Dialect) -> M | None:
        return None if value is None else self.model.model_validate(value)


class StrEnumType(TypeDecorator[E], Generic[E]):
    """A short string column read as a StrEnum."""

    impl = String
    cache_ok = True

    def __init__(self, enum: type[E], length: int) -> None:
        super().__init__(length)
        self.enum = enum

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.enum(value)


AFTER_COMMIT = "after_commit"
AFTER_ROLLBACK = "after_rollback"


def after_commit(db: AsyncSession, callback: Callable[[], None]) -> None:
    """Call `callback` once this unit of work has committed (to start a run it claimed:
    nothing outside the transaction may act on rows that might still roll back)."""
    db.info.setdefault(AFTER_COMMIT, []).append(callback)


def after_rollback(db: AsyncSession, callback: Callable[[], None]) -> None:
    """Call `callback` if this unit of work rolls back instead (to stop work started
    early on its behalf)."""
    db.info.setdefault(AFTER_ROLLBACK, []).append(callback)


async def commit(db: AsyncSession) -> None:
    """Commit, then run what waited for the commit."""
    await db.commit()
    db.info.pop(AFTER_ROLLBACK, None)
    for callback in db.info.pop(AFTER_COMMIT, []):
        callback()


async def rollback(db: AsyncSession) -> None:
    db.info.pop(AFTER_COMMIT, None)
    try:
        await db.rollback()
    finally:
        for callback in db.info.pop(AFTER_ROLLBACK, []):
            callback()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSONType, list[Any]: JSONType}


def make_engine(settings: Settings) -> AsyncEngine:
    url = settings.database_url
    if url.startswith("sqlite"):
        in_memory = ":memory:" in url or url.endswith("://")
        engine = create_async_engine(
            url,
            echo=settings.db_echo,
            connect_args={"timeout": 30},
            poolclass=StaticPool if in_memory else None,
        )

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    # No pre-ping: it costs a round trip on every checkout, and a turn checks out a
    # connection per step. Connections are recycled instead, and one that died is
    # invalidated by the error that finds it.
    return create_async_engine(
        url,
        echo=settings.db_echo,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size // 2,
        pool_recycle=1800,
    )


class LeanSession(AsyncSession):
    """An AsyncSession that skips SQLAlchemy's greenlet (and, on close, its task) when no
    transaction has begun: then a commit, a rollback or a close has nothing to do. Any
    use of a session begins one (an `add`, a query, a change to one of its objects), so
    this skips only sessions left unused, as most of a plain turn's are (its statements
    go through `Database.execute_once`): there the no-ops cost the process more than a
    statement does."""

    async def commit(self) -> None:
        if self.in_transaction():
            await super().commit()

    async def rollback(self) -> None:
        if self.in_transaction():
            await super().rollback()

    async def close(self) -> None:
        if self.in_transaction():
            await super().close()
        else:
            self.expunge_all()  # all a close does when no transaction holds a connection

    async def __aexit__(self, type_: Any, value: Any, traceback: Any) -> None:
        if self.in_transaction():
            await super().__aexit__(type_, value, traceback)
        else:
            self.expunge_all()


class Database:
    """The engine and session factory of one app instance (tests swap the factory)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sessionmaker: async_sessionmaker[AsyncSession] = async_sessionmaker(
            engine, class_=LeanSession, expire_on_commit=False, autoflush=False
        )
        self._compiled: dict[TextClause, tuple[str, tuple[str, ...]]] = {}

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A short unit of work outside a request: commit on success, roll back on error."""
        async with self.sessionmaker() as db:
            try:
                yield db
                await commit(db)
            except BaseException:
                await rollback(db)
                raise

    @property
    def through_driver(self) -> bool:
        """Whether `execute_once` hands statements to the driver itself (Postgres, the
        session factory on this engine): out of sight of SQLAlchemy's events."""
        return not self.is_sqlite and self.sessionmaker.kw.get("bind") is self.engine

    async def execute_once(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        """Run one statement as its own transaction and return its rows (read them by
        position: on Postgres they are the driver's records). On the engine it is
        autocommitted: one round trip, and no connection left idle in a transaction
        while the event loop is busy. On Postgres it goes to the driver as SQLAlchemy
        would send it (compiled once), without the work SQLAlchemy does around each
        execution: these are statements of every turn. (Tests that bind the session
        factory to an outer transaction get a transaction of that factory instead.)"""
        if self.through_driver:
            return await self._fetch(statement, params)
        if self.sessionmaker.kw.get("bind") is not self.engine:
            async with self.transaction() as db:
                return list(await db.execute(statement, params))
        async with self.engine.connect() as conn:  # SQLite
            auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
            return list(await auto.execute(statement, params))

    async def _fetch(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        sql, names = self._positional(statement)
        args = [params[name] for name in names]
        if self.engine.sync_engine.echo:  # SQLAlchemy's echo log shows these too
            _ECHO.info("%s\n[autocommitted, through the driver] %r", sql, args)
        # The pool is SQLAlchemy's, which waits on the driver from a greenlet: one for
        # the checkout, the statement and the checkin (an `engine.connect()` block
        # costs two more and a task, twice what the statement itself costs the process).
        rows: list[Any] = await greenlet_spawn(self._fetch_pooled, sql, args, params)
        return rows

    def _fetch_pooled(self, sql: str, args: list[Any], params: dict[str, Any]) -> list[Any]:
        pooled = self.engine.sync_engine.raw_connection()
        try:
            driver = pooled.driver_connection
            assert driver is not None
            try:
                return cast(list[Any], await_(driver.fetch(sql, *args)))
            except Exception as exc:
                translated = driver_error(exc, sql, params, closed=driver.is_closed())
                if translated.connection_invalidated:
                    pooled.invalidate(exc)
                raise translated from exc
        finally:
            pooled.close()

    def _positional(self, statement: TextClause) -> tuple[str, tuple[str, ...]]:
        compiled = self._compiled.get(statement)
        if compiled is None:
            done = statement.compile(dialect=self.engine.dialect)
            compiled = self._compiled[statement] = (done.string, tuple(done.positiontup or ()))
        return compiled

    async def dispose(self) -> None:
        await self.engine.dispose()
