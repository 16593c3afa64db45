"""`INSERT ... ON CONFLICT DO UPDATE` for the two dialects Parley runs on."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession


def insert_for(db: AsyncSession | str, table: Table) -> Any:
    """The dialect's insert (with `on_conflict_do_update`) of `table`, for a session or a
    dialect name."""
    dialect = db if isinstance(db, str) else db.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)
