"""Route: minting browser tokens, short-lived and scoped to one session."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter

from app import auth
from app.api.deps import CallerDep, DbDep, SettingsDep
from app.conversation import sessions
from app.errors import Invalid
from app.schemas import TokenIn, TokenOut

router = APIRouter(tags=["tokens"])


@router.post("/tokens", status_code=201, summary="Mint a browser token")
async def mint_token(
    body: TokenIn, db: DbDep, caller: CallerDep, settings: SettingsDep
) -> TokenOut:
    """A token a web page can use instead of the tenant's key (`Authorization: Bearer
    pbt_...`) for one session: read it, stream its runs, and unless `read_only` post
    turns and answer client tools there; anything else answers 403, another session 404,
    and an expired token 401. Tenant keys only; 404 for a session not the tenant's; 422
    when the server has no secret (PARLEY_SECRET_KEY) or for a lifetime past
    PARLEY_BROWSER_TOKEN_MAX_SECONDS."""
    if settings.secret_key is None:
        raise Invalid("Browser tokens are not enabled (PARLEY_SECRET_KEY is not set)")
    if body.ttl_seconds > settings.browser_token_max_seconds:
        raise Invalid.field(
            ["body", "ttl_seconds"],
            f"must be at most {settings.browser_token_max_seconds}",
        )
    session = await sessions.get(db, caller.tenant, body.session_id)
    expires_at = datetime.now(UTC) + timedelta(seconds=body.ttl_seconds)
    token = auth.mint_token(
        settings, caller, session.id, read_only=body.read_only, expires_at=expires_at
    )
    return TokenOut(
        token=token,
        session_id=session.id,
        read_only=body.read_only,
        expires_at=expires_at.replace(microsecond=0),
    )
