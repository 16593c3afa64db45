"""The sender every replica runs: claims due deliveries, signs and POSTs them, and
records the outcome.

A claim is a short transaction that moves each delivery's `next_attempt_at` past the
send's end (twice the timeout) and counts the attempt (`FOR UPDATE SKIP LOCKED` on
Postgres, so replicas take different rows); no transaction is held across the HTTP
call. A replica that dies mid-send leaves the delivery due again once that lease passes:
delivery is at least once, and receivers drop repeats by `webhook-id` (the delivery id,
the same on every attempt).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Row, delete, select, update

from app import metrics
from app.config import Settings
from app.db import Database
from app.engine.webhooks import signing
from app.engine.webhooks.addresses import RefusedUrl, check_url
from app.engine.webhooks.outbox import deliveries_t, endpoints_t

log = logging.getLogger("parley.webhooks")

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
CLAIM_BATCH = 20
ERROR_CHARS = 500
PRUNE_EVERY_SECONDS = 3600.0


def now() -> datetime:
    return datetime.now(UTC)


def backoff(settings: Settings, attempts: int) -> float:
    """Seconds before attempt `attempts + 1`: doubling from the base, capped."""
    base = settings.webhook_retry_base_seconds
    return float(min(base * 2 ** max(attempts - 1, 0), settings.webhook_retry_max_seconds))


class Sender:
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self.client = httpx.AsyncClient(
            timeout=settings.webhook_timeout_seconds, follow_redirects=False
        )

    async def loop(self) -> None:
        pruned_at = 0.0
        while True:
            try:
                if time.monotonic() - pruned_at > PRUNE_EVERY_SECONDS:
                    pruned_at = time.monotonic()
                    await self.prune()
                sent = await self.send_due()
            except Exception:
                log.exception("webhook sender failed")
                sent = 0
            if sent < CLAIM_BATCH:
                await asyncio.sleep(self.settings.webhook_poll_seconds)

    async def prune(self) -> int:
        """Delete settled deliveries older than PARLEY_WEBHOOK_KEEP_SECONDS."""
        cutoff = now() - timedelta(seconds=self.settings.webhook_keep_seconds)
        async with self.db.transaction() as db:
            result = await db.execute(
                delete(deliveries_t).where(
                    deliveries_t.c.status != PENDING, deliveries_t.c.created_at < cutoff
                )
            )
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send_due(self) -> int:
        claimed, secrets = await self.claim()
        await asyncio.gather(*(self.deliver(row, secrets.get(row.endpoint_id)) for row in claimed))
        return len(claimed)

    async def claim(self) -> tuple[list[Row[Any]], dict[uuid.UUID | None, str]]:
        at = now()
        # Past any send's end (connect and read each within the timeout), so only a
        # replica that died mid-send leaves a claimed row to be taken again.
        lease = at + timedelta(seconds=2 * self.settings.webhook_timeout_seconds + 1)
        due = (
            select(deliveries_t.c.id)
            .where(deliveries_t.c.status == PENDING, deliveries_t.c.next_attempt_at <= at)
            .order_by(deliveries_t.c.next_attempt_at)
            .limit(CLAIM_BATCH)
            .with_for_update(skip_locked=True)
        )
        async with self.db.transaction() as db:
            result = await db.execute(
                update(deliveries_t)
                .where(deliveries_t.c.id.in_(due.scalar_subquery()))
                .values(next_attempt_at=lease, attempts=deliveries_t.c.attempts + 1)
                .returning(*deliveries_t.c)
            )
            rows = list(result.all())
            ids = {row.endpoint_id for row in rows if row.endpoint_id is not None}
            secrets: dict[uuid.UUID | None, str] = {}
            if ids:
                found = await db.execute(
                    select(endpoints_t.c.id, endpoints_t.c.secret).where(endpoints_t.c.id.in_(ids))
                )
                secrets = {endpoint_id: secret for endpoint_id, secret in found.all()}
        return rows, secrets

    def _secret(self, row: Row[Any], endpoint_secret: str | None) -> str | None:
        if row.endpoint_id is not None:
            return endpoint_secret
        server = self.settings.secret_key
        return signing.turn_secret(server.get_secret_value(), row.tenant) if server else None

    async def deliver(self, row: Row[Any], endpoint_secret: str | None) -> None:
        secret = self._secret(row, endpoint_secret)
        status: int | None = None
        try:
            if secret is None:
                raise RefusedUrl("no secret to sign with (PARLEY_SECRET_KEY is not set)")
            await check_url(row.url, self.settings.allowed_networks)
            at = now()
            response = await self.client.post(
                row.url,
                content=row.payload.encode(),
                headers=signing.headers(secret, str(row.id), at, row.payload),
            )
            status = response.status_code
            error = None if response.is_success else f"HTTP {status}"
        except RefusedUrl as exc:
            await self._record(row, FAILED, None, f"refused: {exc}")
            return
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS] or type(exc).__name__
        if error is None:
            await self._record(row, DELIVERED, status, None)
            return
        delay = backoff(self.settings, row.attempts)
        window = timedelta(seconds=self.settings.webhook_retry_window_seconds)
        if now() + timedelta(seconds=delay) > row.created_at + window:
            await self._record(row, FAILED, status, error)
        else:
            await self._record(row, PENDING, status, error, retry_in=delay)

    async def _record(
        self,
        row: Row[Any],
        outcome: str,
        status: int | None,
        error: str | None,
        *,
        retry_in: float = 0.0,
    ) -> None:
        values: dict[str, Any] = {"status": outcome, "last_status": status, "last_error": error}
        if outcome == DELIVERED:
            values["delivered_at"] = now()
        if outcome == PENDING:
            values["next_attempt_at"] = now() + timedelta(seconds=retry_in)
        async with self.db.transaction() as db:
            # Only the claim that is still current records (a lease that passed meanwhile
            # was claimed again, with one more attempt).
            await db.execute(
                update(deliveries_t)
                .where(deliveries_t.c.id == row.id, deliveries_t.c.attempts == row.attempts)
                .values(**values)
            )
        label = "retry" if outcome == PENDING else outcome
        metrics.webhook_deliveries.labels(row.event, label).inc()
        if outcome == FAILED:
            log.warning("webhook delivery %s to %s failed: %s", row.id, row.url, error)
