"""Runs executing at once per tenant. On Postgres the count is taken under a
transaction-scoped advisory lock of the tenant, held until the claim commits, so two
replicas admitting at the same moment cannot both take the last place."""

from __future__ import annotations

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.domain import RunStatus
from app.models import AgentSession, Run


async def at_limit(db: AsyncSession, settings: Settings, tenant: str) -> int | None:
    """The tenant's limit when it has that many runs running, else None."""
    limit = settings.limits_of(tenant).running_runs
    if not limit:
        return None
    if db.get_bind().dialect.name == "postgresql":
        await db.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
            {"key": f"parley-running:{tenant}"},
        )
    running = await db.scalar(
        select(func.count())
        .select_from(Run)
        .join(AgentSession, AgentSession.id == Run.session_id)
        .where(AgentSession.tenant == tenant, Run.status == RunStatus.RUNNING)
    )
    return limit if int(running or 0) >= limit else None
