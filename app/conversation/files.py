"""The workspace of one session, kept in the `files` table.

It flushes and never commits: the caller owns the transaction, so a tool's writes land
together with the messages that record them.
"""

from __future__ import annotations

import hashlib
import uuid

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.conversation.workspace import Workspace
from app.models import File, utcnow


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
