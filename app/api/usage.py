"""Route: the tenant's token usage over a time range."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import DbDep, SettingsDep, TenantDep
from app.engine.quotas import budgets
from app.errors import Invalid
from app.schemas import SessionUsage, Timestamp, UsageOut

router = APIRouter(tags=["usage"])


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@router.get("/usage", summary="Get token usage")
async def get_usage(
    db: DbDep,
    tenant: TenantDep,
    settings: SettingsDep,
    start: Annotated[Timestamp | None, Query(alias="from")] = None,
    end: Annotated[Timestamp | None, Query(alias="to")] = None,
) -> UsageOut:
    """Input and output tokens of the tenant's model calls (turns, compaction summaries,
    collapses) from `from` (default: the start of the current budget period) to `to`
    (default: now), in total and per session. Usage is kept per hour: `from` counts from
    the start of its hour. 422 when `to` is before `from`."""
    now = datetime.now(UTC)
    end = _utc(end) if end else now
    start = _utc(start) if start else budgets.period_start(settings.budget_period, now)
    if end < start:
        raise Invalid.field(["query", "to"], "must not be before from")
    rows = await budgets.usage_between(db, tenant, start, end)
    return UsageOut(
        from_=start,
        to=end,
        input_tokens=sum(r[1] for r in rows),
        output_tokens=sum(r[2] for r in rows),
        sessions=[SessionUsage(session_id=s, input_tokens=i, output_tokens=o) for s, i, o in rows],
    )
