"""Routes: a tenant's webhook endpoints, their deliveries, and the secret of per-turn
webhook URLs."""

from __future__ import annotations

import json
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from app.api.deps import DbDep, SettingsDep, TenantDep
from app.api.problems import refuse_other_methods
from app.engine.webhooks import endpoints, signing
from app.errors import Invalid
from app.models import WebhookDelivery, WebhookEndpoint
from app.schemas import (
    Page,
    TurnSecretOut,
    WebhookCreated,
    WebhookDeliveryOut,
    WebhookIn,
    WebhookOut,
)

router = APIRouter(prefix="/webhooks", tags=["webhooks"])


def endpoint_out(endpoint: WebhookEndpoint) -> WebhookOut:
    return WebhookOut.model_validate(endpoint, from_attributes=True)


def delivery_out(delivery: WebhookDelivery) -> WebhookDeliveryOut:
    pending = delivery.status == "pending"
    return WebhookDeliveryOut(
        id=delivery.id,
        endpoint_id=delivery.endpoint_id,
        url=delivery.url,
        run_id=delivery.run_id,
        event=delivery.event,
        status=delivery.status,
        attempts=delivery.attempts,
        next_attempt_at=delivery.next_attempt_at if pending else None,
        last_status=delivery.last_status,
        last_error=delivery.last_error,
        created_at=delivery.created_at,
        delivered_at=delivery.delivered_at,
        payload=json.loads(delivery.payload),
    )


@router.post("", status_code=201, summary="Register a webhook")
async def create_webhook(
    body: WebhookIn, db: DbDep, tenant: TenantDep, settings: SettingsDep
) -> WebhookCreated:
    """Register a URL told of the tenant's run events (`events`). The answer carries the
    signing secret (`whsec_...`, Standard Webhooks), shown only this once. 422 for a URL
    that is not http(s) or resolves to a loopback, private or link-local address (unless
    the operator allowed its network)."""
    endpoint = await endpoints.create(db, settings, tenant, body.url, body.events)
    return WebhookCreated(**endpoint_out(endpoint).model_dump(), secret=endpoint.secret)


@router.get("", summary="List webhooks")
async def list_webhooks(db: DbDep, tenant: TenantDep) -> Page[WebhookOut]:
    """The tenant's webhook endpoints, oldest first (secrets are not shown again)."""
    return Page[WebhookOut](data=[endpoint_out(e) for e in await endpoints.listed(db, tenant)])


@router.get(
    "/turn_secret",
    summary="Get the per-turn webhook secret",
    responses={422: {"description": "Per-turn webhooks are off (no PARLEY_SECRET_KEY)"}},
)
async def turn_secret(tenant: TenantDep, settings: SettingsDep) -> TurnSecretOut:
    """The secret that signs deliveries to a turn's own `webhook_url`: the same for all the
    tenant's turns. 422 when the operator has not set a server secret."""
    if settings.secret_key is None:
        raise Invalid("Per-turn webhooks are not enabled (PARLEY_SECRET_KEY is not set)")
    return TurnSecretOut(secret=signing.turn_secret(settings.secret_key.get_secret_value(), tenant))


@router.get("/deliveries", summary="List a run's deliveries")
async def run_deliveries(
    run_id: uuid.UUID, db: DbDep, tenant: TenantDep
) -> Page[WebhookDeliveryOut]:
    """Every delivery reporting run `run_id`, to the tenant's endpoints and to the turn's
    own `webhook_url`, oldest first (empty for a run with none, or not the tenant's)."""
    rows = await endpoints.for_run(db, tenant, run_id)
    return Page[WebhookDeliveryOut](data=[delivery_out(d) for d in rows])


@router.post("/deliveries/{delivery_id}/redeliver", summary="Redeliver any delivery")
async def redeliver_any(delivery_id: uuid.UUID, db: DbDep, tenant: TenantDep) -> WebhookDeliveryOut:
    """Like the endpoint's redeliver, for any of the tenant's deliveries (a turn's own
    `webhook_url` included). 404 when it is not the tenant's."""
    return delivery_out(await endpoints.redeliver(db, tenant, delivery_id))


refuse_other_methods(router, "/deliveries", {"GET"})
refuse_other_methods(router, "/turn_secret", {"GET"})


@router.delete("/{webhook_id}", status_code=204, summary="Delete a webhook")
async def delete_webhook(webhook_id: uuid.UUID, db: DbDep, tenant: TenantDep) -> Response:
    """Stop telling this URL; its deliveries not yet sent are dropped. 404 when the tenant
    has no such webhook."""
    await endpoints.remove(db, tenant, webhook_id)
    return Response(status_code=204)


@router.get("/{webhook_id}/deliveries", summary="List a webhook's deliveries")
async def list_deliveries(
    webhook_id: uuid.UUID,
    db: DbDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    after: str | None = None,
) -> Page[WebhookDeliveryOut]:
    """Deliveries to this webhook, newest first: status (`pending`, `delivered`,
    `failed`), attempts, the last HTTP status or error, and the body sent."""
    rows, cursor = await endpoints.deliveries(db, tenant, webhook_id, after=after, limit=limit)
    return Page[WebhookDeliveryOut](data=[delivery_out(d) for d in rows], next_cursor=cursor)


@router.post("/{webhook_id}/deliveries/{delivery_id}/redeliver", summary="Redeliver a delivery")
async def redeliver(
    webhook_id: uuid.UUID, delivery_id: uuid.UUID, db: DbDep, tenant: TenantDep
) -> WebhookDeliveryOut:
    """Send a delivery again now (delivered or failed), with the same `webhook-id`, and
    retry it as a new one. 404 when it is not this webhook's."""
    return delivery_out(await endpoints.redeliver(db, tenant, delivery_id, webhook_id))
