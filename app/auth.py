"""API keys: which tenant a presented key belongs to, and the keys kept in the database.

Keys come from `PARLEY_API_KEYS` (tenant:key pairs) and from the `api_keys` table, where
only their SHA-256 is stored. Every configured key is compared, in constant time, so the
answer's timing does not tell which one nearly matched.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from datetime import UTC, datetime

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.models import ApiKey

OPEN_TENANT = "default"  # the one tenant of a service running without keys


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


async def tenant_for_key(db: AsyncSession, settings: Settings, presented: str) -> str | None:
    hashed = digest(presented)
    tenant = None
    for key in settings.configured_keys:
        if hmac.compare_digest(hashed, key.key_sha256):
            tenant = key.tenant
    if tenant is None:
        tenant = await db.scalar(
            select(ApiKey.tenant).where(
                ApiKey.key_sha256 == hashed.hex(), ApiKey.revoked_at.is_(None)
            )
        )
    return tenant


async def has_stored_keys(db: AsyncSession) -> bool:
    count = await db.scalar(
        select(func.count()).select_from(ApiKey).where(ApiKey.revoked_at.is_(None))
    )
    return bool(count)


def create_key(db: AsyncSession, tenant: str, name: str | None) -> str:
    """Store a new key (hashed) and return it: the only time it is shown."""
    key = "pk_" + secrets.token_urlsafe(32)
    db.add(ApiKey(tenant=tenant, name=name, key_sha256=digest(key).hex()))
    return key


async def revoke_key(db: AsyncSession, key_id: uuid.UUID) -> bool:
    result = await db.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=datetime.now(UTC))
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]
