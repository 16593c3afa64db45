"""Compaction (docs/architecture.md, "Compaction"): five measurements, each runnable alone.

1. micro: tokens micro-compaction alone frees on each real Claude Code transcript at its
   largest point (the chain up to its first compact boundary, or the whole chain),
   imported through POST /sessions/import of an in-process app: `estimate_messages` of
   the api view before and after `apply_micro` at the watermark `plan_micro` reaches with
   keep_recent=5, batch_tokens=0. The same with Bash made compactable (Claude Code
   clears Bash output too; Parley does not) is shown beside it.
2. post: post-compaction size of the messages (system and tools excluded) as a share of
   a 167k threshold (target <= 25%). Real transcripts imported into a Parley process
   whose session has `threshold_tokens` 167000; compacted (POST /compact) at the first
   point where the service's own estimate (anchored on the transcript's real usage)
   passes 167k, and at each point where Claude Code itself compacted (its estimate was
   then 155k-167k). The summary is a fixed ~2,000-token answer of the fake; workspace
   files are rebuilt from the transcript's Read results, so re-attachment has real files.
3. turn: per-turn time (wait mode, zero-latency fake in its own process) of a session
   holding 10,000 messages behind compaction boundaries vs a fresh session with the same
   model view, interleaved ABAB; ratio of medians (target <= 1.2).
4. time: `compact()` in-process on ~180k estimated tokens of agent traffic (tool pairs,
   parallel calls, a clean user turn every ~30 messages), the model call answered by a
   zero-latency stub and its own duration subtracted; median of several runs (target
   <= 200 ms), for a 200k-window model (the summary request is rendered to text: the
   view does not fit beside the summary's output) and a 1M-window model (the cached
   prefix is reused), with the time of each step.
5. cache: share of input tokens read from the prompt cache over ALL requests the fake
   received (turns, summary requests, background collapse requests) in a 60-turn
   session with the default compaction settings but `threshold_tokens` 30000: each turn
   Reads one file (two in parallel every 4th turn) and answers; every 10th turn is a
   tool loop of 16 Reads that outgrows the threshold, so it auto-compacts several times
   (short turns alone never do: context collapse keeps them below it). Target >= 80%.
   Also shown: the real size of each summary request against the threshold (a
   compaction far below it was triggered by a wrong estimate).

The fake runs in its own process with a responder (`respond` below): a summary request
(it carries SUMMARY_MARKER) gets the fixed summary, a collapse request a short one, a
prompt naming files gets Read calls for them, a tool result a Read of the file its last
line names (`Next: ...`) or else a short answer, and anything else the fake's default
reply. Thinking signatures of imported transcripts are
replaced by the fake's own (it verifies them; a signature is never counted as tokens).

    uv run python -m bench compaction [--part 1,2,...] [--quick] [--no-save]
        [--data DIR] [--cache-threshold N] [--profile FILE] [--profile-parley FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import inspect
import itertools
import json
import os
import pstats
import random
import re
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select, update

from app.config import Settings
from app.context.micro import apply_micro, plan_micro
from app.context.summary_prompt import CONTINUATION_HEADER, SUMMARY_MARKER
from app.context.tokens import estimate_messages, estimate_system, estimate_tools, node_tokens
from app.context.tools import BUILTIN_TOOLS, compactable_tools
from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY, Block, Node
from app.conversation import sessions, store
from app.conversation.files import DbWorkspace
from app.conversation.views import load_view
from app.db import Database, make_engine
from app.engine import compaction
from app.engine.llm.events import MessageDone, StreamEvent
from app.engine.loop import TurnRunner
from app.engine.runtime import Runtime
from app.main import create_app
from app.migrate import upgrade
from app.models import AgentSession, Collapse, Message, MicroWatermark, Run
from app.schemas import SessionCreate
from bench.common import (
    TextFactory,
    median,
    ms,
    percentile,
    plain_dsn,
    ratio,
    save_results,
    scratch_database,
    section,
    table,
    verdict,
)
from bench.procs import Child, parley_env, spawn, start_parley

DB_NAME = "parley_bench_compaction"
API_KEY = "bench-key-0123456789abcdef"
TENANT = "bench"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL_200K = "claude-sonnet-4-5"
MODEL_1M: str = Settings.model_fields["model"].default
THRESHOLD = 167_000
TARGETS = {"post_share": 0.25, "per_turn": 1.2, "compact_seconds": 0.200, "cache_share": 0.80}
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "transcripts"
TRANSCRIPTS = ("entireio-cli/*/*/*/full.jsonl", "vscode-copilot-chat/fixtures/*.jsonl")
FAKE_CONFIG: dict[str, Any] = {"record_bodies": False, "max_context_tokens": 10_000_000}
PARTS = {1: "micro", 2: "post", 3: "turn", 4: "time", 5: "cache"}


@dataclass(frozen=True)
class Plan:
    micro_files: int | None  # transcripts for part 1 (None: all)
    post_points: int | None  # compaction points for part 2 (None: all)
    history: int  # part 3: messages behind the boundaries
    segments: int  # part 3: how many compactions they went through
    view_rounds: int  # part 3: assistant/user rounds after the last summary
    turn_reps: int
    turn_warmup: int
    compact_tokens: int  # part 4: estimated tokens of the view
    compact_runs: int
    cache_turns: int  # part 5
    cache_threshold: int


FULL = Plan(None, None, 10_000, 4, 15, 50, 3, 180_000, 15, 60, 30_000)
QUICK = Plan(3, 1, 400, 2, 15, 3, 1, 40_000, 2, 12, 20_000)


class BenchError(RuntimeError):
    pass


# --- realistic agent traffic ----------------------------------------------------------------

TOOL_WEIGHTS = {"Read": 0.30, "Bash": 0.30, "Grep": 0.20, "Edit": 0.15, "Glob": 0.05}
PACKAGES = ("api", "store", "context", "runs", "tools", "llm", "events")
BASH_TOOL: dict[str, Any] = {
    "name": "Bash",
    "description": "Run a shell command in the project and return its output.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"],
    },
}
BUILTINS = ["Read", "Write", "Edit", "Glob", "Grep"]


def numbered(text: str) -> str:
    """A file as the Read tool shows it (`     1<TAB>line`)."""
    return "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(text.splitlines(), 1))


def wrapped(text: str, width: int = 72) -> str:
    words, lines, line = text.split(" "), [], ""
    for word in words:
        if line and len(line) + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


class Traffic:
    """Deterministic Claude-Code-like traffic: a clean user turn opens ~30 messages of
    tool rounds (one call, or 2-3 in parallel; Read/Bash/Grep/Edit/Glob with results
    sized like real ones) and an answer closes it. Read results show workspace files
    (`files`), so compaction can re-attach them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = TextFactory(seed)
        self.ids = itertools.count(1)
        self.paths = [f"src/{p}/{name}.py" for p in PACKAGES for name in ("core", "util", "io")]
        self.files: dict[str, str] = {}

    def file(self, path: str) -> str:
        if path not in self.files:
            self.files[path] = wrapped(self.words.text(1_500, 12_000))
        return self.files[path]

    def call(self) -> tuple[Block, Block]:
        """One tool_use and its tool_result."""
        use_id = f"toolu_bench_{next(self.ids):08d}"
        name = self.rng.choices(list(TOOL_WEIGHTS), weights=list(TOOL_WEIGHTS.values()))[0]
        path = self.rng.choice(self.paths)
        inputs: dict[str, dict[str, Any]] = {
            "Read": {"file_path": path},
            "Bash": {"command": f"pytest -q tests/{path}", "description": "Run the tests"},
            "Grep": {"pattern": self.words.sentence()[:24], "path": "src"},
            "Edit": {"file_path": path, "old_string": "a = 1", "new_string": "a = 2"},
            "Glob": {"pattern": "src/**/*.py"},
        }
        results = {
            "Read": lambda: numbered(self.file(path)),
            "Bash": lambda: self.words.text(100, 4_000),
            "Grep": lambda: self.grep_result(),
            "Edit": lambda: f"The file {path} has been updated successfully.",
            "Glob": lambda: "\n".join(self.paths[: self.rng.randint(3, len(self.paths))]),
        }
        use = {"type": "tool_use", "id": use_id, "name": name, "input": inputs[name]}
        result = {"type": "tool_result", "tool_use_id": use_id, "content": results[name]()}
        return use, result

    def grep_result(self) -> str:
        hits = self.rng.randint(3, 30)
        lines = (f"{self.rng.choice(self.paths)}:{self.rng.randint(1, 400)}: " for _ in range(hits))
        return "\n".join(line + self.words.sentence()[:60] for line in lines)

    def round(self) -> list[tuple[str, list[Block]]]:
        calls = [
            self.call() for _ in range(1 if self.rng.random() < 0.8 else self.rng.randint(2, 3))
        ]
        said = (
            [{"type": "text", "text": self.words.text(40, 300)}] if self.rng.random() < 0.4 else []
        )
        return [("assistant", [*said, *(u for u, _ in calls)]), ("user", [r for _, r in calls])]

    def turn(self) -> list[tuple[str, list[Block]]]:
        out = [("user", [{"type": "text", "text": self.words.text(80, 600)}])]
        for _ in range(self.rng.randint(9, 19)):
            out += self.round()
        out.append(("assistant", [{"type": "text", "text": self.words.text(200, 1_500)}]))
        return out

    def stream(self) -> Iterator[tuple[str, list[Block]]]:
        while True:
            yield from self.turn()

    def messages(self, count: int) -> list[tuple[str, list[Block]]]:
        return list(itertools.islice(self.stream(), count))

    def upto(self, tokens: int) -> list[tuple[str, list[Block]]]:
        """Messages until `tokens` estimated, ending on tool results (mid tool loop,
        where auto-compaction runs)."""
        out: list[tuple[str, list[Block]]] = []
        total = 0
        for role, content in self.stream():
            out.append((role, content))
            total += node_tokens(_node(role, content))
            if total >= tokens and role == "user" and content[0].get("type") == "tool_result":
                return out
        raise AssertionError("unreachable")


