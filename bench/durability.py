"""How fast a run goes on after its process goes away.

Two Parley processes share one scratch database; the fake model streams slow replies.
Each trial posts streaming turns to one process while a client follows them on the
other, then

- **kill**: `kill -9` of the owner. Measured: from the kill to the first event of the
  resumed run on the survivor (its `message.discarded` for the cut-off reply), beside
  the lease length. Target: within the lease plus one reaper interval.
- **handover**: SIGTERM to the owner (grace `--grace`, 0 by default so every run is
  handed over). Measured: from the signal to the run's first event on the other
  replica. Target: within 1 s.

The stopped process is started again between trials (not timed).

    python -m bench durability [--kills 10] [--handovers 5] [--runs 2] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.config import Settings
from app.db import make_engine
from app.engine.loop import DISCARDED_ON_RESUME
from app.migrate import upgrade
from bench.common import (
    percentile,
    plain_dsn,
    save_results,
    scratch_database,
    section,
    table,
    verdict,
)
from bench.procs import Child, parley_env, start_fake, start_parley

DB = "parley_bench_durability"
API_KEY = "bench-key-0123456789abcdef"
# Replies of about 4 s (2 characters every 50 ms), so a fault lands mid-stream.
FAKE_CONFIG = {"chunk_delay": 0.05, "text_chunk_chars": 2}
PROMPT = "tell me something long enough to be cut off " * 2


@dataclass
class Followed:
    """One run as a client on the other process sees it: event names and arrival times."""

    events: list[tuple[float, str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def count(self, name: str) -> int:
        return sum(1 for _, event, _ in self.events if event == name)

    def first_resumed(self) -> float | None:
        """When the new owner's first event arrived (it withdraws the cut-off reply)."""
        for at, event, data in self.events:
            if event == "message.discarded" and data.get("reason") == DISCARDED_ON_RESUME:
                return at
        return None

    @property
    def done(self) -> bool:
        return any(e in ("run.completed", "run.failed", "run.cancelled") for _, e, _ in self.events)


async def follow(client: httpx.AsyncClient, path: str, into: Followed) -> None:
    async with client.stream("GET", path, timeout=None) as response:
        event: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line:
                key, _, value = line.partition(": ")
                event[key] = value
                continue
            if "event" in event:
                into.events.append((time.monotonic(), event["event"], json.loads(event["data"])))
                into.changed.set()
            event = {}


