"""API keys: which tenant a presented key belongs to, and the keys kept in the database.

Browser tokens (`pbt_...`) are minted by a tenant key for one session and verified
here without a database lookup.

Keys come from `PARLEY_API_KEYS` (tenant:key pairs) and from the `api_keys` table, where
only their SHA-256 is stored. Every configured key is compared, in constant time, so the
answer's timing does not tell which one nearly matched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.errors import Unauthorized
from app.models import ApiKey

OPEN_TENANT = "default"  # the one tenant of a service running without keys


@dataclass(frozen=True)
class Caller:
    """Who is asking: the tenant, an id of the credential (rate limits count per key),
    and for a browser token the one session it may touch."""

    tenant: str
    key_id: str
    session_id: uuid.UUID | None = None
    read_only: bool = False


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def key_id(key: str) -> str:
    """A stable, non-secret name of a key (counters are kept under it)."""
    return digest(key).hex()[:32]


# --- browser tokens ----------------------------------------------------------------------
# pbt_<base64url JSON claims>.<base64url HMAC-SHA256 of them under the server secret>:
# nothing is stored, every replica verifies with the same PARLEY_SECRET_KEY.

TOKEN_PREFIX = "pbt_"  # noqa: S105 (a prefix, not a secret)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _token_mac(settings: Settings, claims: str) -> bytes:
    if settings.secret_key is None:
        raise Unauthorized("Browser tokens are not enabled on this server")
    secret = settings.secret_key.get_secret_value().encode()
    return hmac.new(secret, b"browser-token:" + claims.encode(), hashlib.sha256).digest()


def mint_token(
    settings: Settings,
    caller: Caller,
    session_id: uuid.UUID,
    *,
    read_only: bool,
    expires_at: datetime,
) -> str:
    """A token for one session, counted against the minting key's rate limits."""
    body = {
        "t": caller.tenant,
        "k": caller.key_id,
        "s": str(session_id),
        "ro": read_only,
        "exp": int(expires_at.timestamp()),
    }
    claims = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{TOKEN_PREFIX}{claims}.{_b64(_token_mac(settings, claims))}"


def read_token(settings: Settings, presented: str) -> Caller:
    """The caller a browser token stands for; 401 when forged, malformed or expired."""
    claims, _, mac = presented[len(TOKEN_PREFIX) :].partition(".")
    try:
        valid = hmac.compare_digest(_unb64(mac), _token_mac(settings, claims))
        body = json.loads(_unb64(claims)) if valid else None
    except (ValueError, TypeError):
        body = None
    if not isinstance(body, dict):
        raise Unauthorized("The browser token is not valid")
    if body.get("exp", 0) <= datetime.now(UTC).timestamp():
        raise Unauthorized("The browser token has expired")
    return Caller(
        tenant=str(body["t"]),
        key_id=str(body["k"]),
        session_id=uuid.UUID(str(body["s"])),
        read_only=bool(body.get("ro")),
    )


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
