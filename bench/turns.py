"""What a turn through Parley costs beyond the model, next to a bare proxy.

Three processes besides this one: the fake Anthropic API (zero latency, loopback),
Parley (`uv run python -m app serve`, its own scratch database) and
`bench.baseline_proxy` (FastAPI + sse-starlette + asyncpg, its own scratch database).

1. Time to the first text delta (TTFT) through Parley (SSE), through the proxy (SSE)
   and from the fake called directly with the SDK, interleaved in one run: rounds of
   A, B, C in rotating order, at concurrency 1 and 10 (10 clients, one session each,
   the ten turns of a system's round sent at once). A service's added latency is each
   of its TTFTs minus the median direct TTFT of the same round; p50/p99 are taken over
   those. The CPU time each process used per turn is printed too (it does not depend
   on what else the shared machine is doing).
2. Per-turn time in wait mode (request to response) with a history of 10, 1,000 and
   10,000 messages seeded straight into both databases (Parley's with
   `store.append_many`), interleaved the same way; compaction off in those sessions.
3. Prompt cache: a 30-turn session where every turn Reads a workspace file and then
   answers (scripted fake replies); the share of input tokens read from the cache on
   turns 2..30, summed from the usage the fake reports.
4. CPU per streamed text delta: 100 replies streamed at once through the proxy, then
   through Parley (rotating), the fake sending one delta per character at 20 a second;
   each process's CPU over its round divided by the deltas its clients received.
5. Idle followers: 5,000 SSE connections following 50 runs whose model has not answered
   yet (raw HTTP/1.1 clients that read nothing after the response head); Parley's
   resident memory and a probe turn's time to first delta, beside the same probe with
   no followers.

Streams that Parley ends without `run.completed` are counted and reported (a
correctness finding), not fatal. `--profile-parley FILE` runs Parley under cProfile.
`--base DIR` adds another checkout's Parley (its own process and scratch database, this
interpreter) to phase 1 as a fourth system, `base`, interleaved with the others: a
change measured against the code before it in one run, on a machine whose speed drifts.

    uv run python -m bench turns [--quick] [--only ttft,sizes,cache,streaming,followers]
        [--profile-parley F] [--base DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import anthropic
import asyncpg
import httpx
from anthropic.types import MessageParam, RawContentBlockDeltaEvent, TextDelta

from app.config import Settings
from app.conversation import store
from app.db import Database, make_engine
from app.migrate import upgrade
from bench.common import (
    TextFactory,
    median,
    ms,
    percentile,
    plain_dsn,
    ratio,
    records_of,
    save_results,
    scratch_database,
    section,
    table,
    verdict,
)
from bench.procs import (
    Child,
    cpu_seconds,
    parley_env,
    rss_bytes,
    start_fake,
    start_parley,
    start_proxy,
)

PARLEY_DB = "parley_bench_turns"
PROXY_DB = "parley_bench_proxy"
API_KEY = "bench-key-0123456789abcdef"
MODEL: str = Settings.model_fields["model"].default
MAX_TOKENS = 16_000
FAKE_CONFIG: dict[str, Any] = {"record_bodies": False, "max_context_tokens": 100_000_000}
# The model view must stay whole: no auto or micro compaction, and a threshold so high
# that background context collapse (which `auto: false` does not stop) never starts.
NO_COMPACTION = {"auto": False, "micro": False, "threshold_tokens": 1_000_000_000}
TEXT_DELTA = b"event: text.delta"
EPHEMERAL = {"type": "ephemeral"}
TARGETS = {
    "added_p50": 1.2,
    "added_p99": 2.0,
    "per_turn": 1.5,
    "cache_share": 0.90,
    "cpu_per_delta": 1.5,
    "followers_rss": 512 * 2**20,
    "followers_ttft": 2.0,
}
# Phase 4: one text_delta per character, 20 a second.
STREAMING_CONFIG = {"text_chunk_chars": 1, "chunk_delay": 0.05}


@dataclass(frozen=True)
class Plan:
    c1_turns: int
    c10_turns: int
    clients: int
    warmup_rounds: int
    sizes: dict[int, int]  # history size -> timed turns per system
    cache_turns: int
    streaming_runs: int  # concurrent streamed replies per round (phase 4)
    streaming_rounds: int
    followers: int  # idle SSE followers (phase 5)
    followed_runs: int  # the runs they follow
    probe_turns: int


FULL = Plan(200, 500, 10, 5, {10: 30, 1_000: 15, 10_000: 5}, 30, 100, 2, 5_000, 50, 20)
QUICK = Plan(6, 20, 10, 1, {10: 2, 200: 2}, 3, 10, 1, 200, 5, 3)


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Sample:
    ttft: float
    total: float


def text_blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def history_messages(history: Sequence[str]) -> list[dict[str, Any]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": text_blocks(t)} for i, t in enumerate(history)]


# --- the three systems -------------------------------------------------------------------


class Target(Protocol):
    name: str

    async def conversation(self, history: Sequence[str]) -> Any: ...

    async def stream_turn(self, conv: Any, text: str) -> Sample | None: ...

    async def wait_turn(self, conv: Any, text: str) -> float: ...


class Direct:
    """The fake called with the SDK, keeping the history client-side; like the proxy it
    marks the newest block as a cache breakpoint, so the fake does the same work."""

    name = "direct"

    def __init__(self, fake_url: str) -> None:
        self.sdk = anthropic.AsyncAnthropic(base_url=fake_url, api_key="x", max_retries=0)

    async def aclose(self) -> None:
        await self.sdk.close()

    async def conversation(self, history: Sequence[str]) -> list[dict[str, Any]]:
        return history_messages(history)

    async def stream_turn(self, conv: list[dict[str, Any]], text: str) -> Sample:
        conv.append({"role": "user", "content": text_blocks(text)})
        start = time.perf_counter()
        first: float | None = None
        parts: list[str] = []
        last = {**conv[-1], "content": [{**conv[-1]["content"][0], "cache_control": EPHEMERAL}]}
        messages = cast(list[MessageParam], [*conv[:-1], last])
        stream = await self.sdk.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=messages, stream=True
        )
        async for event in stream:
            if isinstance(event, RawContentBlockDeltaEvent):
                first = first or time.perf_counter()
                if isinstance(event.delta, TextDelta):
                    parts.append(event.delta.text)
        end = time.perf_counter()
        if first is None:
            raise BenchError("direct: the stream had no content_block_delta")
        conv.append({"role": "assistant", "content": text_blocks("".join(parts))})
        return Sample(first - start, end - start)

    async def wait_turn(self, conv: list[dict[str, Any]], text: str) -> float:
        return (await self.stream_turn(conv, text)).total


@dataclass(frozen=True)
class Streamed:
    sample: Sample | None  # None when no text delta arrived
    events: list[str]  # the SSE event names, in order
    broken: bool = False  # the server closed the connection mid-body

    @property
    def last_event(self) -> str:
        return self.events[-1] if self.events else ""


def event_names(body: bytes) -> list[str]:
    return [
        line.split(b":", 1)[1].strip().decode()
        for line in body.splitlines()
        if line.startswith(b"event:")
    ]


async def sse_turn(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Streamed:
    """POST, then read the SSE body to its end; TTFT is when `event: text.delta` arrives."""
    start = time.perf_counter()
    first: float | None = None
    received = bytearray()
    broken = False
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread())[:500]
            raise BenchError(f"POST {path}: {response.status_code} {detail!r}")
        try:
            async for chunk in response.aiter_raw():
                received += chunk
                if first is None and TEXT_DELTA in received[-(len(chunk) + len(TEXT_DELTA)) :]:
                    first = time.perf_counter()
        except httpx.RemoteProtocolError:
            broken = True
    total = time.perf_counter() - start
    events = event_names(bytes(received)) + (["<connection closed>"] if broken else [])
    sample = Sample(first - start, total) if first is not None else None
    return Streamed(sample, events, broken)


def http_client(base_url: str, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        headers=headers,
        timeout=httpx.Timeout(300.0),
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
    )


class Parley:
    name = "parley"

    def __init__(self, url: str, database_url: str, session_body: dict[str, Any]) -> None:
        self.http_url = url
        self.http = http_client(url, {"Authorization": f"Bearer {API_KEY}"})
        self.db = Database(
            make_engine(Settings(database_url=database_url, model_provider="offline"))
        )
        self.session_body = session_body
        self.truncated: list[list[str]] = []  # event names of streams cut short

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.db.dispose()

    async def new_session(self, body: dict[str, Any]) -> str:
        response = await self.http.post("/sessions", json=body)
        if response.status_code != 201:
            raise BenchError(f"parley: POST /sessions {response.status_code} {response.text}")
        return str(response.json()["id"])

    async def conversation(self, history: Sequence[str]) -> str:
        sid = await self.new_session(self.session_body)
        if history:
            await self.seed(uuid.UUID(sid), history)
        return sid

    async def seed(self, sid: uuid.UUID, history: Sequence[str]) -> None:
        """The history written with the store's own append_many, one chain."""
        specs: list[dict[str, Any]] = []
        parent: uuid.UUID | None = None
        for message in history_messages(history):
            node = uuid.uuid4()
            role = message["role"]
            specs.append(
                {
                    "message_uuid": node,
                    "parent_uuid": parent,
                    "type": role,
                    "role": role,
                    "content": message["content"],
                    "model": MODEL if role == "assistant" else None,
                    "stop_reason": "end_turn" if role == "assistant" else None,
                }
            )
            parent = node
        async with self.db.transaction() as db:
            await store.append_many(db, records_of(sid, specs))

    async def stream_turn(self, sid: str, text: str) -> Sample | None:
        """A streamed turn. A stream that ends without `run.completed` is counted (see
        `truncated`) and the session waited on until idle, so the next turn can start."""
        body = {"content": text, "stream": True}
        streamed = await sse_turn(self.http, f"/sessions/{sid}/messages", body)
        if streamed.last_event != "run.completed" or streamed.sample is None:
            self.truncated.append(streamed.events)
            await self.wait_idle(sid)
        return streamed.sample

    async def wait_idle(self, sid: str, limit_seconds: float = 60.0) -> None:
        deadline = time.monotonic() + limit_seconds
        while time.monotonic() < deadline:
            response = await self.http.get(f"/sessions/{sid}")
            if response.status_code == 200 and response.json()["status"] == "idle":
                return
            await asyncio.sleep(0.01)
        raise BenchError(f"parley: session {sid} still busy after {limit_seconds}s")

    async def wait_turn(self, sid: str, text: str) -> float:
        start = time.perf_counter()
        result = await self.post_wait(sid, text)
        elapsed = time.perf_counter() - start
        if result["run"]["status"] != "completed":
            raise BenchError(f"parley: run ended {result['run']['status']}: {result['run']}")
        return elapsed

    async def post_wait(self, sid: str, text: str) -> dict[str, Any]:
        response = await self.http.post(f"/sessions/{sid}/messages", json={"content": text})
        if response.status_code != 200:
            raise BenchError(f"parley: turn {response.status_code} {response.text[:500]}")
        return dict(response.json())


