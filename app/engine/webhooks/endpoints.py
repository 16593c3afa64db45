"""A tenant's webhook endpoints and their deliveries, in the caller's transaction
(services flush; the request commits)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.engine.webhooks import signing
from app.engine.webhooks.addresses import RefusedUrl, check_url
from app.errors import Invalid, NotFound
from app.models import WebhookDelivery, WebhookEndpoint
from app.pagination import dated_key, newest_first, page


async def check(settings: Settings, url: str, loc: list[str | int]) -> None:
    """422 naming `loc` for a URL the sender would refuse."""
    try:
        await check_url(url, settings.allowed_networks)
    except RefusedUrl as exc:
        raise Invalid.field(loc, str(exc), f"The webhook URL is refused: {exc}") from None


async def check_turn_url(settings: Settings, url: str) -> None:
    if settings.secret_key is None:
        raise Invalid.field(
            ["body", "webhook_url"],
            "per-turn webhooks are not enabled",
            "Per-turn webhooks need the server secret (PARLEY_SECRET_KEY); "
            "register an endpoint with POST /webhooks instead",
        )
    await check(settings, url, ["body", "webhook_url"])


async def create(
    db: AsyncSession, settings: Settings, tenant: str, url: str, events: Sequence[str]
) -> WebhookEndpoint:
    await check(settings, url, ["body", "url"])
    endpoint = WebhookEndpoint(
        id=uuid.uuid4(),
        tenant=tenant,
        url=url,
        events=list(dict.fromkeys(events)),
        secret=signing.new_secret(),
        created_at=datetime.now(UTC),
    )
    db.add(endpoint)
    await db.flush()
    return endpoint


async def get(db: AsyncSession, tenant: str, endpoint_id: uuid.UUID) -> WebhookEndpoint:
    endpoint = await db.get(WebhookEndpoint, endpoint_id)
    if endpoint is None or endpoint.tenant != tenant:
        raise NotFound(f"Webhook {endpoint_id} not found")
    return endpoint


async def listed(db: AsyncSession, tenant: str) -> list[WebhookEndpoint]:
    return list(
        await db.scalars(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.tenant == tenant)
            .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
        )
    )


async def remove(db: AsyncSession, tenant: str, endpoint_id: uuid.UUID) -> None:
    """Delete the endpoint and its deliveries (those not yet sent are dropped)."""
    await get(db, tenant, endpoint_id)
    await db.execute(delete(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id))


async def deliveries(
    db: AsyncSession, tenant: str, endpoint_id: uuid.UUID, *, after: str | None, limit: int
) -> tuple[list[WebhookDelivery], str | None]:
    """The endpoint's deliveries, newest first."""
    await get(db, tenant, endpoint_id)
    query = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)
    query = newest_first(query, WebhookDelivery, after, limit)
    return page(list(await db.scalars(query)), limit, dated_key)


async def for_run(db: AsyncSession, tenant: str, run_id: uuid.UUID) -> list[WebhookDelivery]:
    """The tenant's deliveries reporting a run (to endpoints and its own `webhook_url`),
    oldest first."""
    return list(
        await db.scalars(
            select(WebhookDelivery)
            .where(WebhookDelivery.run_id == run_id, WebhookDelivery.tenant == tenant)
            .order_by(WebhookDelivery.created_at, WebhookDelivery.id)
        )
    )


async def redeliver(
    db: AsyncSession, tenant: str, delivery_id: uuid.UUID, endpoint_id: uuid.UUID | None = None
) -> WebhookDelivery:
    """Make a delivery due now, whatever its outcome so far (same `webhook-id`: a
    receiver that already has it may drop it). Its retries start a new window. With
    `endpoint_id`, only a delivery of that endpoint."""
    if endpoint_id is not None:
        await get(db, tenant, endpoint_id)
    delivery = await db.get(WebhookDelivery, delivery_id)
    if (
        delivery is None
        or delivery.tenant != tenant
        or (endpoint_id is not None and delivery.endpoint_id != endpoint_id)
    ):
        raise NotFound(f"Delivery {delivery_id} not found")
    at = datetime.now(UTC)
    await db.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id)
        .values(status="pending", next_attempt_at=at, created_at=at, delivered_at=None)
    )
    await db.refresh(delivery)
    return delivery
