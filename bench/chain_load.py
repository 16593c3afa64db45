"""Loading a chain must cost O(chain length), independent of the size of the table.

Two scratch databases receive the same first 10,000 message rows: a measured session
whose 1,000-message chain crosses three compact boundaries (plus side branches), and
filler sessions. The second database is then grown to 1,000,000 rows with more filler
sessions (branches, boundaries, realistic content of ~200-2,000 characters, rows of
concurrent sessions interleaved in the heap as they would be in production) and one
session with a 10,000-message chain. Rows are bulk-loaded with COPY.

`store.chain(db, head, full=False|True)` is then timed on both databases in one
interleaved loop (small, large, small, large, ...: warm, median of the repetitions),
so the ratio large/small is measured under the same machine load. EXPLAIN (ANALYZE)
of the captured SQL shows how Postgres walks the chain.

    uv run python -m bench chain_load [--quick] [--rows N] [--reps N] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.config import Settings
from app.context.tokens import estimate_content
from app.conversation import store
from app.db import make_engine
from app.migrate import upgrade
from bench.common import (
    TextFactory,
    Timer,
    median,
    ms,
    plain_dsn,
    ratio,
    save_results,
    scratch_database,
    section,
    table,
    verdict,
)

SMALL_DB = "parley_bench_chain_small"
LARGE_DB = "parley_bench_chain_large"
TARGET_RATIO = 1.5
MODEL = "claude-sonnet-5-5"
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
WAVE_SESSIONS = 64  # sessions generated (and interleaved in the heap) together

MESSAGE_COLUMNS = (
    "uuid",
    "session_id",
    "seq",
    "parent_uuid",
    "logical_parent_uuid",
    "type",
    "subtype",
    "role",
    "content",
    "model",
    "stop_reason",
    "usage",
    "is_meta",
    "token_estimate",
    "copied_from",
    "run_id",
    "metadata",
    "created_at",
)
SESSION_COLUMNS = (
    "id",
    "tenant",
    "title",
    "model",
    "system",
    "tools",
    "builtin_tools",
    "max_tokens",
    "thinking",
    "metadata",
    "compaction",
    "head_uuid",
    "message_seq",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "compact_failures",
    "last_request_at",
    "created_at",
    "updated_at",
)
PLAN_MARKERS = (
    "Recursive Union",
    "CTE Scan",
    "WorkTable Scan",
    "Index Scan",
    "Index Only Scan",
    "Seq Scan",
    "Bitmap",
    "Hash Join",
    "Merge Join",
    "Nested Loop",
    "Sort",
    "Planning Time",
    "Execution Time",
)


@dataclass(frozen=True)
class Sizes:
    small_rows: int
    large_rows: int
    chain: int  # messages on the measured chain (boundary rows included)
    boundaries: tuple[int, ...]  # positions of compact boundaries on it
    long_chain: int
    long_boundaries: tuple[int, ...]
    reps: int
    long_reps: int


FULL = Sizes(10_000, 1_000_000, 1_000, (100, 200, 300), 10_000, (500,), 21, 7)
QUICK = Sizes(2_000, 40_000, 500, (50, 100, 150), 5_000, (250,), 7, 3)


# --- generating rows -------------------------------------------------------------------


@dataclass(frozen=True)
class Content:
    json: str
    tokens: int


class ContentPool:
    """Pre-encoded message contents, picked at random (a pool keeps 1M rows cheap)."""

    def __init__(self, seed: int = 7, size: int = 1500) -> None:
        words = TextFactory(seed)
        self.user = [self._text(words.text(200, 1200)) for _ in range(size)]
        self.assistant = [self._text(words.text(200, 2000)) for _ in range(size)]
        self.tool_pairs = [self._tool_pair(words, i) for i in range(size // 3)]

    @staticmethod
    def _encode(blocks: list[dict[str, Any]]) -> Content:
        return Content(json.dumps(blocks, ensure_ascii=False), estimate_content(blocks))

    def _text(self, body: str) -> Content:
        return self._encode([{"type": "text", "text": body}])

    def _tool_pair(self, words: TextFactory, i: int) -> tuple[Content, Content]:
        tool_id = f"toolu_bench{i:06d}"
        use: list[dict[str, Any]] = [
            {"type": "text", "text": words.text(40, 200)},
            {
                "type": "tool_use",
                "id": tool_id,
                "name": "Read",
                "input": {"file_path": f"src/module_{i}.py"},
            },
        ]
        result = [{"type": "tool_result", "tool_use_id": tool_id, "content": words.text(300, 2000)}]
        return self._encode(use), self._encode(result)


@dataclass
class SessionRows:
    """The rows of one generated session, each with the time it was written."""

    session_id: uuid.UUID
    rows: list[tuple[float, tuple[Any, ...]]] = field(default_factory=list)
    head: uuid.UUID | None = None
    api_rows: int = 0  # rows of chain_rows(head, full=False)
    full_rows: int = 0  # rows of chain_rows(head, full=True)


class RowMaker:
    """Sessions of messages: a main chain (with compact boundaries) and side branches."""

    def __init__(self, pool: ContentPool, seed: int) -> None:
        self.pool = pool
        self.rng = random.Random(seed)

    def session(
        self,
        length: int,
        *,
        boundaries: Sequence[int] = (),
        branch_rows: int = 0,
        start: float = 0.0,
    ) -> SessionRows:
        """A chain of `length` rows (boundary rows at `boundaries`) and `branch_rows`
        more rows in side branches forked from random chain nodes."""
        out = SessionRows(uuid.uuid4())
        step = self.rng.uniform(5.0, 120.0)  # seconds between messages of this session
        chain = self._chain(out, length, set(boundaries), start, step)
        while branch_rows > 0:
            size = min(branch_rows, self.rng.randint(2, 20))
            fork = self.rng.randrange(len(chain))
            self._branch(out, chain[fork], size, start + fork * step + step / 2, step)
            branch_rows -= size
        out.head = chain[-1]
        out.api_rows = length - max((b for b in boundaries if b < length), default=0)
        out.full_rows = length
        return out

    def _chain(
        self, out: SessionRows, length: int, boundaries: set[int], start: float, step: float
    ) -> list[uuid.UUID]:
        chain: list[uuid.UUID] = []
        parent: uuid.UUID | None = None
        pending: Content | None = None
        role = "user"
        for i in range(length):
            at = start + i * step
            if i in boundaries:
                parent = self._boundary(out, parent, at)
                role = "user"
            else:
                content, pending = self._content(role, pending)
                parent = self._message(out, parent, role, content, at)
                role = "assistant" if role == "user" else "user"
            chain.append(parent)
        return chain

    def _branch(
        self, out: SessionRows, fork: uuid.UUID, size: int, start: float, step: float
    ) -> None:
        parent = fork
        role = self.rng.choice(("user", "assistant"))
        for i in range(size):
            content, _ = self._content(role, None)
            parent = self._message(out, parent, role, content, start + i * step / 40)
            role = "assistant" if role == "user" else "user"

    def _content(self, role: str, pending: Content | None) -> tuple[Content, Content | None]:
        """This message's content and the tool result the next one must carry."""
        if role == "user":
            return (pending or self.rng.choice(self.pool.user)), None
        if self.rng.random() < 0.3:
            use, result = self.rng.choice(self.pool.tool_pairs)
            return use, result
        return self.rng.choice(self.pool.assistant), None

    def _message(
        self,
        out: SessionRows,
        parent: uuid.UUID | None,
        role: str,
        content: Content,
        at: float,
    ) -> uuid.UUID:
        assistant = role == "assistant"
        usage = '{"input_tokens": 1200, "output_tokens": 300}' if assistant else None
        return self._add(
            out,
            at,
            parent=parent,
            logical_parent=None,
            type_=role,
            subtype=None,
            role=role,
            content=content,
            model=MODEL if assistant else None,
            stop_reason="end_turn" if assistant else None,
            usage=usage,
        )

    def _boundary(self, out: SessionRows, covered: uuid.UUID | None, at: float) -> uuid.UUID:
        return self._add(
            out,
            at,
            parent=None,
            logical_parent=covered,
            type_="system",
            subtype="compact_boundary",
            role=None,
            content=Content("[]", 0),
            model=None,
            stop_reason=None,
            usage=None,
        )

    def _add(
        self,
        out: SessionRows,
        at: float,
        *,
        parent: uuid.UUID | None,
        logical_parent: uuid.UUID | None,
        type_: str,
        subtype: str | None,
        role: str | None,
        content: Content,
        model: str | None,
        stop_reason: str | None,
        usage: str | None,
    ) -> uuid.UUID:
        row_id = uuid.uuid4()
        seq = len(out.rows) + 1
        created = EPOCH + timedelta(seconds=at)
        row = (
            row_id,
            out.session_id,
            seq,
            parent,
            logical_parent,
            type_,
            subtype,
            role,
            content.json,
            model,
            stop_reason,
            usage,
            False,
            content.tokens,
            None,
            None,
            None,
            created,
        )
        out.rows.append((at, row))
        return row_id


