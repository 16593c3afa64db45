"""The embedded default: SQLite, the offline model, no key. A smaller set that keeps it
honest: the run command as a new user starts it, and the main flows work on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.migrate import upgrade
from tests.conftest import LiveServer, free_port
from tests.runs.helpers import assert_next_request_valid, messages, names, new_session, post_stream
from tests.sqlite.conftest import sqlite_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sqlite


@pytest.fixture
async def sqlite_live(tmp_path: Path) -> AsyncIterator[LiveServer]:
    async with sqlite_server(tmp_path) as server:
        yield server


async def test_turns_tools_tree_fork_compact_on_sqlite(sqlite_live: LiveServer) -> None:
    async with sqlite_live.client() as client:
        sid = await new_session(client, builtin_tools=["Read", "Write"])
        events = await post_stream(
            client, sid, 'write it\n/tool Write {"file_path": "a.txt", "content": "hello"}'
        )
        assert names(events)[-1] == "run.completed"
        assert "tool_result" in names(events)
        assert (await client.get(f"/sessions/{sid}/files/a.txt")).content == b"hello"
        for i in range(10):  # long enough that compacting makes it smaller
            body = (
                await client.post(
                    f"/sessions/{sid}/messages", json={"content": f"message {i} " * 300}
                )
            ).json()
            assert body["run"]["status"] == "completed"
        chain = await messages(client, sid)
        assert len(chain) == 24
        compacted = await client.post(f"/sessions/{sid}/compact", json={})
        assert compacted.status_code == 200, compacted.text
        summary = compacted.json()["summary"]
        assert "Primary Request and Intent" in summary
        api_view = await messages(client, sid, view="api")
        assert api_view[0]["subtype"] == "compact_summary"
        forked = (await client.post(f"/sessions/{sid}/fork", json={})).json()
        assert len(await messages(client, forked["id"])) == len(await messages(client, sid))
        tree = (await client.get(f"/sessions/{sid}/tree", params={"limit": 1000})).json()["data"]
        assert [n["subtype"] for n in tree].count("compact_boundary") == 1
        exported = await client.get(f"/sessions/{sid}/transcript")
        assert exported.status_code == 200
        imported = await client.post("/sessions/import", content=exported.content)
        assert imported.status_code == 201
        await assert_next_request_valid(client, sid)


async def test_one_active_run_per_session_is_enforced_by_sqlite(tmp_path: Path) -> None:
    import uuid

    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.ext.asyncio import AsyncSession

    from app.models import AgentSession, Run

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")
    await upgrade(engine)
    async with AsyncSession(engine) as db:
        sid = uuid.uuid4()
        db.add(AgentSession(id=sid, tenant="t", model="m"))
        await db.flush()
        for status in ("running", "completed", "failed"):
            db.add(Run(session_id=sid, status=status, params={}, state={}, usage={}))
        await db.commit()
        db.add(Run(session_id=sid, status="requires_action", params={}, state={}, usage={}))
        with pytest.raises(IntegrityError):
            await db.commit()
    await engine.dispose()


def new_user_env() -> dict[str, str]:
    """The environment of a new user: none of the service's settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PARLEY_", "DATABASE_URL", "ANTHROPIC_"))
    }
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_the_run_command_serves_open_on_loopback(tmp_path: Path) -> None:
    """`python -m app serve` in a fresh directory: migrates its SQLite file, needs no key."""
    port = free_port()
    env = new_user_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        created = httpx.post(f"http://127.0.0.1:{port}/sessions", json={"title": "t"}, timeout=5)
        assert created.status_code == 201
        sid = created.json()["id"]
        reply = httpx.post(
            f"http://127.0.0.1:{port}/sessions/{sid}/messages",
            json={"content": "hello"},
            timeout=30,
        )
        assert reply.json()["run"]["status"] == "completed"
        assert "not a language model" in reply.json()["messages"][-1]["content"][0]["text"]
        assert (tmp_path / "parley.db").exists()
    finally:
        proc.terminate()
        proc.wait(20)
    assert "running OPEN" in (proc.stderr.read() if proc.stderr else "")


def test_open_mode_is_refused_on_a_public_address(tmp_path: Path) -> None:
    env = new_user_env()
    proc = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "refusing to run without API keys" in proc.stderr
