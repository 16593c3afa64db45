"""Retention of the event log: the stored SSE events of runs that finished long ago.

A run's events exist so a client can replay a stream (`Last-Event-ID`); once a run has
finished and nobody will resume it, they are dead weight: every text delta is a row.
Pruning deletes the events only: the run row (status, usage, error) and the messages it
produced are the conversation and stay. Each batch is its own short transaction, so a
large backlog never holds locks for long.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, exists, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.domain import FINAL_RUN_STATUSES
from app.models import Run, RunEvent

BATCH_RUNS = 500


@dataclass(frozen=True)
class Pruned:
    runs: int
    events: int


async def prune_batch(db: AsyncSession, cutoff: datetime, limit: int = BATCH_RUNS) -> Pruned:
    """Delete the events of up to `limit` runs that finished before `cutoff`."""
    run_ids = list(
        await db.scalars(
            select(Run.id)
            .where(
                Run.status.in_(FINAL_RUN_STATUSES),
                Run.finished_at < cutoff,
                exists().where(RunEvent.run_id == Run.id),
            )
            .limit(limit)
        )
    )
    if not run_ids:
        return Pruned(0, 0)
    result = await db.execute(delete(RunEvent).where(RunEvent.run_id.in_(run_ids)))
    return Pruned(len(run_ids), int(result.rowcount))  # type: ignore[attr-defined]


async def prune_events(engine: AsyncEngine, older_than: timedelta) -> Pruned:
    """Delete the stored events of every run that finished more than `older_than` ago."""
    cutoff = datetime.now(UTC) - older_than
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    runs = events = 0
    while True:
        async with sessions() as db, db.begin():
            batch = await prune_batch(db, cutoff)
        if batch.runs == 0:
            return Pruned(runs, events)
        runs += batch.runs
        events += batch.events