def _node(role: str, content: list[Block]) -> Node:
    return Node(uuid="", type=role, role=role, content=content)


def chain_specs(
    messages: Sequence[tuple[str, list[Block]]], parent: uuid.UUID | None, model: str
) -> list[dict[str, Any]]:
    """append_many specs for messages chained one under the other."""
    specs = []
    for role, content in messages:
        node = uuid.uuid4()
        uses = any(b.get("type") == "tool_use" for b in content)
        spec: dict[str, Any] = {
            "message_uuid": node,
            "parent_uuid": parent,
            "type": role,
            "role": role,
            "content": content,
        }
        if role == "assistant":
            spec.update(model=model, stop_reason="tool_use" if uses else "end_turn")
        specs.append(spec)
        parent = node
    return specs


def summary_spec(parent: uuid.UUID | None, summary: str) -> dict[str, Any]:
    return {
        "message_uuid": uuid.uuid4(),
        "parent_uuid": parent,
        "type": "user",
        "subtype": COMPACT_SUMMARY,
        "role": "user",
        "content": [{"type": "text", "text": summary}],
    }


def boundary_specs(last: uuid.UUID, summary: str) -> list[dict[str, Any]]:
    """A compact boundary covering up to `last` and its summary message."""
    boundary = uuid.uuid4()
    spec: dict[str, Any] = {
        "message_uuid": boundary,
        "parent_uuid": None,
        "logical_parent_uuid": last,
        "type": "system",
        "subtype": COMPACT_BOUNDARY,
        "role": None,
        "content": [],
        "meta": {"trigger": "auto", "pre_tokens": THRESHOLD},
    }
    return [spec, summary_spec(boundary, summary)]


# --- the fake's answers (run inside the fake's process) -------------------------------------

SUMMARY_SECTIONS = (
    "Primary Request and Intent",
    "Key Technical Concepts",
    "Files and Code Sections",
    "Errors and fixes",
    "Problem Solving",
    "All user messages",
    "Pending Tasks",
    "Current Work",
    "Optional Next Step",
)
COLLAPSE_PREFIX = compaction.COLLAPSE_INSTRUCTION[:48]
COLLAPSE_ANSWER = "Collapsed span: read the files asked for and summed each one up."
NAMED_FILE = re.compile(r"notes/[\w.-]+\.md")
NEXT_FILE = re.compile(r"Next: (notes/[\w.-]+\.md)")


def fixed_summary(tokens: int = 2_000) -> str:
    """A summary answer of ~`tokens` estimated tokens with Claude Code's nine sections."""
    words = TextFactory(99)
    per_section = int(tokens * 2.8 / len(SUMMARY_SECTIONS))
    body = "\n\n".join(
        f"{i}. {title}:\n{words.text(per_section - 40, per_section - 40)}"
        for i, title in enumerate(SUMMARY_SECTIONS, 1)
    )
    return f"<analysis>\nNotes on the conversation.\n</analysis>\n\n<summary>\n{body}\n</summary>"


SUMMARY_ANSWER = fixed_summary()
_answers = TextFactory(11)


