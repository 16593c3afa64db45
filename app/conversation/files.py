"""The session workspace, kept in the `files` table: what the built-in tools act on and
what the Files routes show.

It flushes and never commits: the caller owns the transaction, so a tool's writes land
together with the messages that record them.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import cast

from sqlalchemy import Table, Uuid, case, delete, func, insert, literal, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.conversation.workspace import (
    LimitExceeded,
    Limits,
    PathError,
    Workspace,
    check_clash,
    normalize_path,
)
from app.errors import Invalid, NotFound, TooLarge
from app.models import File, utcnow
from app.pagination import as_str, decode_cursor, page

files_t = cast(Table, File.__table__)


class DbWorkspace(Workspace):
    def __init__(
        self, db: AsyncSession, session_id: uuid.UUID, limits: Limits | None = None
    ) -> None:
        self._db = db
        self._session_id = session_id
        self.limits = limits or Limits()  # the defaults; the service passes its settings

    async def read(self, path: str) -> bytes | None:
        content: bytes | None = await self._db.scalar(
            select(File.content).where(File.session_id == self._session_id, File.path == path)
        )
        return content

    async def write(self, path: str, data: bytes) -> None:
        await self.put(path, data)

    async def put(self, path: str, data: bytes) -> tuple[File, bool]:
        """Insert or update the file within the limits; returns its row (without its
        content) and whether it was created. Raises PathError for a path that clashes
        with a file or directory, LimitExceeded past a limit."""
        self.limits.check_file(path, len(data))
        mine = files_t.c.session_id == self._session_id
        own = func.sum(case((files_t.c.path == path, files_t.c.size)))
        files, total, old = (
            await self._db.execute(
                select(func.count(), func.coalesce(func.sum(files_t.c.size), 0), own).where(mine)
            )
        ).one()
        if old is None:
            await self._check_clash(path)
        self.limits.check_write(path, len(data), files, int(total), old)
        now, digest = utcnow(), hashlib.sha256(data).hexdigest()
        values: dict[str, object] = {
            "content": data,
            "size": len(data),
            "sha256": digest,
            "updated_at": now,
        }
        if old is None:
            values["created_at"] = now
            await self._db.execute(
                insert(files_t).values(session_id=self._session_id, path=path, **values)
            )
        else:
            await self._db.execute(
                update(files_t).where(mine, files_t.c.path == path).values(**values)
            )
        row = File(session_id=self._session_id, path=path, size=len(data), sha256=digest)
        row.updated_at = now
        return row, old is None

    async def _check_clash(self, path: str) -> None:
        """The workspace rule against the few rows that could break it (its ancestors, or
        a file under it), found without loading every path."""
        segments = path.split("/")
        ancestors = ["/".join(segments[:depth]) for depth in range(1, len(segments))]
        under = func.substr(files_t.c.path, 1, len(path) + 1) == path + "/"
        clashing = await self._db.scalars(
            select(files_t.c.path)
            .where(
                files_t.c.session_id == self._session_id,
                or_(files_t.c.path.in_(ancestors), under) if ancestors else under,
            )
            .limit(1)
        )
        check_clash(path, clashing)

    async def list_paths(self) -> list[str]:
        paths = await self._db.scalars(select(File.path).where(File.session_id == self._session_id))
        # Sorted here, not by ORDER BY: a database collation (en_US, say) orders
        # differently from the code-point order the protocol promises.
        return sorted(paths)


def limits_of(settings: Settings) -> Limits:
    return Limits(
        max_file_bytes=settings.max_file_bytes,
        max_bytes=settings.workspace_max_bytes,
        max_files=settings.workspace_max_files,
    )


def workspace_path(path: str) -> str:
    """A client's path, normalised by the workspace rule; 422 naming it when it breaks it."""
    try:
        return normalize_path(path)
    except PathError as exc:
        raise Invalid.field(["path", "path"], str(exc)) from exc


async def list_page(
    db: AsyncSession, session_id: uuid.UUID, *, after: str | None, limit: int
) -> tuple[list[File], str | None]:
    query = select(File).where(File.session_id == session_id)
    if after:
        (last,) = decode_cursor(after, as_str)
        query = query.where(File.path > last)
    rows = list(await db.scalars(query.order_by(File.path).limit(limit + 1)))
    return page(rows, limit, lambda f: (f.path,))


async def get(db: AsyncSession, session_id: uuid.UUID, path: str) -> File:
    row = await db.get(File, (session_id, workspace_path(path)))
    if row is None:
        raise NotFound(f"File {path} not found")
    return row


async def put(
    db: AsyncSession, session_id: uuid.UUID, clean_path: str, data: bytes, settings: Settings
) -> tuple[File, bool]:
    """Create or replace a file (`clean_path` went through `workspace_path`): 422 when the
    path clashes with a file or directory, 413 past the size limit or the quota."""
    try:
        return await DbWorkspace(db, session_id, limits_of(settings)).put(clean_path, data)
    except LimitExceeded as exc:
        raise TooLarge(str(exc)) from None
    except PathError as exc:
        raise Invalid.field(["path", "path"], str(exc)) from None


async def remove(db: AsyncSession, session_id: uuid.UUID, path: str) -> None:
    result = await db.execute(
        delete(File).where(File.session_id == session_id, File.path == workspace_path(path))
    )
    if result.rowcount == 0:  # type: ignore[attr-defined]
        raise NotFound(f"File {path} not found")


async def copy_files(db: AsyncSession, source_id: uuid.UUID, target_id: uuid.UUID) -> None:
    """Copy a workspace inside the database: the contents never pass through the process."""
    columns = [c for c in files_t.c if c.name != "session_id"]
    await db.execute(
        insert(files_t).from_select(
            ["session_id", *(c.name for c in columns)],
            select(literal(target_id, Uuid), *columns).where(files_t.c.session_id == source_id),
        )
    )
