"""Schemathesis against the service on real Postgres, with every check: no input gives
a 5xx, and every answer conforms to the OpenAPI document (statuses, media types,
schemas). Bounded in time; the figures are printed (`pytest -s`) and kept in the README.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_KEY, LiveServer

CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_SECONDS = int(os.environ.get("PARLEY_FUZZ_SECONDS", "150"))


async def seed(live: LiveServer) -> dict[str, str]:
    """Ids of existing resources, so generated requests reach past the 404s."""
    async with live.client() as client:
        session = (await client.post("/sessions", json={"builtin_tools": ["Read"]})).json()
        sid = session["id"]
        turn = (await client.post(f"/sessions/{sid}/messages", json={"content": "hi"})).json()
        for name in ("notes.txt", "doomed.txt"):
            put = await client.put(f"/sessions/{sid}/files/{name}", content=b"hello\n")
            assert put.status_code == 201
        doomed = (await client.post("/sessions", json={})).json()["id"]
    return {
        "PARLEY_FUZZ_DOOMED_SESSION": doomed,
        "PARLEY_FUZZ_KEY": TEST_KEY,
        "PARLEY_FUZZ_SESSION": sid,
        "PARLEY_FUZZ_RUN": turn["run"]["id"],
        "PARLEY_FUZZ_MESSAGE": turn["messages"][-1]["uuid"],
        "PARLEY_FUZZ_FILE": "notes.txt",
    }


@pytest.mark.fuzz
async def test_schemathesis_finds_no_failure(live: LiveServer, tmp_path: Path) -> None:
    env = {**os.environ, **await seed(live)}
    report = tmp_path / "report.json"
    cli = Path(sys.executable).with_name("schemathesis")
    process = await asyncio.create_subprocess_exec(
        str(cli),
        "--config-file",
        str(CONFIG),
        "run",
        f"{live.base_url}/openapi.json",
        "--checks",
        "all",
        "--max-time",
        str(MAX_SECONDS),
        # one worker: Hypothesis describes strategies with ast.parse, which CPython 3.11
        # may fail in concurrent threads ("AST constructor recursion depth mismatch")
        "--workers",
        "1",
        "--seed",
        "9",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        env=env,
        cwd=tmp_path,  # where it keeps its cache
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    text = output.decode(errors="replace")
    print(text[-6000:])
    assert process.returncode == 0, text[-20000:]
    print(json.dumps(json.loads(report.read_text()).get("summary", {}), indent=2)[:2000])