class Proxy:
    name = "proxy"

    def __init__(self, url: str, database_dsn: str) -> None:
        self.http = http_client(url)
        self.dsn = database_dsn

    async def aclose(self) -> None:
        await self.http.aclose()

    async def conversation(self, history: Sequence[str]) -> str:
        response = await self.http.post("/sessions")
        if response.status_code != 201:
            raise BenchError(f"proxy: POST /sessions {response.status_code} {response.text}")
        sid = str(response.json()["id"])
        if history:
            await self.seed(uuid.UUID(sid), history)
        return sid

    async def seed(self, sid: uuid.UUID, history: Sequence[str]) -> None:
        rows = [(sid, m["role"], json.dumps(m["content"])) for m in history_messages(history)]
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.executemany(
                "INSERT INTO proxy_messages (session_id, role, content) VALUES ($1, $2, $3::jsonb)",
                rows,
            )
        finally:
            await conn.close()

    async def stream_turn(self, sid: str, text: str) -> Sample:
        body = {"content": text, "stream": True}
        streamed = await sse_turn(self.http, f"/sessions/{sid}/messages", body)
        if streamed.last_event != "message.completed" or streamed.sample is None:
            raise BenchError(f"proxy: stream ended after {streamed.events[-3:]}")
        return streamed.sample

    async def wait_turn(self, sid: str, text: str) -> float:
        start = time.perf_counter()
        response = await self.http.post(f"/sessions/{sid}/messages", json={"content": text})
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            raise BenchError(f"proxy: turn {response.status_code} {response.text[:500]}")
        return elapsed


