"""Secrets and signatures of the Standard Webhooks convention (`webhook-id`,
`webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256>`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from datetime import datetime

from standardwebhooks import Webhook

PREFIX = "whsec_"


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def turn_secret(server_secret: str, tenant: str) -> str:
    """The tenant's secret for per-turn webhook URLs, derived from the server secret
    (the same on every replica, nothing stored)."""
    raw = hmac.new(server_secret.encode(), b"turn-webhooks:" + tenant.encode(), hashlib.sha256)
    return PREFIX + base64.b64encode(raw.digest()).decode()


def headers(secret: str, msg_id: str, at: datetime, body: str) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, at, body),
        "content-type": "application/json",
    }
