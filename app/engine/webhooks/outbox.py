"""Writing deliveries into the outbox, in the caller's transaction: the one that stores
the state an event reports (a run's end or pause, a compaction), so an event is sent
if and only if what it tells happened.

Called wherever run events are written (`EventHub._write`, `runs.append_events`); events
no webhook carries cost nothing (no query).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import String, Table, bindparam, exists, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.models import AgentSession, Run, WebhookDelivery, WebhookEndpoint

WEBHOOK_EVENTS = (
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.requires_action",
    "compaction.completed",
)
_EVENTS = frozenset(WEBHOOK_EVENTS)

runs_t = cast(Table, Run.__table__)
sessions_t = cast(Table, AgentSession.__table__)
endpoints_t = cast(Table, WebhookEndpoint.__table__)
deliveries_t = cast(Table, WebhookDelivery.__table__)

# The run's tenant, session and per-turn URL, with each endpoint of that tenant (built
# once; the run id is bound per call).
_TARGETS = (
    select(
        sessions_t.c.tenant,
        runs_t.c.session_id,
        runs_t.c.params,
        endpoints_t.c.id,
        endpoints_t.c.url,
        endpoints_t.c.events,
    )
    .select_from(
        runs_t.join(sessions_t, sessions_t.c.id == runs_t.c.session_id).outerjoin(
            endpoints_t, endpoints_t.c.tenant == sessions_t.c.tenant
        )
    )
    .where(runs_t.c.id == bindparam("run_id"))
)


# Whether the tenant (bound as `tenant`) has any endpoint: a column a run's settling
# UPDATE returns, so the step that reports the end knows without a query of its own
# whether its events may have receivers (`enqueue` is skipped when not, and the run
# has no `webhook_url`).
HAS_ENDPOINTS = (
    exists().where(endpoints_t.c.tenant == bindparam("tenant", type_=String)).label("has_endpoints")
)


def envelope(event: str, at: datetime, session_id: uuid.UUID, run_id: uuid.UUID, data: str) -> str:
    """The body sent: the Standard Webhooks shape (`type`, `timestamp`, `data`), `data`
    being the event's stored JSON text unchanged."""
    head = json.dumps(
        {
            "type": event,
            "timestamp": at.isoformat(),
            "session_id": str(session_id),
            "run_id": str(run_id),
        },
        separators=(",", ":"),
    )
    return head[:-1] + ',"data":' + data + "}"


async def enqueue(db: AsyncSession, run_id: uuid.UUID, events: Iterable[tuple[str, str]]) -> int:
    """Add a delivery for each webhook event (name, JSON text) to every endpoint of the
    run's tenant that subscribed to it, and to the run's own `webhook_url`."""
    wanted = [(name, data) for name, data in events if name in _EVENTS]
    if not wanted:
        return 0
    targets = (await db.execute(_TARGETS, {"run_id": run_id})).all()
    if not targets:
        return 0
    tenant, session_id, params = targets[0][0], targets[0][1], targets[0][2]
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    for name, data in wanted:
        body = envelope(name, now, session_id, run_id, data)
        receivers: list[tuple[uuid.UUID | None, str]] = [
            (endpoint_id, url)
            for *_, endpoint_id, url, subscribed in targets
            if endpoint_id is not None and name in subscribed
        ]
        if params is not None and params.webhook_url:
            receivers.append((None, params.webhook_url))
        rows += [
            {
                "id": uuid.uuid4(),
                "tenant": tenant,
                "endpoint_id": endpoint_id,
                "url": url,
                "run_id": run_id,
                "event": name,
                "payload": body,
                "status": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            }
            for endpoint_id, url in receivers
        ]
    if rows:
        await db.execute(insert(deliveries_t), rows)
    return len(rows)