def _last_user(body: dict[str, Any]) -> list[Block]:
    messages = body.get("messages") or []
    content = messages[-1].get("content") if messages else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _reply(*blocks: Block) -> dict[str, Any]:
    return {"type": "message", "content": list(blocks)}


def respond(body: dict[str, Any]) -> dict[str, Any] | None:
    """The fake's answer to one request (None: its default reply). Stateless: a file's
    last line may name the next file to read (`Next: notes/...`), so a long tool loop
    goes on from whatever the newest result says, across compactions."""
    blocks = _last_user(body)
    text = "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    if SUMMARY_MARKER in text:
        return _reply({"type": "text", "text": SUMMARY_ANSWER})
    if text.startswith(COLLAPSE_PREFIX):
        return _reply({"type": "text", "text": COLLAPSE_ANSWER})
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        following = NEXT_FILE.search(str(results[-1].get("content", "")))
        if following:
            return _reply(read_call(following.group(1)))
        return _reply({"type": "text", "text": _answers.text(200, 600)})
    if CONTINUATION_HEADER in text:
        # Compacted with nothing kept: go on from the newest re-attached file, if any.
        following = NEXT_FILE.search(text)
        if following:
            return _reply(read_call(following.group(1)))
        return _reply({"type": "text", "text": _answers.text(200, 600)})
    paths = NAMED_FILE.findall(text)
    if paths:
        return _reply({"type": "text", "text": "Reading them."}, *map(read_call, paths))
    return None


def read_call(path: str) -> Block:
    return {"type": "tool_use", "name": "Read", "input": {"file_path": path}}


def serve_fake(port_file: str, config_json: str) -> None:
    """The fake with `respond` installed (kept across /_fake/reset), in this process."""
    import uvicorn

    from tests.fake_anthropic.server import FakeState, create_app

    config = json.loads(config_json)

    class State(FakeState):
        def reset(self) -> None:
            super().reset()
            self.configure(**config)
            self.responder = respond

    state = State(**config)
    state.responder = respond
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    server_config = uvicorn.Config(
        create_app(state), log_level="warning", access_log=False, lifespan="off"
    )
    tmp = f"{port_file}.tmp"
    Path(tmp).write_text(str(sock.getsockname()[1]))
    os.replace(tmp, port_file)
    uvicorn.Server(server_config).run(sockets=[sock])


FAKE_SNIPPET = (
    "import sys\nfrom bench.compaction import serve_fake\nserve_fake(sys.argv[1], sys.argv[2])\n"
)


async def start_fake(log_dir: Path) -> Child:
    port_file = log_dir / "fake.port"
    argv = [sys.executable, "-c", FAKE_SNIPPET, str(port_file), json.dumps(FAKE_CONFIG)]
    child = spawn("fake", argv, log_dir)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if not child.alive() or time.monotonic() > deadline:
            raise BenchError(f"the fake did not start:\n{child.tail()}")
        await asyncio.sleep(0.05)
    child.url = f"http://127.0.0.1:{int(port_file.read_text())}"
    return child


# --- the pieces every part uses ---------------------------------------------------------------


def http_client(
    base_url: str, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url, headers=AUTH, timeout=httpx.Timeout(600.0), transport=transport
    )


