"""Token budgets: input + output tokens per tenant and per session over a period (an
hour, day or month, UTC). Every model call adds its tokens to an hourly row
(`token_usage`) in the transaction that stores its usage elsewhere; a budget is the sum
of the rows since the period began.

Input counts every token the model read (`input_tokens` plus cache reads and writes),
so a cached conversation is not free of its budget.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Table, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.engine.quotas.upsert import insert_for
from app.models import AgentSession, TokenUsage

usage_t = cast(Table, TokenUsage.__table__)
INPUT_COUNTERS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def hour_of(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def period_start(period: str, at: datetime) -> datetime:
    start = hour_of(at)
    if period in ("day", "month"):
        start = start.replace(hour=0)
    if period == "month":
        start = start.replace(day=1)
    return start


async def record(
    db: AsyncSession, tenant: str, session_id: uuid.UUID, counts: dict[str, int]
) -> None:
    """Add a model call's usage (its counters) to the session's row of this hour."""
    spent_in = sum(counts.get(name, 0) for name in INPUT_COUNTERS)
    spent_out = counts.get("output_tokens", 0)
    if not spent_in and not spent_out:
        return
    await db.execute(
        _add_usage(db.get_bind().dialect.name),
        {
            "session_id": session_id,
            "hour": hour_of(datetime.now(UTC)),
            "tenant": tenant,
            "input_tokens": spent_in,
            "output_tokens": spent_out,
        },
    )


@lru_cache(maxsize=2)
def _add_usage(dialect: str) -> Any:
    """The upsert of `record`, built once per dialect (it runs with every model call)."""
    statement = insert_for(dialect, usage_t)
    return statement.on_conflict_do_update(
        index_elements=[usage_t.c.session_id, usage_t.c.hour],
        set_={
            "input_tokens": usage_t.c.input_tokens + statement.excluded.input_tokens,
            "output_tokens": usage_t.c.output_tokens + statement.excluded.output_tokens,
        },
    )


@dataclass(frozen=True)
class Exhausted:
    """A budget that is used up: which one, its limit, what was used and when it resets."""

    scope: str  # "tenant" or "session"
    limit: int
    used: int
    period: str
    since: datetime

    @property
    def message(self) -> str:
        return (
            f"The {self.scope}'s token budget of {self.limit} input + output tokens per "
            f"{self.period} is used up ({self.used} used since {self.since.isoformat()})"
        )

    def as_extra(self) -> dict[str, Any]:
        return {"budget": self.scope, "limit": self.limit, "used": self.used, "period": self.period}


async def _used(db: AsyncSession, since: datetime, **where: Any) -> int:
    total = await db.scalar(
        select(func.coalesce(func.sum(usage_t.c.input_tokens + usage_t.c.output_tokens), 0)).where(
            usage_t.c.hour >= since, *(usage_t.c[name] == value for name, value in where.items())
        )
    )
    return int(total or 0)


async def exhausted(
    db: AsyncSession, settings: Settings, session: AgentSession
) -> Exhausted | None:
    """The first budget of the session's tenant or of the session itself that is used
    up, if any (no query when neither has one)."""
    since = period_start(settings.budget_period, datetime.now(UTC))
    tenant_limit = settings.limits_of(session.tenant).token_budget or 0
    budgets: list[tuple[str, int, dict[str, Any]]] = [
        ("tenant", tenant_limit, {"tenant": session.tenant}),
        ("session", session.token_budget or 0, {"session_id": session.id}),
    ]
    for scope, limit, where in budgets:
        if limit > 0:
            used = await _used(db, since, **where)
            if used >= limit:
                return Exhausted(scope, limit, used, settings.budget_period, since)
    return None


async def usage_between(
    db: AsyncSession, tenant: str, start: datetime, end: datetime
) -> list[tuple[uuid.UUID, int, int]]:
    """(session, input, output) of the tenant's hours from the one holding `start` up
    to `end` (hourly rows: the hour is the finest grain)."""
    result = await db.execute(
        select(
            usage_t.c.session_id,
            func.sum(usage_t.c.input_tokens),
            func.sum(usage_t.c.output_tokens),
        )
        .where(usage_t.c.tenant == tenant, usage_t.c.hour >= hour_of(start), usage_t.c.hour < end)
        .group_by(usage_t.c.session_id)
        .order_by(usage_t.c.session_id)
    )
    return [(sid, int(i or 0), int(o or 0)) for sid, i, o in result.all()]