def rotated(targets: Sequence[Target], k: int) -> list[Target]:
    k %= len(targets)
    return [*targets[k:], *targets[:k]]


# --- process CPU ---------------------------------------------------------------------


CpuMeter = Callable[[], dict[str, float]]


def cpu_per_turn(
    before: dict[str, float], after: dict[str, float], turns: int, systems: int = 3
) -> dict[str, float]:
    """CPU seconds per turn of each service process, and of the fake per model call
    (each turn of each of the `systems` measured, direct included, is one model call)."""
    out = {name: (after[name] - before[name]) / max(turns, 1) for name in before if name != "fake"}
    out["fake"] = (after["fake"] - before["fake"]) / max(systems * turns, 1)
    return out


def cpu_line(cpu: dict[str, float]) -> str:
    line = (
        f"process CPU per turn: parley {ms(cpu['parley'])} ms, proxy {ms(cpu['proxy'])} ms "
        f"({ratio(cpu['parley'], cpu['proxy']):.2f}x)"
    )
    if "base" in cpu:
        line += f", base {ms(cpu['base'])} ms (parley/base {ratio(cpu['parley'], cpu['base']):.2f})"
    return line + f"; fake {ms(cpu['fake'])} ms per model call"


# --- 1. time to first token ---------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    round: int
    sample: Sample


