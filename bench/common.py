"""What the benchmarks share: scratch databases, statistics, tables, text, results."""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from app.config import normalize_database_url
from app.conversation.records import MessageRecord, new_message

DEFAULT_SERVER = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Real transcripts for the workloads: a folder laid out as the public corpus it was taken
# from (entireio-cli/<shard>/<id>/<n>/full.jsonl, vscode-copilot-chat/fixtures/*.jsonl, ...).
TRANSCRIPTS_ENV = "PARLEY_TRANSCRIPTS"


def transcripts_folder(given: Path | None) -> Path:
    """--data, else the folder PARLEY_TRANSCRIPTS names; exits with a hint when neither is set."""
    folder = given or (
        Path(os.environ[TRANSCRIPTS_ENV]) if os.environ.get(TRANSCRIPTS_ENV) else None
    )
    if folder is None or not folder.is_dir():
        raise SystemExit(f"no transcripts folder: pass --data DIR or set {TRANSCRIPTS_ENV}")
    return folder.resolve()


# --- scratch databases -----------------------------------------------------------------


def server_url() -> str:
    """The Postgres server to make scratch databases on (BENCH_DATABASE_URL overrides)."""
    return normalize_database_url(os.environ.get("BENCH_DATABASE_URL", DEFAULT_SERVER))


def database_url(name: str) -> str:
    """The SQLAlchemy (asyncpg) URL of database `name` on the benchmark server."""
    url = make_url(server_url()).set(database=name)
    return url.render_as_string(hide_password=False)


def plain_dsn(url: str) -> str:
    """`postgresql://...` for asyncpg and for DATABASE_URL of a child process."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _admin(sql: str) -> None:
    engine = create_async_engine(server_url(), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


async def drop_database(name: str) -> None:
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def scratch_database(name: str, *, keep: bool = False) -> AsyncIterator[str]:
    """A fresh database `name` (an old one is dropped first), dropped again at the end
    unless `keep`. Yields its SQLAlchemy URL."""
    await drop_database(name)
    await _admin(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(name)
    finally:
        if not keep:
            await drop_database(name)


# --- statistics ------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def verdict(value: float, target: float, *, at_least: bool = False) -> str:
    ok = value >= target if at_least else value <= target
    sign = ">=" if at_least else "<="
    return f"{'PASS' if ok else 'MISS'} ({sign} {target:g})"


class Timer:
    """`with Timer() as t: ...` then `t.seconds`."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


# --- output ----------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (first column left-aligned, the others right)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def section(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


def save_results(name: str, data: dict[str, Any]) -> Path:
    """Write `data` as JSON to bench/results/NAME-TIMESTAMP.json (gitignored)."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


# --- realistic text --------------------------------------------------------------------

_WORD_TEXT = (
    "the a of to and in is that for it with as on this be are by from or an at not "
    "function value request session message chain database query index table row column "
    "server client stream event token model cache prompt context summary branch parent "
    "handler error retry timeout config setting default update insert select result "
    "test case check build deploy release version module package import export file path "
    "line number string list dict object class method return raise await async loop task "
    "user assistant tool call input output read write edit grep glob pattern match search "
    "should would could might will can must need want make take give find keep move "
    "first last next previous new old small large fast slow simple clear exact careful "
    "because when while after before since until unless although however therefore"
)
_WORDS = _WORD_TEXT.split(" ")
_CODE = (
    "def load(path: str) -> bytes:\n    with open(path, 'rb') as f:\n        return f.read()\n",
    "SELECT uuid, parent_uuid FROM messages WHERE session_id = $1 ORDER BY seq;\n",
    "for item in items:\n    if item.done:\n        continue\n    queue.append(item)\n",
    "const res = await fetch(url, { method: 'POST', body: JSON.stringify(payload) });\n",
)


class TextFactory:
    """Deterministic English-like prose with the odd code snippet, of a chosen length."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)

    def sentence(self) -> str:
        words = self.rng.choices(_WORDS, k=self.rng.randint(6, 22))
        return " ".join(words).capitalize() + self.rng.choice(".....?!:")

    def text(self, min_chars: int, max_chars: int) -> str:
        target = self.rng.randint(min_chars, max_chars)
        parts: list[str] = []
        size = 0
        while size < target:
            piece = self.rng.choice(_CODE) if self.rng.random() < 0.06 else self.sentence()
            parts.append(piece)
            size += len(piece) + 1
            if self.rng.random() < 0.15:
                parts.append("\n\n")
        return " ".join(parts)[:target].strip() or "ok"


# --- seeding ------------------------------------------------------------------------


def records_of(session_id: uuid.UUID, specs: Sequence[dict[str, Any]]) -> list[MessageRecord]:
    """The specs as messages to append (each names its parent)."""
    return [
        new_message(
            session_id=session_id,
            uuid_=spec["message_uuid"],
            parent_uuid=spec["parent_uuid"],
            logical_parent_uuid=spec.get("logical_parent_uuid"),
            type=spec["type"],
            subtype=spec.get("subtype"),
            role=spec["role"],
            content=spec["content"],
            model=spec.get("model"),
            stop_reason=spec.get("stop_reason"),
            metadata=spec.get("meta"),
        )
        for spec in specs
    ]