def session_record(rows: SessionRows) -> tuple[Any, ...]:
    created = EPOCH + timedelta(seconds=rows.rows[0][0]) if rows.rows else EPOCH
    seq = len(rows.rows)
    return (
        rows.session_id,
        "bench",
        None,
        MODEL,
        None,
        "[]",
        "[]",
        None,
        None,
        "{}",
        "{}",
        rows.head,
        seq,
        0,
        0,
        0,
        0,
        0,
        None,
        created,
        created,
    )


def filler_lengths(rng: random.Random, total: int) -> Iterator[int]:
    """Session lengths (median ~90 messages, a few thousand at most) adding up to `total`."""
    left = total
    while left > 0:
        length = int(min(3000, max(4, rng.lognormvariate(4.5, 1.0))))
        length = min(length, left)
        left -= length
        yield length


def filler_session(maker: RowMaker, length: int, horizon: float) -> SessionRows:
    """One filler session of exactly `length` rows; one in five has side branches."""
    rng = maker.rng
    branched = length >= 20 and rng.random() < 0.2
    branch_rows = rng.randint(2, min(40, length // 5)) if branched else 0
    chain = length - branch_rows
    boundaries = tuple(range(300, chain - 20, rng.randint(250, 400))) if chain > 400 else ()
    return maker.session(
        chain, boundaries=boundaries, branch_rows=branch_rows, start=rng.uniform(0, horizon)
    )


def filler(maker: RowMaker, total: int) -> Iterator[SessionRows]:
    for length in filler_lengths(maker.rng, total):
        yield filler_session(maker, length, horizon=86_400.0)


# --- loading ---------------------------------------------------------------------------


@asynccontextmanager
async def loader(url: str) -> AsyncIterator[asyncpg.Connection]:
    """A raw connection for COPY; foreign-key triggers off while loading (the generator
    writes parents first anyway), commits unsynced."""
    conn = await asyncpg.connect(plain_dsn(url))
    try:
        await conn.execute("SET session_replication_role = replica")
        await conn.execute("SET synchronous_commit = off")
        yield conn
    finally:
        await conn.close()


def interleave(rows: list[Any], extra: Sequence[Any]) -> list[Any]:
    """`rows` with `extra` spread evenly among them (each list keeps its order)."""
    if not extra:
        return rows
    out: list[Any] = []
    step = len(rows) / len(extra)
    start = 0
    for j, row in enumerate(extra):
        stop = int((j + 0.5) * step)
        out.extend(rows[start:stop])
        out.append(row)
        start = stop
    out.extend(rows[start:])
    return out


async def copy_sessions(
    conn: asyncpg.Connection, sessions: Sequence[SessionRows], extra: Sequence[Any] = ()
) -> int:
    """COPY sessions (and `extra` message rows of a session copied earlier)."""
    if sessions:
        records = [session_record(s) for s in sessions]
        await conn.copy_records_to_table("agent_sessions", records=records, columns=SESSION_COLUMNS)
    timed = sorted((r for s in sessions for r in s.rows), key=lambda item: item[0])
    rows = interleave([row for _, row in timed], extra)
    await conn.copy_records_to_table("messages", records=rows, columns=MESSAGE_COLUMNS)
    return len(rows)


async def copy_waves(
    conn: asyncpg.Connection, sessions: Sequence[SessionRows], spread: SessionRows | None = None
) -> int:
    """COPY sessions in waves of WAVE_SESSIONS whose rows are interleaved by write time,
    as concurrent sessions write them. The rows of `spread` (a long-lived session) are
    split over all the waves, so its chain is scattered over the whole table."""
    waves = [sessions[i : i + WAVE_SESSIONS] for i in range(0, len(sessions), WAVE_SESSIONS)]
    spread_rows = [row for _, row in spread.rows] if spread else []
    per_wave = -(-len(spread_rows) // max(len(waves), 1))
    written = 0
    if spread is not None:
        await conn.copy_records_to_table(
            "agent_sessions", records=[session_record(spread)], columns=SESSION_COLUMNS
        )
    for i, wave in enumerate(waves or [[]]):
        extra = spread_rows[i * per_wave : (i + 1) * per_wave]
        written += await copy_sessions(conn, wave, extra)
    return written


async def analyze(url: str) -> None:
    conn = await asyncpg.connect(plain_dsn(url))
    try:
        await conn.execute("VACUUM ANALYZE messages")
        await conn.execute("VACUUM ANALYZE agent_sessions")
    finally:
        await conn.close()


async def describe(url: str) -> dict[str, Any]:
    """Rows, sessions, average content size and on-disk size of the messages table."""
    conn = await asyncpg.connect(plain_dsn(url))
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS rows, count(DISTINCT session_id) AS sessions,"
            " avg(octet_length(content::text)) FILTER (WHERE role IS NOT NULL) AS avg_chars,"
            " pg_total_relation_size('messages') AS bytes FROM messages"
        )
        assert row is not None
        return {
            "rows": int(row["rows"]),
            "sessions": int(row["sessions"]),
            "avg_content_chars": round(float(row["avg_chars"] or 0)),
            "table_mb": round(int(row["bytes"]) / 2**20),
        }
    finally:
        await conn.close()


@dataclass
class Dataset:
    measured: SessionRows
    long: SessionRows
    small_rows: int = 0
    large_rows: int = 0
    load_seconds: dict[str, float] = field(default_factory=dict)
    tables: dict[str, Any] = field(default_factory=dict)


async def build(small_url: str, large_url: str, sizes: Sizes) -> Dataset:
    pool = ContentPool()
    measured = RowMaker(pool, seed=11).session(
        sizes.chain, boundaries=sizes.boundaries, branch_rows=40, start=3600.0
    )
    seed = [measured, *filler(RowMaker(pool, seed=12), sizes.small_rows - len(measured.rows))]
    data = Dataset(measured, measured)
    for url in (small_url, large_url):  # the very same first rows in both databases
        with Timer() as t:
            async with loader(url) as conn:
                await copy_waves(conn, seed)
        print(f"loaded {sizes.small_rows:,} rows into {url.rsplit('/', 1)[-1]} in {t.seconds:.1f}s")
    data.long = RowMaker(pool, seed=13).session(
        sizes.long_chain, boundaries=sizes.long_boundaries, start=7200.0
    )
    grow = sizes.large_rows - sizes.small_rows
    with Timer() as t:
        async with loader(large_url) as conn:
            rest = list(filler(RowMaker(pool, seed=14), grow - len(data.long.rows)))
            await copy_waves(conn, rest, spread=data.long)
    data.load_seconds["grow"] = t.seconds
    print(f"grew {LARGE_DB} by {grow:,} rows (COPY) in {t.seconds:.1f}s", flush=True)
    with Timer() as t:
        await asyncio.gather(analyze(small_url), analyze(large_url))
    data.load_seconds["vacuum_analyze"] = t.seconds
    print(f"VACUUM ANALYZE in {t.seconds:.1f}s", flush=True)
    small, large = await asyncio.gather(describe(small_url), describe(large_url))
    data.small_rows, data.large_rows = small["rows"], large["rows"]
    data.tables = {"small": small, "large": large}
    for name, info in data.tables.items():
        print(
            f"{name}: {info['rows']:,} messages in {info['sessions']:,} sessions, "
            f"content {info['avg_content_chars']:,} chars on average, {info['table_mb']:,} MB"
        )
    return data


# --- measuring -------------------------------------------------------------------------


@dataclass
class Target:
    label: str
    maker: async_sessionmaker[AsyncSession]
    head: uuid.UUID
    full: bool
    expected: int
    times: list[float] = field(default_factory=list)


async def time_chain(target: Target) -> float:
    async with target.maker() as db:
        await db.execute(text("SELECT 1"))  # checkout and BEGIN are not the chain's cost
        start = time.perf_counter()
        rows = await store.chain(db, target.head, full=target.full)
        elapsed = time.perf_counter() - start
    if len(rows) != target.expected:
        raise RuntimeError(f"{target.label}: {len(rows)} rows, expected {target.expected}")
    return elapsed


async def measure(targets: Sequence[Target], reps: int, warmup: int = 3) -> None:
    """Round-robin over the targets, so each round sees the same machine load."""
    for _ in range(warmup):
        for target in targets:
            await time_chain(target)
    for _ in range(reps):
        for target in targets:
            target.times.append(await time_chain(target))


async def explain(engine: AsyncEngine, head: uuid.UUID, *, full: bool) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the exact SQL that store.chain sends."""
    captured: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        captured.append((statement, params))

    maker = async_sessionmaker(engine, expire_on_commit=False)
    event.listen(engine.sync_engine, "before_cursor_execute", capture)
    try:
        async with maker() as db:
            await store.chain(db, head, full=full)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", capture)
    statement, params = captured[-1]
    async with engine.connect() as conn:
        result = await conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", params)
        return [str(row[0]) for row in result]


def plan_summary(lines: Sequence[str]) -> list[str]:
    keep = [line for line in lines if any(marker in line for marker in PLAN_MARKERS)]
    return [line.rstrip()[:150] for line in keep]


def plan_checks(lines: Sequence[str]) -> dict[str, bool]:
    """Whether the recursive part follows primary keys and nothing scans the table."""
    plan = "\n".join(lines)
    recursive = plan.split("Recursive Union", 1)[-1] if "Recursive Union" in plan else ""
    return {
        "recursive_union": bool(recursive),
        "pkey_index_scan_in_cte": "Index Scan using pk_messages" in recursive,
        "no_seq_scan_on_messages": "Seq Scan on messages" not in plan,
    }


def engine_for(url: str) -> AsyncEngine:
    return make_engine(Settings(database_url=url, model_provider="offline"))


# --- reporting -------------------------------------------------------------------------


def report_main(pairs: Sequence[tuple[Target, Target]], data: Dataset) -> list[dict[str, Any]]:
    section(
        f"chain_rows on a {data.measured.full_rows:,}-message chain: table of "
        f"{data.small_rows:,} vs {data.large_rows:,} rows (warm, median ms)"
    )
    rows, out = [], []
    for small, large in pairs:
        a, b = median(small.times), median(large.times)
        r = ratio(b, a)
        rows.append(
            [small.label, small.expected, ms(a), ms(b), f"{r:.2f}", verdict(r, TARGET_RATIO)]
        )
        out.append(
            {
                "view": small.label,
                "rows": small.expected,
                "small_ms": a * 1000,
                "large_ms": b * 1000,
                "ratio": r,
            }
        )
    print(
        table(
            ["view", "rows", f"{data.small_rows:,}", f"{data.large_rows:,}", "ratio", "target"],
            rows,
        )
    )
    return out


def report_long(longs: Sequence[Target], bases: Sequence[Target]) -> list[dict[str, Any]]:
    section(
        f"chain_rows on a {longs[0].expected if longs else 0:,}-message chain "
        "(large table; per-row cost vs the 1,000-message chain)"
    )
    rows, out = [], []
    for long, base in zip(longs, bases, strict=True):
        t, per_row = median(long.times), median(long.times) / long.expected
        base_row = median(base.times) / base.expected
        rows.append(
            [
                long.label,
                long.expected,
                ms(t),
                f"{per_row * 1e6:.1f}",
                f"{base_row * 1e6:.1f}",
                f"{ratio(per_row, base_row):.2f}",
            ]
        )
        out.append(
            {
                "view": long.label,
                "rows": long.expected,
                "ms": t * 1000,
                "us_per_row": per_row * 1e6,
                "us_per_row_short_chain": base_row * 1e6,
            }
        )
    short = f"us/row ({bases[-1].expected if bases else 0:,}-chain)"
    print(table(["view", "rows", "ms", "us/row", short, "per-row ratio"], rows))
    return out


def report_plan(title: str, lines: Sequence[str]) -> dict[str, Any]:
    print(f"\n-- EXPLAIN (ANALYZE, BUFFERS): {title}")
    for line in plan_summary(lines):
        print(f"   {line}")
    checks = plan_checks(lines)
    print("   checks: " + ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in checks.items()))
    return {"title": title, "summary": plan_summary(lines), "checks": checks}


# --- main ------------------------------------------------------------------------------


async def run(sizes: Sizes, *, keep: bool, save: bool) -> int:
    async with (
        scratch_database(SMALL_DB, keep=keep) as small_url,
        scratch_database(LARGE_DB, keep=keep) as large_url,
    ):
        small_engine, large_engine = engine_for(small_url), engine_for(large_url)
        try:
            await upgrade(small_engine)  # alembic is not re-entrant: one at a time
            await upgrade(large_engine)
            data = await build(small_url, large_url, sizes)
            return await measure_and_report(small_engine, large_engine, data, sizes, save)
        finally:
            await small_engine.dispose()
            await large_engine.dispose()


async def measure_and_report(
    small_engine: AsyncEngine, large_engine: AsyncEngine, data: Dataset, sizes: Sizes, save: bool
) -> int:
    small = async_sessionmaker(small_engine, expire_on_commit=False)
    large = async_sessionmaker(large_engine, expire_on_commit=False)
    m, long = data.measured, data.long
    assert m.head is not None
    assert long.head is not None
    pairs = [
        (
            Target("api (full=False)", small, m.head, False, m.api_rows),
            Target("api (full=False)", large, m.head, False, m.api_rows),
        ),
        (
            Target("full (full=True)", small, m.head, True, m.full_rows),
            Target("full (full=True)", large, m.head, True, m.full_rows),
        ),
    ]
    longs = [
        Target("api (full=False)", large, long.head, False, long.api_rows),
        Target("full (full=True)", large, long.head, True, long.full_rows),
    ]
    await measure([t for pair in pairs for t in pair], sizes.reps)
    await measure(longs, sizes.long_reps, warmup=1)
    results: dict[str, Any] = {
        "sizes": sizes.__dict__,
        "load_seconds": data.load_seconds,
        "tables": data.tables,
    }
    results["chain"] = report_main(pairs, data)
    results["long_chain"] = report_long(longs, [large for _, large in pairs])
    section("query plans")
    plans = [
        report_plan(
            f"{m.full_rows:,}-chain, api view, {data.large_rows:,} rows",
            await explain(large_engine, m.head, full=False),
        ),
        report_plan(
            f"{m.full_rows:,}-chain, full view, {data.large_rows:,} rows",
            await explain(large_engine, m.head, full=True),
        ),
        report_plan(
            f"{m.full_rows:,}-chain, full view, {data.small_rows:,} rows",
            await explain(small_engine, m.head, full=True),
        ),
        report_plan(
            f"{long.full_rows:,}-chain (scattered over the table), full view, "
            f"{data.large_rows:,} rows",
            await explain(large_engine, long.head, full=True),
        ),
    ]
    results["plans"] = plans
    if save:
        print(f"\nresults: {save_results('chain_load', results)}")
    ok = all(r["ratio"] <= TARGET_RATIO for r in results["chain"])
    ok = ok and all(all(p["checks"].values()) for p in plans)
    return 0 if ok else 1


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench chain_load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small tables, a smoke run")
    parser.add_argument("--rows", type=int, help="rows of the large table (1,000,000)")
    parser.add_argument("--reps", type=int, help="timed repetitions per case (21)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
    parser.add_argument("--no-save", action="store_true", help="no JSON in bench/results/")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    sizes = QUICK if args.quick else FULL
    if args.rows:
        sizes = Sizes(**{**sizes.__dict__, "large_rows": args.rows})
    if args.reps:
        sizes = Sizes(**{**sizes.__dict__, "reps": args.reps})
    code = asyncio.run(run(sizes, keep=args.keep, save=not args.no_save and not args.quick))
    return 0 if args.quick else code  # a smoke run checks that it runs, not the targets