async def ttft_phase(
    targets: Sequence[Target], clients: int, turns: int, words: TextFactory
) -> dict[str, list[Timed]]:
    """Rounds of `clients` concurrent turns per system, the systems in rotating order."""
    convs = {t.name: [await t.conversation(()) for _ in range(clients)] for t in targets}
    samples: dict[str, list[Timed]] = {t.name: [] for t in targets}
    for r in range(max(1, turns // clients)):
        text = f"Turn {r}: {words.text(60, 160)}"
        for target in rotated(targets, r):
            batch = await asyncio.gather(*(target.stream_turn(c, text) for c in convs[target.name]))
            samples[target.name].extend(Timed(r, s) for s in batch if s is not None)
    return samples


def added_latency(service: Sequence[Timed], direct: Sequence[Timed]) -> list[float]:
    """Each service TTFT minus the median direct TTFT of the same round (measured
    moments apart), so a hiccup of the machine in one round is not charged to anyone."""
    rounds: dict[int, list[float]] = {}
    for t in direct:
        rounds.setdefault(t.round, []).append(t.sample.ttft)
    base = {r: median(v) for r, v in rounds.items()}
    return [t.sample.ttft - base[t.round] for t in service]


def ttft_rows(samples: dict[str, list[Timed]]) -> tuple[list[list[Any]], dict[str, Any]]:
    rows, out = [], {}
    for name in [n for n in ("direct", "proxy", "parley", "base") if n in samples]:
        ttft = [t.sample.ttft for t in samples[name]]
        added = added_latency(samples[name], samples["direct"])
        fig = {
            "n": len(ttft),
            "p50": percentile(ttft, 50),
            "p99": percentile(ttft, 99),
            "added_p50": percentile(added, 50),
            "added_p99": percentile(added, 99),
            "turn_p50": median([t.sample.total for t in samples[name]]),
        }
        shown = [fig["p50"], fig["p99"], fig["added_p50"], fig["added_p99"], fig["turn_p50"]]
        row = [name, fig["n"], *(ms(v) for v in shown)]
        if name == "direct":
            row[4:6] = ["-", "-"]
        rows.append(row)
        out[name] = fig
    return rows, out


def report_ttft(clients: int, samples: dict[str, list[Timed]]) -> dict[str, Any]:
    section(f"time to first text delta, concurrency {clients} (ms)")
    rows, out = ttft_rows(samples)
    print(table(["system", "n", "p50", "p99", "added p50", "added p99", "turn p50"], rows))
    r50 = ratio(out["parley"]["added_p50"], out["proxy"]["added_p50"])
    r99 = ratio(out["parley"]["added_p99"], out["proxy"]["added_p99"])
    print(
        f"Parley added / proxy added: p50 {r50:.2f} {verdict(r50, TARGETS['added_p50'])}, "
        f"p99 {r99:.2f} {verdict(r99, TARGETS['added_p99'])}"
    )
    out["ratio_added_p50"], out["ratio_added_p99"] = r50, r99
    if "base" in out:
        b50 = ratio(out["parley"]["added_p50"], out["base"]["added_p50"])
        b99 = ratio(out["parley"]["added_p99"], out["base"]["added_p99"])
        print(f"Parley added / base added: p50 {b50:.2f}, p99 {b99:.2f}")
        out["ratio_base_added_p50"], out["ratio_base_added_p99"] = b50, b99
    return out


def report_truncated(truncated: list[list[str]], streams: int) -> int:
    """Parley streams that ended before `run.completed` (a correctness finding)."""
    if truncated:
        tails = {" > ".join(events[-3:]) for events in truncated}
        print(
            f"WARNING: {len(truncated)} of {streams} Parley streams ended without "
            f"run.completed; they ended with: {'; '.join(sorted(tails))}"
        )
    return len(truncated)


# --- 2. per-turn time against history size ------------------------------------------------


def make_history(size: int, words: TextFactory) -> list[str]:
    return [words.text(100, 700) for _ in range(size)]


async def size_phase(
    targets: Sequence[Target], size: int, reps: int, words: TextFactory, meter: CpuMeter
) -> tuple[dict[str, list[float]], dict[str, float]]:
    history = make_history(size, words)
    convs = {t.name: await t.conversation(history) for t in targets}
    times: dict[str, list[float]] = {t.name: [] for t in targets}
    for target in targets:  # warm-up: first read of the seeded rows, the fake's cache
        await target.wait_turn(convs[target.name], "Warm-up turn: say hello.")
    before = meter()
    for rep in range(reps):
        text = f"Question {rep}: {words.text(60, 160)}"
        for target in rotated(targets, rep):
            times[target.name].append(await target.wait_turn(convs[target.name], text))
    return times, cpu_per_turn(before, meter(), reps)


def report_sizes(
    results: dict[int, tuple[dict[str, list[float]], dict[str, float]]],
) -> list[dict[str, Any]]:
    section("per-turn time, wait mode, by history size (median ms; CPU = process CPU per turn)")
    rows, out = [], []
    for size, (times, cpu) in results.items():
        d, x, p = (median(times[n]) for n in ("direct", "proxy", "parley"))
        r = ratio(p, x)
        rows.append(
            [
                f"{size:,}",
                len(times["parley"]),
                ms(d),
                ms(x),
                ms(p),
                ms(x - d),
                ms(p - d),
                ms(cpu["proxy"]),
                ms(cpu["parley"]),
                f"{r:.2f}",
                verdict(r, TARGETS["per_turn"]),
            ]
        )
        out.append(
            {
                "history": size,
                "n": len(times["parley"]),
                "direct": d,
                "proxy": x,
                "parley": p,
                "ratio": r,
                "cpu_per_turn": cpu,
            }
        )
    headers = ["history", "n", "direct", "proxy", "parley", "proxy-direct", "parley-direct"]
    headers += ["proxy CPU", "parley CPU", "parley/proxy", "target"]
    print(table(headers, rows))
    return out


# --- 3. prompt cache ------------------------------------------------------------------


async def fake_call(fake: httpx.AsyncClient, method: str, path: str, body: Any = None) -> Any:
    response = await fake.request(method, path, json=body)
    if response.status_code != 200:
        raise BenchError(f"fake {method} {path}: {response.status_code} {response.text[:300]}")
    return response.json()


async def cache_session(
    parley: Parley, fake: httpx.AsyncClient, compaction: dict[str, Any], turns: int
) -> list[dict[str, Any]]:
    """A tool-using session: each turn Reads a workspace file, then answers. Returns the
    usage the fake reported for each model call, in order."""
    words = TextFactory(5)
    await fake_call(fake, "POST", "/_fake/reset")  # an empty queue, log and prompt cache
    await fake_call(fake, "POST", "/_fake/config", FAKE_CONFIG)
    body = {
        "system": words.text(11_000, 11_000),
        "builtin_tools": ["Read"],
        "compaction": compaction,
    }
    sid = await parley.new_session(body)
    files = {f"notes/part{i}.md": words.text(4_000, 9_000) for i in range(turns)}
    for path, content in files.items():
        put = await parley.http.put(f"/sessions/{sid}/files/{path}", content=content.encode())
        if put.status_code not in (200, 201):
            raise BenchError(f"parley: PUT file {put.status_code} {put.text}")
    for i, path in enumerate(files):
        use = {"type": "tool_use", "name": "Read", "input": {"file_path": path}}
        await fake_call(
            fake,
            "POST",
            "/_fake/script",
            [
                {"type": "message", "content": [{"type": "text", "text": "Reading it."}, use]},
                {"type": "message", "content": [{"type": "text", "text": words.text(200, 600)}]},
            ],
        )
        result = await parley.post_wait(sid, f"Turn {i + 1}: read {path} and sum it up.")
        if result["run"]["status"] != "completed":
            raise BenchError(f"parley: cache turn {i + 1} ended {result['run']}")
        if await fake_call(fake, "GET", "/_fake/queue"):
            raise BenchError(f"cache turn {i + 1} did not use both scripted replies")
    records = await fake_call(fake, "GET", "/_fake/requests")
    usages = [r["usage"] for r in records if r["path"] == "/v1/messages" and r["usage"]]
    if len(usages) != 2 * turns:
        raise BenchError(f"expected {2 * turns} model calls, the fake answered {len(usages)}")
    return list(usages)


def cache_figures(usages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    later = usages[2:]  # turns 2.. (each turn is two model calls)
    read = sum(u["cache_read_input_tokens"] for u in later)
    created = sum(u["cache_creation_input_tokens"] for u in later)
    plain = sum(u["input_tokens"] for u in later)
    total = read + created + plain
    shares = [
        u["cache_read_input_tokens"]
        / max(
            1,
            sum(
                u[k]
                for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
            ),
        )
        for u in later
    ]
    return {
        "calls": len(later),
        "input": total,
        "cache_read": read,
        "cache_creation": created,
        "uncached": plain,
        "share": ratio(read, total),
        "worst_call": min(shares, default=0),
    }


def report_cache(rows_in: dict[str, dict[str, Any]], turns: int) -> None:
    section(f"prompt cache, {turns}-turn Read-then-answer session: turns 2..{turns}")
    rows = []
    for label, f in rows_in.items():
        target = verdict(f["share"], TARGETS["cache_share"], at_least=True)
        rows.append(
            [
                label,
                f["calls"],
                f"{f['input']:,}",
                f"{f['cache_read']:,}",
                f"{f['cache_creation']:,}",
                f"{f['uncached']:,}",
                f"{f['share']:.1%}",
                f"{f['worst_call']:.1%}",
                target if label.startswith("no compaction") else "-",
            ]
        )
    print(
        table(
            [
                "session",
                "calls",
                "input tokens",
                "cache read",
                "cache write",
                "uncached",
                "read share",
                "worst call",
                "target",
            ],
            rows,
        )
    )


# --- 4. CPU per streamed delta ----------------------------------------------------------


async def streaming_round(
    target: Parley | Proxy, runs: int, text: str, meter: CpuMeter
) -> tuple[float, int]:
    """`runs` replies streamed at once, each one delta per character at 20 a second: the
    service's process CPU over the round and the text deltas its clients received."""
    convs = [await target.conversation(()) for _ in range(runs)]
    before = meter()[target.name]
    body = {"content": text, "stream": True}
    streams = await asyncio.gather(
        *(sse_turn(target.http, f"/sessions/{sid}/messages", body) for sid in convs)
    )
    cpu = meter()[target.name] - before
    return cpu, sum(s.events.count("text.delta") for s in streams)


def report_streaming(figures: dict[str, tuple[float, int]], runs: int) -> dict[str, Any]:
    section(f"process CPU per streamed text delta, {runs} concurrent replies at 20 deltas/s")
    rows, out = [], {}
    for name, (cpu, deltas) in figures.items():
        per = cpu / max(deltas, 1)
        rows.append([name, f"{deltas:,}", f"{cpu:.2f}", f"{per * 1e6:.0f}"])
        out[name] = {"cpu_seconds": cpu, "deltas": deltas, "cpu_per_delta": per}
    print(table(["system", "deltas", "CPU s", "CPU us per delta"], rows))
    r = ratio(out["parley"]["cpu_per_delta"], out["proxy"]["cpu_per_delta"])
    print(f"Parley / proxy CPU per delta: {r:.2f} {verdict(r, TARGETS['cpu_per_delta'])}")
    print("(whole-process CPU over the round, so each turn's fixed cost is included)")
    out["ratio"] = r
    return out


# --- 5. idle followers --------------------------------------------------------------------


async def follow(url: str, path: str) -> asyncio.StreamWriter:
    """An SSE follower that reads the response head and then nothing: an idle browser tab.
    Raw HTTP/1.1, so thousands of them cost the benchmark little."""
    parts = httpx.URL(url)
    reader, writer = await asyncio.open_connection(parts.host, parts.port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {parts.host}\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {API_KEY}\r\n\r\n".encode()
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        raise BenchError(f"follower of {path}: {status!r}")
    return writer


async def probe_ttft(parley: Parley, turns: int, words: TextFactory) -> float:
    sid = await parley.conversation(())
    samples = []
    for i in range(turns):
        sample = await parley.stream_turn(sid, f"Probe {i}: {words.text(20, 40)}")
        if sample is not None:
            samples.append(sample.ttft)
    return median(samples)


# --- running it -------------------------------------------------------------------------


@dataclass
class Bench:
    plan: Plan
    direct: Direct
    proxy: Proxy
    parley: Parley
    fake: httpx.AsyncClient
    children: dict[str, Child]
    base: Parley | None = None  # another checkout's Parley (`--base`), phase 1 only
    results: dict[str, Any] = field(default_factory=dict)

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(child.popen.pid) for name, child in self.children.items()}

    @property
    def targets(self) -> list[Target]:
        return [self.direct, self.proxy, self.parley]

    async def ttft(self) -> None:
        words = TextFactory(3)
        plan = self.plan
        targets = [*self.targets, *([self.base] if self.base else [])]
        await ttft_phase(targets, 1, plan.warmup_rounds, words)  # warm-up, discarded
        await ttft_phase(targets, plan.clients, plan.clients, words)
        for clients, turns in ((1, plan.c1_turns), (plan.clients, plan.c10_turns)):
            self.parley.truncated.clear()
            before = self.cpu()
            samples = await ttft_phase(targets, clients, turns, words)
            out = report_ttft(clients, samples)
            out["cpu_per_turn"] = cpu_per_turn(
                before, self.cpu(), len(samples["proxy"]), len(targets)
            )
            print(cpu_line(out["cpu_per_turn"]))
            out["parley_truncated_streams"] = report_truncated(
                self.parley.truncated, len(samples["parley"])
            )
            if self.parley.truncated:
                print(f"--- parley log (tail) ---\n{self.children['parley'].tail(40)}\n---")
            self.results[f"ttft_c{clients}"] = out

    async def sizes(self) -> None:
        words = TextFactory(4)
        self.parley.session_body = {"compaction": NO_COMPACTION}
        measured = {}
        for size, reps in self.plan.sizes.items():
            measured[size] = await size_phase(self.targets, size, reps, words, self.cpu)
        self.results["per_turn"] = report_sizes(measured)

    async def cache(self) -> None:
        turns = self.plan.cache_turns
        variants = {"no compaction (auto, micro off)": NO_COMPACTION, "default settings": {}}
        figures = {}
        for label, compaction in variants.items():
            usages = await cache_session(self.parley, self.fake, compaction, turns)
            figures[label] = cache_figures(usages)
        report_cache(figures, turns)
        self.results["cache"] = figures

    async def streaming(self) -> None:
        plan = self.plan
        await fake_call(self.fake, "POST", "/_fake/config", STREAMING_CONFIG)
        text = "Stream this back one character at a time. " * 2  # the reply echoes 80 chars
        totals = {"proxy": (0.0, 0), "parley": (0.0, 0)}
        try:
            for r in range(plan.streaming_rounds):
                for target in rotated([self.proxy, self.parley], r):
                    cpu, deltas = await streaming_round(target, plan.streaming_runs, text, self.cpu)
                    was = totals[target.name]
                    totals[target.name] = (was[0] + cpu, was[1] + deltas)
        finally:
            await fake_call(self.fake, "POST", "/_fake/config", FAKE_CONFIG | {"chunk_delay": 0})
        self.results["streaming"] = report_streaming(totals, plan.streaming_runs)

    async def followers(self) -> None:
        """Idle SSE followers held by one Parley process: its memory, and a probe turn's
        time to first delta beside the same probe with no followers."""
        plan, parley, words = self.plan, self.parley, TextFactory(6)
        pid = self.children["parley"].popen.pid
        idle_ttft = await probe_ttft(parley, plan.probe_turns, words)
        idle_rss = rss_bytes(pid)
        slow = {"type": "message", "content": [{"type": "text", "text": "late"}], "delay": 600}
        await fake_call(self.fake, "POST", "/_fake/script", [slow] * plan.followed_runs)
        runs = []
        for _ in range(plan.followed_runs):
            sid = await parley.conversation(())
            body = {"content": "Take your time.", "background": True}
            response = await parley.http.post(f"/sessions/{sid}/messages", json=body)
            if response.status_code != 202:
                raise BenchError(f"parley: background turn {response.status_code}")
            runs.append((sid, response.json()["id"]))
        writers: list[asyncio.StreamWriter] = []
        try:
            for i in range(plan.followers):
                sid, rid = runs[i % len(runs)]
                writers.append(await follow(parley.http_url, f"/sessions/{sid}/runs/{rid}/events"))
            await asyncio.sleep(2)  # let the process settle with all of them attached
            busy_rss = rss_bytes(pid)
            busy_ttft = await probe_ttft(parley, plan.probe_turns, words)
        finally:
            for writer in writers:
                writer.close()
            for sid, rid in runs:
                await parley.http.post(f"/sessions/{sid}/runs/{rid}/cancel")
            await fake_call(self.fake, "POST", "/_fake/reset")
            await fake_call(self.fake, "POST", "/_fake/config", FAKE_CONFIG)
        section(f"{plan.followers:,} idle followers of {plan.followed_runs} runs, one process")
        r = ratio(busy_ttft, idle_ttft)
        rows = [
            ["Parley RSS", f"{idle_rss / 2**20:.0f} MiB", f"{busy_rss / 2**20:.0f} MiB"],
            ["probe time to first delta p50", f"{ms(idle_ttft)} ms", f"{ms(busy_ttft)} ms"],
        ]
        print(table(["", "no followers", "with followers"], rows))
        print(
            f"RSS with followers {busy_rss / 2**20:.0f} MiB "
            f"{'PASS' if busy_rss <= TARGETS['followers_rss'] else 'MISS'} (<= 512 MiB); "
            f"probe TTFT ratio {r:.2f} {verdict(r, TARGETS['followers_ttft'])}"
        )
        self.results["followers"] = {
            "followers": plan.followers,
            "idle_rss": idle_rss,
            "busy_rss": busy_rss,
            "idle_ttft": idle_ttft,
            "busy_ttft": busy_ttft,
            "ratio": r,
        }


async def start_children(
    stack: AsyncExitStack, log_dir: Path, parley_url: str, proxy_dsn: str, profile: Path | None
) -> tuple[Child, Child, Child]:
    fake = await start_fake(log_dir, FAKE_CONFIG)
    stack.callback(fake.stop)
    env = parley_env(plain_dsn(parley_url), fake.url, API_KEY)
    parley, proxy = await asyncio.gather(
        start_parley(log_dir, env, profile=profile),
        start_proxy(log_dir, proxy_dsn, fake.url, MODEL),
    )
    stack.callback(parley.stop)
    stack.callback(proxy.stop)
    return fake, parley, proxy


async def start_base(
    stack: AsyncExitStack, log_dir: Path, checkout: Path, fake: Child
) -> tuple[Child, Parley]:
    """Parley from another checkout, on a scratch database of its own (which its `serve`
    migrates with its own migrations)."""
    url = await stack.enter_async_context(scratch_database(PARLEY_DB + "_base"))
    env = parley_env(plain_dsn(url), fake.url, API_KEY)
    child = await start_parley(log_dir, env, checkout=checkout, name="base")
    stack.callback(child.stop)
    target = Parley(child.url, url, {})
    target.name = "base"
    stack.push_async_callback(target.aclose)
    return child, target


async def run(
    plan: Plan, phases: set[str], profile: Path | None, save: bool, base: Path | None = None
) -> int:
    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        parley_url = await stack.enter_async_context(scratch_database(PARLEY_DB))
        proxy_url = await stack.enter_async_context(scratch_database(PROXY_DB))
        engine = make_engine(Settings(database_url=parley_url, model_provider="offline"))
        await upgrade(engine)
        await engine.dispose()
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-turns-")))
        fake, parley_child, proxy_child = await start_children(
            stack, log_dir, parley_url, plain_dsn(proxy_url), profile
        )
        children = {"fake": fake, "parley": parley_child, "proxy": proxy_child}
        base_target = None
        if base is not None:
            children["base"], base_target = await start_base(stack, log_dir, base, fake)
        bench = Bench(
            plan,
            Direct(fake.url),
            Proxy(proxy_child.url, plain_dsn(proxy_url)),
            Parley(parley_child.url, parley_url, {}),
            httpx.AsyncClient(base_url=fake.url, timeout=60),
            children,
            base_target,
        )
        for closer in (bench.direct, bench.proxy, bench.parley):
            stack.push_async_callback(closer.aclose)
        stack.push_async_callback(bench.fake.aclose)
        print(f"fake {fake.url}, parley {parley_child.url}, proxy {proxy_child.url}", flush=True)
        try:
            for phase in PHASES:
                if phase in phases:
                    await getattr(bench, phase)()
        except Exception:
            for child in children.values():
                print(f"--- {child.name} log (tail) ---\n{child.tail()}")
            raise
        print(f"\ntotal {time.perf_counter() - started:.0f}s")
        if save:
            print(f"results: {save_results('turns', bench.results)}")
        return exit_code(bench.results)


PHASES = ("ttft", "sizes", "cache", "streaming", "followers")


def exit_code(results: dict[str, Any]) -> int:
    ok = all(
        r["ratio_added_p50"] <= TARGETS["added_p50"]
        and r["ratio_added_p99"] <= TARGETS["added_p99"]
        for key, r in results.items()
        if key.startswith("ttft_")
    )
    ok = ok and all(r["ratio"] <= TARGETS["per_turn"] for r in results.get("per_turn", []))
    cache = results.get("cache", {}).get("no compaction (auto, micro off)")
    ok = ok and (cache is None or cache["share"] >= TARGETS["cache_share"])
    streaming = results.get("streaming")
    ok = ok and (streaming is None or streaming["ratio"] <= TARGETS["cpu_per_delta"])
    followers = results.get("followers")
    ok = ok and (
        followers is None
        or (
            followers["busy_rss"] <= TARGETS["followers_rss"]
            and followers["ratio"] <= TARGETS["followers_ttft"]
        )
    )
    return 0 if ok else 1


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench turns",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--only", default=",".join(PHASES), help="phases to run")
    parser.add_argument("--profile-parley", type=Path, help="run Parley under cProfile, to FILE")
    parser.add_argument("--no-save", action="store_true", help="no JSON in bench/results/")
    parser.add_argument(
        "--base",
        type=Path,
        help="another checkout of Parley, run beside this one in phase 1 (same interpreter)",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    phases = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = phases - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phase(s): {sorted(unknown)}")
    plan = QUICK if args.quick else FULL
    profile = args.profile_parley.resolve() if args.profile_parley else None
    base = args.base.resolve() if args.base else None
    save = not args.no_save and not args.quick
    code = asyncio.run(run(plan, phases, profile, save=save, base=base))
    return 0 if args.quick else code
