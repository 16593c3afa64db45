"""Seeding messages straight into the store, inside a test's rolled-back transaction."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.conversation import store
from app.conversation.records import new_message


async def new_session(api: httpx.AsyncClient, **body: Any) -> str:
    response = await api.post("/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def add(conn: AsyncConnection, sid: str, parent: Any, **fields: Any) -> uuid.UUID:
    async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as db:
        record = await store.append(
            db, new_message(session_id=uuid.UUID(sid), parent_uuid=parent, **fields)
        )
        await db.commit()
    return record.uuid


def text(role: str, value: str, **fields: Any) -> dict[str, Any]:
    return {"type": role, "role": role, "content": [{"type": "text", "text": value}], **fields}
