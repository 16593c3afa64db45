"""The sender below HTTP, on the test database: the address check at send time, and the
pruning of settled deliveries."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, make_engine
from app.engine.webhooks.sender import Sender
from app.models import WebhookDelivery, WebhookEndpoint
from tests.conftest import make_settings


@pytest.fixture
async def db(database_url: str, engine: AsyncEngine) -> AsyncIterator[Database]:
    database = Database(make_engine(make_settings(database_url)))
    yield database
    await database.dispose()


async def endpoint_with(db: Database, *deliveries: dict[str, Any]) -> list[uuid.UUID]:
    """An endpoint of a tenant of its own on a loopback URL, with these deliveries."""
    async with db.transaction() as tx:
        endpoint = WebhookEndpoint(
            tenant=f"t-{uuid.uuid4().hex[:8]}",
            url="http://127.0.0.1:9/x",
            events=["run.failed"],
            secret="whsec_" + "A" * 32,
        )
        tx.add(endpoint)
        await tx.flush()
        rows = [
            WebhookDelivery(
                tenant=endpoint.tenant,
                endpoint_id=endpoint.id,
                url=endpoint.url,
                event="run.failed",
                payload="{}",
                attempts=0,
                **{"next_attempt_at": datetime.now(UTC), **fields},
            )
            for fields in deliveries
        ]
        tx.add_all(rows)
        await tx.flush()
        return [row.id for row in rows]


async def rows(db: Database, ids: list[uuid.UUID]) -> dict[uuid.UUID, WebhookDelivery]:
    async with db.sessionmaker() as tx:
        found = await tx.scalars(select(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))
        return {row.id: row for row in found}


async def test_sender_refuses_at_send_time(database_url: str, db: Database) -> None:
    """Allowed when registered (an operator's allowlist, since removed): the sender checks
    again and fails the delivery without calling it."""
    [delivery] = await endpoint_with(db, {"status": "pending"})
    sender = Sender(db, make_settings(database_url))
    try:
        await sender.send_due()
    finally:
        await sender.aclose()
    row = (await rows(db, [delivery]))[delivery]
    assert row.status == "failed"
    assert row.attempts == 1
    assert row.last_error is not None
    assert row.last_error.startswith("refused")
    assert row.last_status is None


async def test_prune_keeps_pending_and_recent(database_url: str, db: Database) -> None:
    old = datetime.now(UTC) - timedelta(days=8)
    later = datetime.now(UTC) + timedelta(hours=1)
    ids = await endpoint_with(
        db,
        {"status": "delivered", "created_at": old},
        {"status": "failed", "created_at": old},
        {"status": "pending", "created_at": old, "next_attempt_at": later},
        {"status": "delivered"},
    )
    sender = Sender(db, make_settings(database_url, webhook_keep_seconds=7 * 86400))
    try:
        assert await sender.prune() >= 2
    finally:
        await sender.aclose()
    kept = await rows(db, ids)
    assert sorted(kept) == sorted(ids[2:])
    async with db.transaction() as tx:
        await tx.execute(delete(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))
