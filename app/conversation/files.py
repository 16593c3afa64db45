"""The session workspace, kept in the `files` table: what the built-in tools act on and
what the Files routes show.

It flushes and never commits: the caller owns the transaction, so a tool's writes land
together with the messages that record them.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import cast

from sqlalchemy import Table, Uuid, delete, insert, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.conversation.workspace import PathError, Workspace, normalize_path
from app.errors import Invalid, NotFound
from app.models import File, utcnow
from app.pagination import as_str, decode_cursor, page

files_t = cast(Table, File.__table__)


class DbWorkspace(Workspace):
    def __init__(self, db: AsyncSession, session_id: uuid.UUID) -> None:
        self._db = db
        self._session_id = session_id

    async def read(self, path: str) -> bytes | None:
        content: bytes | None = await self._db.scalar(
            select(File.content).where(File.session_id == self._session_id, File.path == path)
        )
        return content

    async def write(self, path: str, data: bytes) -> None:
        await self.put(path, data)

    async def put(self, path: str, data: bytes) -> tuple[File, bool]:
        """Insert or update the file; returns its row and whether it was created."""
        row = await self._db.get(File, (self._session_id, path))
        created = row is None
        if row is None:
            row = File(session_id=self._session_id, path=path)
            self._db.add(row)
        row.content = data
        row.size = len(data)
        row.sha256 = hashlib.sha256(data).hexdigest()
        row.updated_at = utcnow()
        await self._db.flush()
        return row, created

    async def list_paths(self) -> list[str]:
        paths = await self._db.scalars(select(File.path).where(File.session_id == self._session_id))
        # Sorted here, not by ORDER BY: a database collation (en_US, say) orders
        # differently from the code-point order the protocol promises.
        return sorted(paths)


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
    db: AsyncSession, session_id: uuid.UUID, clean_path: str, data: bytes
) -> tuple[File, bool]:
    """Create or replace a file (`clean_path` went through `workspace_path`)."""
    return await DbWorkspace(db, session_id).put(clean_path, data)


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