async def until(check: Any, followed: list[Followed], limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not all(check(f) for f in followed):
        if time.monotonic() > deadline:
            raise RuntimeError("a run did not get there in time")
        await asyncio.sleep(0.01)


class Stack:
    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.owner: Child | None = None
        self.survivor: Child | None = None

    async def start(self) -> None:
        self.owner, self.survivor = await asyncio.gather(
            start_parley(self.log_dir, self.env), start_parley(self.log_dir, self.env)
        )

    async def restart_owner(self) -> None:
        assert self.owner is not None
        self.owner.log.close()
        self.owner = await start_parley(self.log_dir, self.env)

    def stop(self) -> None:
        for child in (self.owner, self.survivor):
            if child is not None:
                child.stop(timeout=10)


async def trial(stack: Stack, runs: int, sig: int) -> list[float]:
    """Post `runs` turns to the owner, follow them on the survivor, send `sig` to the owner
    mid-stream; seconds from the signal to each run's first event of its new owner."""
    assert stack.owner is not None
    assert stack.survivor is not None
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with (
        httpx.AsyncClient(base_url=stack.owner.url, headers=headers, timeout=30) as owner,
        httpx.AsyncClient(base_url=stack.survivor.url, headers=headers, timeout=30) as survivor,
    ):
        paths = []
        for _ in range(runs):
            sid = (await owner.post("/sessions", json={})).json()["id"]
            posted = await owner.post(
                f"/sessions/{sid}/messages", json={"content": PROMPT, "background": True}
            )
            paths.append(f"/sessions/{sid}/runs/{posted.json()['id']}/events")
        followed = [Followed() for _ in paths]
        tasks = [
            asyncio.create_task(follow(survivor, p, f))
            for p, f in zip(paths, followed, strict=True)
        ]
        try:
            await until(lambda f: f.count("text.delta") >= 5, followed)
            sent = time.monotonic()
            os.kill(stack.owner.popen.pid, sig)
            await until(lambda f: f.done, followed)
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                    await task
        await asyncio.to_thread(stack.owner.popen.wait, 60)
    times = []
    for f in followed:
        first = f.first_resumed()
        if first is None:
            raise RuntimeError("a run finished without being resumed")
        times.append(first - sent)
    return times


def summary(label: str, values: list[float], bound: float) -> list[Any]:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return [label, len(values), f"{p50:.2f}", f"{p99:.2f}", f"{bound:g}", verdict(p99, bound)]


async def run(args: argparse.Namespace) -> int:
    settings = Settings(model_provider="offline")
    lease = args.lease if args.lease is not None else settings.run_lease_seconds
    reaper = args.reaper if args.reaper is not None else settings.reaper_interval_seconds
    results: dict[str, Any] = {"lease_seconds": lease, "reaper_interval_seconds": reaper}
    async with AsyncExitStack() as exits:
        url = await exits.enter_async_context(scratch_database(DB))
        engine = make_engine(Settings(database_url=url, model_provider="offline"))
        await upgrade(engine)
        await engine.dispose()
        log_dir = Path(exits.enter_context(tempfile.TemporaryDirectory(prefix="bench-durab-")))
        fake = await start_fake(log_dir, FAKE_CONFIG)
        exits.callback(fake.stop)
        env = {
            **parley_env(plain_dsn(url), fake.url, API_KEY),
            "PARLEY_RUN_LEASE_SECONDS": str(lease),
            "PARLEY_REAPER_INTERVAL_SECONDS": str(reaper),
            "PARLEY_SHUTDOWN_GRACE_SECONDS": str(args.grace),
        }
        stack = Stack(log_dir, env)
        exits.callback(stack.stop)
        await stack.start()
        kills: list[float] = []
        handovers: list[float] = []
        try:
            for i in range(args.kills):
                kills += await trial(stack, args.runs, signal.SIGKILL)
                print(f"kill {i + 1}/{args.kills}: {max(kills[-args.runs :]):.2f} s", flush=True)
                await stack.restart_owner()
            for i in range(args.handovers):
                handovers += await trial(stack, args.runs, signal.SIGTERM)
                print(f"SIGTERM {i + 1}/{args.handovers}: {max(handovers[-args.runs :]):.2f} s")
                await stack.restart_owner()
        except Exception:
            for child in (stack.owner, stack.survivor):
                if child is not None:
                    print(f"--- {child.name} log (tail) ---\n{child.tail()}")
            raise
    section("Resuming a run after its process stops (seconds)")
    rows = []
    if kills:
        rows.append(summary("kill -9 -> first event of the resumed run", kills, lease + reaper))
    if handovers:
        rows.append(summary(f"SIGTERM (grace {args.grace:g} s) -> first event", handovers, 1.0))
    print(table(["measure", "n", "p50", "p99", "target", "verdict"], rows))
    print(f"lease {lease:g} s, reaper interval {reaper:g} s; {args.runs} runs per trial")
    results.update(kill_seconds=kills, handover_seconds=handovers)
    if not args.quick:
        print(f"results: {save_results('durability', results)}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench durability",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kills", type=int, default=10, help="kill -9 trials")
    parser.add_argument("--handovers", type=int, default=5, help="SIGTERM trials")
    parser.add_argument("--runs", type=int, default=2, help="streaming runs per trial")
    parser.add_argument(
        "--lease", type=float, help="PARLEY_RUN_LEASE_SECONDS (default: the default)"
    )
    parser.add_argument("--reaper", type=float, help="PARLEY_REAPER_INTERVAL_SECONDS")
    parser.add_argument("--grace", type=float, default=0.0, help="PARLEY_SHUTDOWN_GRACE_SECONDS")
    parser.add_argument("--quick", action="store_true", help="2 trials of each, nothing saved")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.handovers = 2, 2
    return asyncio.run(run(args))
