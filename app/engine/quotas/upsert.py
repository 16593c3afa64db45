"""`INSERT ... ON CONFLICT DO UPDATE` for the two dialects Parley runs on."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession


def insert_for(db: AsyncSession, table: Table) -> Any:
    """The dialect's insert (with `on_conflict_do_update`) of `table`."""
    if db.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)
