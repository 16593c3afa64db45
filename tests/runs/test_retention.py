"""`python -m app prune-events`: the events of runs that finished long ago go; the runs,
their messages, and the events of recent or active runs stay."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.__main__ import main
from tests.conftest import LiveServer
from tests.runs.helpers import messages, new_session, post_stream, stream

ROOT = Path(__file__).resolve().parents[2]


def prune(database_url: str, days: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command as an operator runs it (away from the repository's .env)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env.update(DATABASE_URL=database_url, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "app", "prune-events", "--older-than-days", days],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def event_counts(engine: AsyncEngine, run_ids: list[str]) -> list[int]:
    async with engine.connect() as conn:
        return [
            int(
                await conn.scalar(
                    text("SELECT count(*) FROM run_events WHERE run_id = :id"),
                    {"id": uuid.UUID(run_id)},
                )
                or 0
            )
            for run_id in run_ids
        ]


async def test_prune_events_keeps_messages_and_recent_runs(
    live: LiveServer, engine: AsyncEngine, database_url: str, tmp_path: Path
) -> None:
    async with live.client() as client:
        sid = await new_session(client)
        run_ids = []
        for content in ("old", "old but active", "recent"):
            events = await post_stream(client, sid, content)
            assert events[0].event == "run.started"
            run_ids.append(events[0].json["id"])
        before = await messages(client, sid)
        old, active, _recent = run_ids
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE runs SET finished_at = now() - interval '40 days' WHERE id = ANY(:ids)"
                ),
                {"ids": [uuid.UUID(old), uuid.UUID(active)]},
            )
            # As if still executing (a run that finished keeps its events until it ages).
            await conn.execute(
                text("UPDATE runs SET status = 'running' WHERE id = :id"),
                {"id": uuid.UUID(active)},
            )
        counts = await event_counts(engine, run_ids)
        assert all(n > 0 for n in counts)

        result = prune(database_url, "30", tmp_path)
        assert result.returncode == 0, result.stderr
        assert (
            result.stdout.strip()
            == f"deleted {counts[0]} events of 1 runs finished over 30 days ago"
        )
        assert await event_counts(engine, run_ids) == [0, counts[1], counts[2]]
        assert await messages(client, sid) == before
        run = (await client.get(f"/sessions/{sid}/runs/{old}")).json()
        assert run["status"] == "completed"
        # Its stream now replays nothing and ends at once.
        assert await stream(client, "GET", f"/sessions/{sid}/runs/{old}/events") == []

        again = prune(database_url, "30", tmp_path)
        assert again.stdout.strip() == "deleted 0 events of 0 runs finished over 30 days ago"
        async with engine.begin() as conn:  # leave the session idle for other tests
            await conn.execute(
                text("UPDATE runs SET status = 'completed' WHERE id = :id"),
                {"id": uuid.UUID(active)},
            )


def test_prune_events_refuses_a_negative_age(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["prune-events", "--older-than-days", "-1"])
    assert exit_.value.code == 2
    assert "--older-than-days: must be a number of days, 0 or more" in capsys.readouterr().err