async def call(client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> Any:
    response = await client.request(method, path, **kwargs)
    if response.status_code >= 300:
        raise BenchError(f"{method} {path}: {response.status_code} {response.text[:500]}")
    return response.json() if response.content else None


@dataclass
class Harness:
    """The scratch database and, when a part asks, the fake and a Parley process."""

    stack: AsyncExitStack
    plan: Plan
    data: Path
    db_url: str
    db: Database
    log_dir: Path
    profile_parley: Path | None = None
    fake: httpx.AsyncClient | None = None
    parley: httpx.AsyncClient | None = None
    children: list[Child] = field(default_factory=list)

    async def services(self) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
        """(parley, fake) clients, started on first use."""
        if self.parley is None or self.fake is None:
            fake = await start_fake(self.log_dir)
            self.stack.callback(fake.stop)
            env = parley_env(plain_dsn(self.db_url), fake.url, API_KEY)
            parley = await start_parley(self.log_dir, env, profile=self.profile_parley)
            self.stack.callback(parley.stop)
            self.children += [fake, parley]
            self.fake = await self.stack.enter_async_context(http_client(fake.url))
            self.parley = await self.stack.enter_async_context(http_client(parley.url))
            print(f"fake {fake.url}, parley {parley.url}", flush=True)
        return self.parley, self.fake

    async def report_rejections(self) -> None:
        """Requests the fake refused (a benchmark built on refused requests is void)."""
        if self.fake is None:
            return
        rejected: list[Any] = await call(self.fake, "GET", "/_fake/rejections")
        if rejected:
            print(f"WARNING: the fake refused {len(rejected)} requests: {rejected[0].get('error')}")

    def tails(self) -> str:
        return "\n".join(f"--- {c.name} log (tail) ---\n{c.tail()}" for c in self.children)


def resigned(raw: bytes) -> bytes:
    """The transcript with each thinking signature replaced by the fake's own."""
    from tests.fake_anthropic import sign_thinking

    out = []
    for line in raw.splitlines():
        if b'"thinking"' not in line:
            out.append(line)
            continue
        obj = json.loads(line)
        content = (obj.get("message") or {}).get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "thinking":
                block["signature"] = sign_thinking(str(block.get("thinking", "")))
        out.append(json.dumps(obj, ensure_ascii=False).encode())
    return b"\n".join(out) + b"\n"


async def import_transcript(client: httpx.AsyncClient, path: Path) -> uuid.UUID:
    body = resigned(await asyncio.to_thread(path.read_bytes))
    headers = {"Content-Type": "application/x-ndjson"}
    out = await call(client, "POST", "/sessions/import", content=body, headers=headers)
    return uuid.UUID(out["id"])


def transcript_files(data: Path, limit: int | None) -> list[Path]:
    files = sorted(p for pattern in TRANSCRIPTS for p in data.glob(pattern))
    return files if limit is None else sorted(files, key=lambda p: p.stat().st_size)[:limit]


def label(path: Path, data: Path) -> str:
    parts = path.relative_to(data).parts
    return f"{parts[1]}/{parts[2]}" if parts[0] == "entireio-cli" else f"copilot {path.stem[:8]}"


async def get_session(db: Database, session_id: uuid.UUID) -> AgentSession:
    async with db.sessionmaker() as s:
        session = await s.get(AgentSession, session_id)
    if session is None:
        raise BenchError(f"session {session_id} not found")
    return session


# --- 1. micro-compaction on real transcripts ----------------------------------------------


@dataclass(frozen=True)
class MicroRow:
    name: str
    messages: int
    before: int
    after: int
    after_bash: int
    results: int  # estimated tokens of every tool result in the view

    @property
    def saved(self) -> float:
        return 1 - self.after / self.before if self.before else 0.0

    @property
    def saved_bash(self) -> float:
        return 1 - self.after_bash / self.before if self.before else 0.0


def deepest(rows: Sequence[Any]) -> uuid.UUID:
    """The message at the end of the longest parent chain that reaches no compact
    boundary (a boundary has no parent: the chains below it start there)."""
    parent = {row.uuid: row.parent_uuid for row in rows}
    boundaries = {row.uuid for row in rows if row.subtype == COMPACT_BOUNDARY}
    depth: dict[uuid.UUID, int | None] = {}  # None: below a boundary

    def walk(node: uuid.UUID) -> int | None:
        path: list[uuid.UUID] = []
        current: uuid.UUID | None = node
        while current is not None and current not in depth and current in parent:
            path.append(current)
            current = parent[current]
        base = depth.get(current) if current is not None else -1
        for step in reversed(path):
            base = None if step in boundaries or base is None else base + 1
            depth[step] = base
        return depth[node]

    ranked: list[tuple[int, int, uuid.UUID]] = [
        (d, row.seq, row.uuid) for row in rows if (d := walk(row.uuid)) is not None
    ]
    if not ranked:
        raise BenchError("the transcript has no message before its first boundary")
    return max(ranked)[2]


async def largest_point(db: Database, session_id: uuid.UUID) -> uuid.UUID:
    """The head of the longest chain before the first compact boundary."""
    async with db.sessionmaker() as s:
        rows = await s.execute(
            select(Message.uuid, Message.parent_uuid, Message.subtype, Message.seq)
            .where(Message.session_id == session_id)
            .order_by(Message.seq)
        )
        return deepest(list(rows))


def micro_after(nodes: list[Node], compactable: frozenset[str]) -> int:
    plan = plan_micro(
        nodes,
        watermark=None,
        compactable=compactable,
        keep_recent=5,
        batch_tokens=0,
        cache_cold=False,
    )
    if plan is None:
        return estimate_messages(nodes)
    return estimate_messages(apply_micro(nodes, plan.watermark, compactable))


def result_tokens(nodes: Sequence[Node]) -> int:
    from app.context.tokens import estimate_block

    return sum(
        estimate_block(b) for n in nodes for b in n.content if b.get("type") == "tool_result"
    )


async def micro_row(db: Database, session_id: uuid.UUID, name: str) -> MicroRow:
    session = await get_session(db, session_id)
    head = await largest_point(db, session_id)
    async with db.sessionmaker() as s:
        view = await load_view(s, session, head)
    nodes = view.projected
    compactable = compactable_tools(session.tools or [])
    return MicroRow(
        name=name,
        messages=len(nodes),
        before=estimate_messages(nodes),
        after=micro_after(nodes, compactable),
        after_bash=micro_after(nodes, compactable | {"Bash"}),
        results=result_tokens(nodes),
    )


@asynccontextmanager
async def inprocess_app(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app in this process, without its lifespan (as the API tests run it)."""
    settings = Settings(
        database_url=db_url,
        api_keys=[f"{TENANT}:{API_KEY}"],
        model_provider="offline",
        log_level="WARNING",
    )
    app = create_app(settings)
    try:
        async with http_client("http://bench", httpx.ASGITransport(app=app)) as client:
            yield client
    finally:
        await app.state.runtime.db.dispose()


async def part_micro(h: Harness) -> dict[str, Any]:
    section("1. micro-compaction alone, real transcripts at their largest point")
    rows: list[MicroRow] = []
    async with inprocess_app(h.db_url) as client:
        for path in transcript_files(h.data, h.plan.micro_files):
            session_id = await import_transcript(client, path)
            rows.append(await micro_row(h.db, session_id, label(path, h.data)))
    before = sum(r.before for r in rows)
    after = sum(r.after for r in rows)
    after_bash = sum(r.after_bash for r in rows)
    total = MicroRow(
        "total",
        sum(r.messages for r in rows),
        before,
        after,
        after_bash,
        sum(r.results for r in rows),
    )
    print(table(MICRO_HEADERS, [micro_cells(r) for r in [*rows, total]]))
    print(
        f"micro-compaction alone frees {total.saved:.1%} of the message tokens "
        f"({total.saved_bash:.1%} with Bash compactable too); anchor: observation masking "
        "roughly halves agent cost (the 'Complexity Trap' study)"
    )
    return {
        "rows": [r.__dict__ for r in rows],
        "saved": total.saved,
        "saved_bash": total.saved_bash,
    }


MICRO_HEADERS = [
    "transcript",
    "messages",
    "before",
    "after",
    "saved",
    "+Bash: after",
    "saved",
    "results share",
]


def micro_cells(r: MicroRow) -> list[str]:
    return [
        r.name,
        str(r.messages),
        f"{r.before:,}",
        f"{r.after:,}",
        f"{r.saved:.1%}",
        f"{r.after_bash:,}",
        f"{r.saved_bash:.1%}",
        f"{r.results / r.before:.1%}" if r.before else "-",
    ]


# --- 2. post-compaction size ------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """Where to compact: the head then, the service's estimate there, and why there."""

    head: uuid.UUID
    estimate: int
    reason: str


def split_segments(rows: Sequence[Any]) -> list[list[Any]]:
    segments: list[list[Any]] = [[]]
    for row in rows:
        if row.subtype == COMPACT_BOUNDARY:
            segments.append([])
        else:
            segments[-1].append(row)
    return segments


def request_points(rows: Sequence[Any]) -> list[int]:
    """Indices after which a model request is made: a user row followed by a response."""
    return [
        i
        for i, row in enumerate(rows)
        if row.role == "user" and (i + 1 == len(rows) or rows[i + 1].role == "assistant")
    ]


def segment_point(
    session: AgentSession, rows: Sequence[Any], threshold: int, compacted_after: bool
) -> Point | None:
    candidates = request_points(rows)
    for i in candidates:
        estimate = sessions.estimate_from_rows(session, rows[: i + 1])
        if estimate > threshold:
            return Point(rows[i].uuid, estimate, f"passes {threshold // 1000}k")
    if compacted_after and candidates:
        i = candidates[-1]
        estimate = sessions.estimate_from_rows(session, rows[: i + 1])
        return Point(rows[i].uuid, estimate, "Claude Code compacted")
    return None


async def compaction_points(h: Harness, session_id: uuid.UUID) -> list[Point]:
    session = await get_session(h.db, session_id)
    async with h.db.sessionmaker() as s:
        rows = await store.chain_rows(s, session.head_uuid, full=True)
    segments = split_segments(rows)
    points = []
    for k, segment in enumerate(segments):
        point = segment_point(session, segment, THRESHOLD, compacted_after=k + 1 < len(segments))
        if point is not None:
            points.append(point)
    return points


READ_LINE = re.compile(r"^\s*(\d+)→(.*)$")
REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def result_text(block: Block) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return content if isinstance(content, str) else ""


def rebuilt_files(rows: Sequence[Any]) -> dict[str, str]:
    """Workspace files rebuilt from the Read results in `rows` (numbered lines merged)."""
    reads: dict[str, str] = {}
    lines: dict[str, dict[int, str]] = {}
    for row in rows:
        for block in row.content or []:
            if block.get("type") == "tool_use" and block.get("name") == "Read":
                path = (block.get("input") or {}).get("file_path")
                if isinstance(path, str):
                    reads[block.get("id", "")] = path.lstrip("/")
            elif block.get("type") == "tool_result" and block.get("tool_use_id") in reads:
                numbered_lines = lines.setdefault(reads[block["tool_use_id"]], {})
                for line in REMINDER.sub("", result_text(block)).splitlines():
                    match = READ_LINE.match(line)
                    if match:
                        numbered_lines[int(match.group(1))] = match.group(2)
    return {
        path: "\n".join(by_number.get(n, "") for n in range(1, max(by_number) + 1))
        for path, by_number in lines.items()
        if by_number
    }


async def put_files(client: httpx.AsyncClient, session_id: uuid.UUID, files: dict[str, str]) -> int:
    stored = 0
    for path, text in files.items():
        response = await client.put(f"/sessions/{session_id}/files/{path}", content=text.encode())
        stored += response.status_code in (200, 201)
    return stored


@dataclass(frozen=True)
class PostRow:
    name: str
    reason: str
    pre: int
    post: int
    summary: int
    files: int
    kept: int
    kept_messages: int
    compacted: int

    @property
    def messages(self) -> int:
        return self.summary + self.files + self.kept

    @property
    def share(self) -> float:
        return self.messages / THRESHOLD


async def view_parts(db: Database, session_id: uuid.UUID) -> tuple[int, int, int, int]:
    """Estimated tokens of the summary, the re-attached files and the kept messages of
    the view now, and how many messages were kept."""
    session = await get_session(db, session_id)
    async with db.sessionmaker() as s:
        nodes = (await load_view(s, session)).projected
    summary = sum(node_tokens(n) for n in nodes if n.subtype == COMPACT_SUMMARY)
    files = sum(node_tokens(n) for n in nodes if n.subtype == "file")
    kept = [n for n in nodes if n.subtype not in (COMPACT_SUMMARY, "file")]
    return summary, files, sum(node_tokens(n) for n in kept), len(kept)


async def compact_at(
    h: Harness, client: httpx.AsyncClient, session_id: uuid.UUID, point: Point, name: str
) -> PostRow:
    await call(client, "PUT", f"/sessions/{session_id}/head", json={"uuid": str(point.head)})
    async with h.db.sessionmaker() as s:
        session = await s.get(AgentSession, session_id)
        assert session is not None
        rows = await store.chain_rows(s, point.head, full=False)
    await put_files(client, session_id, rebuilt_files(rows))
    out = await call(client, "POST", f"/sessions/{session_id}/compact", json={})
    summary, files, kept, kept_messages = await view_parts(h.db, session_id)
    return PostRow(
        name,
        point.reason,
        point.estimate,
        int(out["post_tokens"]),
        summary,
        files,
        kept,
        kept_messages,
        int(out["messages_compacted"]),
    )


async def part_post(h: Harness) -> dict[str, Any]:
    section(f"2. post-compaction size of the messages / threshold ({THRESHOLD:,})")
    client, _ = await h.services()
    rows: list[PostRow] = []
    for path in transcript_files(h.data, None):
        if h.plan.post_points is not None and len(rows) >= h.plan.post_points:
            break
        session_id = await import_transcript(client, path)
        patch = {"compaction": {"threshold_tokens": THRESHOLD}}
        await call(client, "PATCH", f"/sessions/{session_id}", json=patch)
        for point in await compaction_points(h, session_id):
            rows.append(await compact_at(h, client, session_id, point, label(path, h.data)))
    if not rows:
        raise BenchError("no transcript is large enough to compact")
    print(table(POST_HEADERS, [post_cells(r) for r in rows]))
    worst = max(r.share for r in rows)
    print(
        f"messages after compaction / threshold: median {median([r.share for r in rows]):.1%}, "
        f"worst {worst:.1%} "
        f"{verdict(worst, TARGETS['post_share'])}"
    )
    return {
        "rows": [r.__dict__ for r in rows],
        "median": median([r.share for r in rows]),
        "worst": worst,
    }


POST_HEADERS = [
    "transcript",
    "point",
    "pre",
    "compacted",
    "kept msgs",
    "summary",
    "files",
    "kept",
    "messages",
    "post_tokens",
    "messages/threshold",
]


def post_cells(r: PostRow) -> list[str]:
    return [
        r.name,
        r.reason,
        f"{r.pre:,}",
        str(r.compacted),
        str(r.kept_messages),
        f"{r.summary:,}",
        f"{r.files:,}",
        f"{r.kept:,}",
        f"{r.messages:,}",
        f"{r.post:,}",
        f"{r.share:.1%}",
    ]


# --- 3. per-turn time behind compaction boundaries -------------------------------------------


def summary_text() -> str:
    return SUMMARY_ANSWER.split("<summary>", 1)[1].split("</summary>", 1)[0].strip()


def view_messages(rounds: int) -> list[tuple[str, list[Block]]]:
    """What follows the last summary: assistant, then (user, assistant) rounds."""
    words = TextFactory(8)
    out = [("assistant", [{"type": "text", "text": words.text(200, 800)}])]
    for _ in range(rounds):
        out.append(("user", [{"type": "text", "text": words.text(60, 300)}]))
        out.append(("assistant", [{"type": "text", "text": words.text(200, 800)}]))
    return out


def compacted_specs(plan: Plan) -> list[dict[str, Any]]:
    """`plan.history` messages in `plan.segments` compacted segments, then the view."""
    history = Traffic(3).messages(plan.history)
    size = -(-len(history) // plan.segments)
    specs: list[dict[str, Any]] = []
    parent: uuid.UUID | None = None
    for k in range(plan.segments):
        segment = chain_specs(history[k * size : (k + 1) * size], parent, MODEL_1M)
        summary = boundary_specs(segment[-1]["message_uuid"], summary_text())
        specs += [*segment, *summary]
        parent = summary[-1]["message_uuid"]
    return specs + chain_specs(view_messages(plan.view_rounds), parent, MODEL_1M)


def fresh_specs(plan: Plan) -> list[dict[str, Any]]:
    """The same model view, in a session that never compacted."""
    summary = summary_spec(None, summary_text())
    return [
        summary,
        *chain_specs(view_messages(plan.view_rounds), summary["message_uuid"], MODEL_1M),
    ]


async def seeded_session(
    h: Harness, client: httpx.AsyncClient, specs: list[dict[str, Any]]
) -> uuid.UUID:
    session_id = uuid.UUID((await call(client, "POST", "/sessions", json={}))["id"])
    async with h.db.transaction() as db:
        await store.append_many(db, session_id, specs)
    return session_id


async def timed_turn(client: httpx.AsyncClient, session_id: uuid.UUID, text: str) -> float:
    start = time.perf_counter()
    out = await call(client, "POST", f"/sessions/{session_id}/messages", json={"content": text})
    elapsed = time.perf_counter() - start
    if out["run"]["status"] != "completed":
        raise BenchError(f"turn ended {out['run']}")
    return elapsed


async def view_length(h: Harness, session_id: uuid.UUID) -> int:
    session = await get_session(h.db, session_id)
    async with h.db.sessionmaker() as s:
        return len((await load_view(s, session)).nodes)


async def part_turn(h: Harness) -> dict[str, Any]:
    plan = h.plan
    section(f"3. per-turn time, {plan.history:,} messages behind boundaries vs a fresh session")
    client, _ = await h.services()
    started = time.perf_counter()
    sessions_ = {
        "compacted": await seeded_session(h, client, compacted_specs(plan)),
        "fresh": await seeded_session(h, client, fresh_specs(plan)),
    }
    print(f"seeded in {time.perf_counter() - started:.1f}s", flush=True)
    words = TextFactory(6)
    for name, session_id in sessions_.items():
        for _ in range(plan.turn_warmup):
            await timed_turn(client, session_id, f"Warm-up for {name}: {words.text(60, 160)}")
    times: dict[str, list[float]] = {name: [] for name in sessions_}
    for rep in range(plan.turn_reps):
        order = list(sessions_.items())
        text = f"Question {rep}: {words.text(60, 160)}"
        for name, session_id in order if rep % 2 == 0 else reversed(order):
            times[name].append(await timed_turn(client, session_id, text))
    lengths = {name: await view_length(h, sid) for name, sid in sessions_.items()}
    rows = [
        [name, len(t), lengths[name], ms(median(t)), ms(percentile(t, 90))]
        for name, t in times.items()
    ]
    print(table(["session", "turns", "view rows", "median ms", "p90 ms"], rows))
    r = ratio(median(times["compacted"]), median(times["fresh"]))
    print(f"compacted / fresh (median per-turn time): {r:.2f} {verdict(r, TARGETS['per_turn'])}")
    return {"times": times, "ratio": r, "view_rows": lengths}


# --- 4. compaction time without the model call ------------------------------------------------


class StubModel:
    """A zero-latency model answering every request with the fixed summary; it keeps the
    time each answer took, to be taken off compact()'s."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def stream(self, body: dict[str, Any]) -> AsyncGenerator[StreamEvent, None]:
        start = time.perf_counter()
        yield MessageDone(
            content=[{"type": "text", "text": SUMMARY_ANSWER}],
            stop_reason="end_turn",
            stop_sequence=None,
            usage={"input_tokens": 1, "output_tokens": 700},
            model=str(body.get("model")),
            message_id="msg_bench_stub",
            request_id=None,
        )
        self.seconds.append(time.perf_counter() - start)

    async def aclose(self) -> None:
        return None


STEPS = (
    "load_view",
    "plan_compaction",
    "summarise",
    "build_body",
    "render_for_summary",
    "store_compaction",
)


def timed(fn: Callable[..., Any], name: str, sink: dict[str, float]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                sink[name] = sink.get(name, 0.0) + time.perf_counter() - start

        return async_wrapper

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink[name] = sink.get(name, 0.0) + time.perf_counter() - start

    return wrapper


@asynccontextmanager
async def step_timers(sink: dict[str, float]) -> AsyncIterator[None]:
    """The steps of compact() timed into `sink`: each name is wrapped in every module of
    the compaction package that looks it up (wherever the code lives now)."""
    prefix = compaction.__name__
    modules = [m for name, m in list(sys.modules.items()) if name.startswith(prefix) and m]
    originals = [(m, name, getattr(m, name)) for m in modules for name in STEPS if hasattr(m, name)]
    for module, name, fn in originals:
        setattr(module, name, timed(fn, name, sink))
    try:
        yield
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)


@dataclass
class Variant:
    name: str
    model: str
    session_id: uuid.UUID
    head: uuid.UUID
    estimate: int
    totals: list[float] = field(default_factory=list)  # seconds, model call taken off
    steps: list[dict[str, float]] = field(default_factory=list)
    outcome: compaction.CompactionOutcome | None = None


def tools_tokens() -> int:
    definitions = [BUILTIN_TOOLS[name].to_api() for name in BUILTINS]
    return estimate_tools([*definitions, BASH_TOOL])


async def seed_variant(rt: Runtime, name: str, model: str, plan: Plan) -> Variant:
    traffic = Traffic(4)
    system = TextFactory(12).text(9_000, 9_000)
    messages = traffic.upto(plan.compact_tokens - estimate_system(system) - tools_tokens())
    body = SessionCreate.model_validate(
        {
            "model": model,
            "system": system,
            "builtin_tools": BUILTINS,
            "tools": [BASH_TOOL],
            "compaction": {"threshold_tokens": THRESHOLD},
        }
    )
    async with rt.db.transaction() as db:
        session = await sessions.create(db, TENANT, body, rt.settings)
        rows = await store.append_many(db, session.id, chain_specs(messages, None, model))
        workspace = DbWorkspace(db, session.id)
        for path, text in traffic.files.items():
            await workspace.put(path, text.encode())
    async with rt.db.sessionmaker() as db:
        stored = await db.get(AgentSession, session.id)
        assert stored is not None
        estimate = compaction.view_estimate(stored, (await load_view(db, stored)).nodes)
    return Variant(name, model, session.id, rows[-1]["uuid"], estimate)


async def compact_once(
    rt: Runtime, stub: StubModel, variant: Variant
) -> tuple[float, dict[str, float]]:
    """One compact() from the original head; (seconds without the model, step seconds)."""
    async with rt.db.transaction() as db:
        await store.set_head(db, variant.session_id, variant.head)
        run = Run(session_id=variant.session_id, kind="compact", status="running", params={})
        db.add(run)
    async with rt.db.sessionmaker() as db:
        session = await db.get(AgentSession, variant.session_id)
    assert session is not None
    rt.events.open(run.id, 0)
    steps: dict[str, float] = {}
    model_before = len(stub.seconds)
    try:
        async with step_timers(steps):
            start = time.perf_counter()
            variant.outcome = await compaction.compact(
                TurnRunner(rt, run, session), session, "auto"
            )
            total = time.perf_counter() - start
    finally:
        await rt.events.close(run.id)
        async with rt.db.transaction() as db:
            await db.execute(update(Run).where(Run.id == run.id).values(status="completed"))
    steps["model"] = sum(stub.seconds[model_before:])
    return total - steps["model"], steps


def runtime_for(db_url: str) -> Runtime:
    settings = Settings(database_url=db_url, model_provider="offline", log_level="WARNING")
    return Runtime(settings)


async def part_time(h: Harness, profile: Path | None) -> dict[str, Any]:
    plan = h.plan
    section(f"4. compact() without the model call, ~{plan.compact_tokens // 1000}k-token view")
    rt = runtime_for(h.db_url)
    stub = StubModel()
    rt.llm = stub
    try:
        variants = [
            await seed_variant(rt, "200k", MODEL_200K, plan),
            await seed_variant(rt, "1M", MODEL_1M, plan),
        ]
        for variant in variants:  # warm-up, discarded
            await compact_once(rt, stub, variant)
        for rep in range(plan.compact_runs):
            for variant in variants if rep % 2 == 0 else reversed(variants):
                seconds, steps = await compact_once(rt, stub, variant)
                variant.totals.append(seconds)
                variant.steps.append(steps)
        report_time(variants)
        if profile is not None:
            await profile_compaction(rt, stub, variants, profile)
    finally:
        await rt.stop()
    return {
        v.name: {"estimate": v.estimate, "median": median(v.totals), "runs": v.totals}
        for v in variants
    }


def report_time(variants: Sequence[Variant]) -> None:
    rows = []
    for v in variants:
        out = v.outcome
        total = median(v.totals)
        rendered = any(step.get("render_for_summary") for step in v.steps)
        cells = [f"{v.estimate:,}", "rendered" if rendered else "cached prefix"]
        cells.append(str(out.messages_compacted if out else "-"))
        cells += [f"{out.post_tokens:,}" if out else "-", str(len(v.totals)), ms(total)]
        rows.append([v.name, *cells, verdict(total, TARGETS["compact_seconds"])])
    headers = ["model window", "est. tokens", "summary request", "compacted", "post", "runs"]
    headers += ["median ms", "target (s)"]
    print(table(headers, rows))
    print("\nsteps inside compact(), median ms (summarise holds build_body or render_for_summary")
    print("and the model call, which is the zero-latency stub here):")
    names = [*STEPS, "model"]
    step_rows = [
        [v.name, *(ms(median([s.get(name, 0.0) for s in v.steps])) for name in names)]
        for v in variants
    ]
    print(table(["model window", *names], step_rows))


async def profile_compaction(
    rt: Runtime, stub: StubModel, variants: Sequence[Variant], out: Path
) -> None:
    profiler = cProfile.Profile()
    for variant in variants:
        profiler.enable()
        await compact_once(rt, stub, variant)
        profiler.disable()
    profiler.dump_stats(str(out))
    section(f"cProfile of one compact() per view (cumulative, top 25; {out})")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


# --- 5. prompt cache across a compacting session ----------------------------------------------


async def settle(
    fake: httpx.AsyncClient, quiet_seconds: float = 2.0, limit: float = 120.0
) -> list[Any]:
    """The fake's records, once no new request came for `quiet_seconds` (background
    collapse requests run after a turn has answered)."""
    deadline = time.monotonic() + limit
    records: list[Any] = await call(fake, "GET", "/_fake/requests")
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_seconds)
        latest: list[Any] = await call(fake, "GET", "/_fake/requests")
        if len(latest) == len(records):
            return latest
        records = latest
    return records


def request_kind(record: dict[str, Any]) -> str:
    content = (record.get("message") or {}).get("content") or [{}]
    text = str(content[0].get("text", ""))
    if text == SUMMARY_ANSWER:
        return "summary"
    if text == COLLAPSE_ANSWER:
        return "collapse"
    return "turn"


USAGE_KEYS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
EARLY_COMPACTION = 0.8


def cache_rows(usages: Sequence[tuple[str, dict[str, int]]]) -> tuple[list[list[str]], float]:
    groups: dict[str, list[dict[str, int]]] = {"all": [u for _, u in usages]}
    for kind, usage in usages:
        groups.setdefault(kind, []).append(usage)
    rows, share = [], 0.0
    for kind, group in groups.items():
        read = sum(u["cache_read_input_tokens"] for u in group)
        written = sum(u["cache_creation_input_tokens"] for u in group)
        plain = sum(u["input_tokens"] for u in group)
        total = read + written + plain
        kind_share = ratio(read, total)
        share = kind_share if kind == "all" else share
        rows.append(
            [
                kind,
                str(len(group)),
                f"{total:,}",
                f"{read:,}",
                f"{written:,}",
                f"{plain:,}",
                f"{kind_share:.1%}",
            ]
        )
    return rows, share


def report_summary_sizes(usages: Sequence[tuple[str, dict[str, int]]], threshold: int) -> None:
    """Each summary request's real prompt (the view it summarises, plus the instruction)
    as a share of the threshold: far below 1 means the estimate that triggered it was off."""
    sizes = [sum(u[k] for k in USAGE_KEYS) / threshold for kind, u in usages if kind == "summary"]
    if sizes:
        early = sum(size < EARLY_COMPACTION for size in sizes)
        shown = ", ".join(f"{size:.0%}" for size in sizes)
        print(
            f"summary requests' real size / threshold: {shown}; {early} below "
            f"{EARLY_COMPACTION:.0%} (compacted early)"
        )


async def count_rows(h: Harness, session_id: uuid.UUID) -> dict[str, int]:
    async with h.db.sessionmaker() as s:
        boundaries = await s.scalar(
            select(func.count()).where(
                Message.session_id == session_id, Message.subtype == COMPACT_BOUNDARY
            )
        )
        marks = await s.scalar(select(func.count()).where(MicroWatermark.session_id == session_id))
        spans = await s.scalar(select(func.count()).where(Collapse.session_id == session_id))
        applied = await s.scalar(
            select(func.count()).where(
                Collapse.session_id == session_id, Collapse.applied_at.is_not(None)
            )
        )
    return {
        "compactions": boundaries or 0,
        "micro_moves": marks or 0,
        "collapses": spans or 0,
        "collapses_applied": applied or 0,
    }


LONG_TURN_EVERY = 10  # part 5: every 10th turn is a long tool loop
LONG_TURN_READS = 16


def turn_files(turn: int, words: TextFactory) -> tuple[list[str], dict[str, str]]:
    """The files a turn starts with and every file it will read: one (two in parallel on
    every 4th turn), or, on a long turn, a chain of files each naming the next."""
    base = f"notes/t{turn}"
    if turn % LONG_TURN_EVERY == LONG_TURN_EVERY - 1:
        chain = [f"{base}-{k}.md" for k in range(LONG_TURN_READS)]
        files = {
            path: words.text(4_000, 9_000)
            + (f"\nNext: {chain[k + 1]}" if k + 1 < len(chain) else "")
            for k, path in enumerate(chain)
        }
        return chain[:1], files
    first = [f"{base}.md", *([f"{base}-b.md"] if turn % 4 == 3 else [])]
    return first, {path: words.text(4_000, 9_000) for path in first}


async def cache_session(h: Harness, client: httpx.AsyncClient) -> uuid.UUID:
    plan = h.plan
    words = TextFactory(5)
    body = {
        "system": words.text(11_000, 11_000),
        "builtin_tools": ["Read", "Glob", "Grep"],
        "compaction": {"threshold_tokens": plan.cache_threshold},
    }
    session_id = uuid.UUID((await call(client, "POST", "/sessions", json=body))["id"])
    for i in range(plan.cache_turns):
        first, files = turn_files(i, words)
        await put_files(client, session_id, files)
        follow = " and follow its Next lines to the end" if len(files) > len(first) else ""
        prompt = f"Turn {i + 1}: read {' and '.join(first)}{follow}, then sum it up."
        out = await call(
            client, "POST", f"/sessions/{session_id}/messages", json={"content": prompt}
        )
        if out["run"]["status"] != "completed":
            raise BenchError(f"cache turn {i + 1} ended {out['run']}")
    return session_id


async def part_cache(h: Harness) -> dict[str, Any]:
    plan = h.plan
    section(
        f"5. prompt cache over a {plan.cache_turns}-turn Read-then-answer session, "
        f"threshold {plan.cache_threshold:,}: all requests"
    )
    client, fake = await h.services()
    await call(fake, "POST", "/_fake/reset")
    session_id = await cache_session(h, client)
    records = await settle(fake)
    usages = [
        (request_kind(r), r["usage"])
        for r in records
        if r.get("path") == "/v1/messages" and r.get("usage")
    ]
    rows, share = cache_rows(usages)
    print(
        table(
            [
                "requests",
                "n",
                "input tokens",
                "cache read",
                "cache write",
                "uncached",
                "read share",
            ],
            rows,
        )
    )
    report_summary_sizes(usages, plan.cache_threshold)
    counts = await count_rows(h, session_id)
    print(
        f"compactions {counts['compactions']}, micro-compaction moves {counts['micro_moves']}, "
        f"collapses {counts['collapses']} ({counts['collapses_applied']} applied)"
    )
    target = verdict(share, TARGETS["cache_share"], at_least=True)
    print(f"cache read share over all requests: {share:.1%} {target}")
    return {"share": share, **counts, "usages": usages}


# --- running it -----------------------------------------------------------------------------


async def run_parts(h: Harness, parts: Sequence[int], profile: Path | None) -> dict[str, Any]:
    runners: dict[int, Callable[[], Awaitable[dict[str, Any]]]] = {
        1: lambda: part_micro(h),
        2: lambda: part_post(h),
        3: lambda: part_turn(h),
        4: lambda: part_time(h, profile),
        5: lambda: part_cache(h),
    }
    results: dict[str, Any] = {}
    for part in parts:
        started = time.perf_counter()
        results[PARTS[part]] = await runners[part]()
        await h.report_rejections()
        print(f"(part {part}: {time.perf_counter() - started:.0f}s)", flush=True)
    return results


async def run(args: argparse.Namespace, parts: Sequence[int]) -> int:
    plan = QUICK if args.quick else FULL
    if args.cache_threshold:
        plan = dataclasses.replace(plan, cache_threshold=args.cache_threshold)
    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        db_url = await stack.enter_async_context(scratch_database(DB_NAME))
        engine = make_engine(Settings(database_url=db_url, model_provider="offline"))
        await upgrade(engine)
        db = Database(engine)
        stack.push_async_callback(db.dispose)
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-compaction-")))
        h = Harness(stack, plan, args.data.resolve(), db_url, db, log_dir, args.profile_parley)
        try:
            results = await run_parts(h, parts, args.profile)
        except Exception:
            print(h.tails())
            raise
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    if not args.no_save and not args.quick:
        print(f"results: {save_results('compaction', results)}")
    return 0 if args.quick else exit_code(results)


def exit_code(results: dict[str, Any]) -> int:
    checks: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
        ("post", lambda r: r["worst"] <= TARGETS["post_share"]),
        ("turn", lambda r: r["ratio"] <= TARGETS["per_turn"]),
        ("time", lambda r: all(v["median"] <= TARGETS["compact_seconds"] for v in r.values())),
        ("cache", lambda r: r["share"] >= TARGETS["cache_share"]),
    ]
    ok = all(check(results[name]) for name, check in checks if name in results)
    return 0 if ok else 1


def parse_parts(text: str) -> list[int]:
    names = {v: k for k, v in PARTS.items()}
    parts = []
    for item in (p.strip() for p in text.split(",") if p.strip()):
        part = int(item) if item.isdigit() else names.get(item, 0)
        if part not in PARTS:
            raise SystemExit(f"unknown part {item!r}: 1-5 or {', '.join(PARTS.values())}")
        parts.append(part)
    return sorted(set(parts))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench compaction",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--part", default="1,2,3,4,5", help="parts to run: 1-5 or their names")
    parser.add_argument("--quick", action="store_true", help="a smoke run of small sizes")
    parser.add_argument("--no-save", action="store_true", help="no JSON in bench/results/")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="transcripts folder")
    parser.add_argument("--cache-threshold", type=int, help="part 5: threshold_tokens")
    parser.add_argument("--profile", type=Path, help="part 4: cProfile one compact() to FILE")
    parser.add_argument("--profile-parley", type=Path, help="run Parley under cProfile, to FILE")
    args = parser.parse_args(argv)
    if args.profile_parley:
        args.profile_parley = args.profile_parley.resolve()
    return asyncio.run(run(args, parse_parts(args.part)))
