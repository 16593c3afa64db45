"""What the model calls of compaction cost, counted like a turn's: on the run that made
them, on the session's counters, in the hourly usage budgets read, and in the
metrics. A summary that is thrown away (a
compaction refused because it would not gain enough) was still paid for."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import update

from app import metrics
from app.conversation.store import sessions_t
from app.domain import usage_counts
from app.engine.handle import RunHandle
from app.engine.quotas import budgets
from app.engine.resources import Resources


def _session_counters(counts: dict[str, int]) -> dict[str, Any]:
    return {name: sessions_t.c[name] + value for name, value in counts.items()}


def _observe(counts: dict[str, int]) -> None:
    for kind, value in counts.items():
        metrics.model_tokens.labels(kind).inc(value)


async def charge_run(run: RunHandle, usage: dict[str, Any] | None) -> None:
    """Add a model call's usage to the run (its row, in a step of its own) and to its
    session's counters."""
    counts = usage_counts(usage)
    if not counts:
        return
    for key, value in counts.items():
        run.run_usage[key] = run.run_usage.get(key, 0) + value
    async with run.step() as step:
        step.run_values.update(usage=dict(run.run_usage))
        await step.db.execute(
            update(sessions_t)
            .where(sessions_t.c.id == run.session.id)
            .values(**_session_counters(counts))
        )
        await budgets.record(step.db, run.session.tenant, run.session.id, counts)
    _observe(counts)


async def charge_session(
    resources: Resources, session_id: uuid.UUID, usage: dict[str, Any] | None
) -> None:
    """Add the usage of a model call made outside any run (a background collapse) to the
    session's counters."""
    counts = usage_counts(usage)
    if not counts:
        return
    async with resources.db.transaction() as db:
        tenant = await db.scalar(
            update(sessions_t)
            .where(sessions_t.c.id == session_id)
            .values(**_session_counters(counts))
            .returning(sessions_t.c.tenant)
        )
        if tenant is not None:
            await budgets.record(db, tenant, session_id, counts)
    _observe(counts)
