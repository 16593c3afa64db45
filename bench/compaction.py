"""Compaction (docs/architecture.md, "Compaction"): eight measurements, each runnable alone.

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

6. imports: each real transcript imported, before any turn: `GET /context`'s estimate
   against the fake's count of the request Parley builds (`GET /context/request`),
   target within 10%; beside it the transcript's own last usage, which the estimate used
   to anchor on (it counted Claude Code's system prompt and tools).
7. truth: at each compaction point of part 2, three Parley compactions in a row, each
   followed by a turn ("continue"): `pre_tokens` against the fake's count of the request
   that would have been sent, the estimate right after the compaction against the next
   request's real count (targets: median error <= 5%, worst <= 15%), compactions that
   grew the context (0), refusals, the user's prompts of each compacted span found
   verbatim in its summary request (100%), files re-attached (from the conversation:
   the workspace holds none of an imported session's files), the compact runs' usage.
8. needless: part 5's scripted session on a model whose tokens the fake counts
   (claude-sonnet-4-5): compactions whose replaced request (the cached-prefix summary
   request less its instruction, as the fake counted it) was under the threshold (0),
   compactions that grew the context (0), post_tokens against the next request, prompt
   coverage of the summary requests, and whether every call's usage reached the
   session's counters.

The fake runs in its own process with a responder (`respond` below): a summary request
(it carries SUMMARY_MARKER) gets the fixed summary, a collapse request a short one, a
prompt naming files gets Read calls for them, a tool result a Read of the file its last
line names (`Next: ...`) or else a short answer, and anything else the fake's default
reply. Thinking signatures of imported transcripts are
replaced by the fake's own (it verifies them; a signature is never counted as tokens).

    uv run python -m bench compaction [--part 1,2,...] [--quick] [--no-save]
        [--data DIR] [--cache-threshold N] [--profile FILE] [--profile-parley FILE]

The transcripts are read from --data, else from the folder PARLEY_TRANSCRIPTS names.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select, update

from app.config import Settings
from app.context.compaction import human_prompts
from app.context.estimates import (
    REQUEST_ESTIMATE,
    anchored_estimate,
    request_estimate,
    view_estimate,
)
from app.context.micro import apply_micro, plan_micro
from app.context.session import SessionConfig
from app.context.summary_prompt import CONTINUATION_HEADER, SUMMARY_MARKER
from app.context.tokens import (
    TOOL_ID_TOKENS,
    estimate_content,
    estimate_messages,
    estimate_system,
    estimate_tools,
    node_tokens,
)
from app.context.tools import BUILTIN_TOOLS, compactable_tools
from app.context.types import COMPACT_BOUNDARY, COMPACT_SUMMARY, Block, Node
from app.conversation import sessions, store
from app.conversation.files import DbWorkspace
from app.conversation.records import MessageRecord
from app.conversation.views import ChainCache, load_view
from app.db import Database, make_engine
from app.domain import CompactionOutcome, CompactionTrigger
from app.engine import compaction
from app.engine.compaction.collapse import COLLAPSE_INSTRUCTION
from app.engine.compaction.compact import compact
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
    records_of,
    save_results,
    scratch_database,
    section,
    table,
    transcripts_folder,
    verdict,
)
from bench.procs import Child, parley_env, spawn, start_parley

DB_NAME = f"parley_bench_compaction_{os.getpid()}"  # one per run: others may bench too
API_KEY = "bench-key-0123456789abcdef"
TENANT = "bench"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL_200K = "claude-sonnet-4-5"
MODEL_1M: str = Settings.model_fields["model"].default
THRESHOLD = 167_000
TARGETS = {
    "post_share": 0.25,
    "per_turn": 1.2,
    "compact_seconds": 0.200,
    "cache_share": 0.80,
    "import_error": 0.10,  # part 6: |estimate / request built - 1|
    "after_median": 0.05,  # part 7: |estimate after compaction / next request - 1|
    "after_worst": 0.15,
}
TRANSCRIPTS = ("entireio-cli/*/*/*/full.jsonl", "vscode-copilot-chat/fixtures/*.jsonl")
FAKE_CONFIG: dict[str, Any] = {"record_bodies": False, "max_context_tokens": 10_000_000}
PARTS = {
    1: "micro",
    2: "post",
    3: "turn",
    4: "time",
    5: "cache",
    6: "imports",
    7: "truth",
    8: "needless",
}


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
    cache_turns: int  # parts 5 and 8
    cache_threshold: int
    import_files: int | None  # part 6 (None: all)


FULL = Plan(None, None, 10_000, 4, 15, 50, 3, 180_000, 15, 60, 30_000, None)
QUICK = Plan(3, 1, 400, 2, 15, 3, 1, 40_000, 2, 12, 20_000, 4)


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
COLLAPSE_PREFIX = COLLAPSE_INSTRUCTION[:48]
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
    compactable = compactable_tools(session.tools or [])
    async with db.sessionmaker() as s:
        view = await load_view(s, ChainCache(0), session_id, head, compactable)
    nodes = view.projected
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
    config: SessionConfig, rows: Sequence[MessageRecord], threshold: int, compacted_after: bool
) -> Point | None:
    """The first request point past `threshold` by the service's estimate (of content:
    an imported transcript's usage is not an anchor), else the last point of a segment
    Claude Code compacted after."""
    candidates = request_points(rows)
    nodes = [row.to_node() for row in rows]
    for i in candidates:
        estimate = anchored_estimate(config, nodes[: i + 1])
        if estimate > threshold:
            return Point(rows[i].uuid, estimate, f"passes {threshold // 1000}k")
    if compacted_after and candidates:
        i = candidates[-1]
        estimate = anchored_estimate(config, nodes[: i + 1])
        return Point(rows[i].uuid, estimate, "Claude Code compacted")
    return None


async def compaction_points(h: Harness, session_id: uuid.UUID) -> list[Point]:
    session = await get_session(h.db, session_id)
    async with h.db.sessionmaker() as s:
        rows = await store.chain(s, session.head_uuid, full=True)
    config = sessions.config_of(session, Settings(model_provider="offline"))
    segments = split_segments(rows)
    points = []
    for k, segment in enumerate(segments):
        point = segment_point(config, segment, THRESHOLD, compacted_after=k + 1 < len(segments))
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
    compactable = compactable_tools(session.tools or [])
    async with db.sessionmaker() as s:
        view = await load_view(s, ChainCache(0), session_id, session.head_uuid, compactable)
    nodes = view.projected
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
        rows = await store.chain(s, point.head, full=False)
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
        await store.append_many(db, records_of(session_id, specs))
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
        view = await load_view(s, ChainCache(0), session_id, session.head_uuid, frozenset())
    return len(view.nodes)


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
    outcome: CompactionOutcome | None = None


def tools_tokens() -> int:
    definitions = [BUILTIN_TOOLS[name].to_api() for name in BUILTINS]
    return estimate_tools([*definitions, BASH_TOOL])


def sent_by_parley(config: SessionConfig, records: list[MessageRecord]) -> list[MessageRecord]:
    """The records with their newest reply as the loop would have stored it: the
    estimate of its request recorded, a usage that measured it."""
    last = max(i for i, r in enumerate(records) if r.role == "assistant")
    measured = request_estimate(config, [r.to_node() for r in records[:last]])
    reply = records[last].with_(
        usage={"input_tokens": measured, "output_tokens": records[last].token_estimate},
        metadata={REQUEST_ESTIMATE: measured},
    )
    return [*records[:last], reply, *records[last + 1 :]]


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
        # A session in use: its prompt cache warm and its replies Parley's own (a view
        # never sent counts as cold: its summary request would be rendered to text).
        records = sent_by_parley(
            sessions.config_of(session, rt.settings),
            records_of(session.id, chain_specs(messages, None, model)),
        )
        rows = await store.append_many(
            db,
            records,
            session_values={"last_request_at": datetime.now(UTC) + timedelta(days=1)},
        )
        workspace = DbWorkspace(db, session.id)
        for path, text in traffic.files.items():
            await workspace.put(path, text.encode())
    async with rt.db.sessionmaker() as db:
        stored = await db.get(AgentSession, session.id)
        assert stored is not None
        config = sessions.config_of(stored, rt.settings)
        view = await load_view(db, ChainCache(0), session.id, rows[-1].uuid, config.compactable)
        estimate = view_estimate(config, view.nodes)
    return Variant(name, model, session.id, rows[-1].uuid, estimate)


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
            variant.outcome = await compact(
                TurnRunner(rt.resources, run, session), CompactionTrigger.AUTO
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
    rt.resources.llm = stub
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


async def cache_session(
    h: Harness, client: httpx.AsyncClient, model: str | None = None
) -> uuid.UUID:
    plan = h.plan
    words = TextFactory(5)
    body: dict[str, Any] = {
        "system": words.text(11_000, 11_000),
        "builtin_tools": ["Read", "Glob", "Grep"],
        "compaction": {"threshold_tokens": plan.cache_threshold},
    }
    if model:
        body["model"] = model
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


# --- 6. imported sessions: the estimate against the request Parley builds -------------------


def counted(body: dict[str, Any]) -> int:
    """The fake's count of a request body (the function its count_tokens route runs)."""
    from tests.fake_anthropic.tokens import count_tokens

    return int(count_tokens(body))


def source_usage(rows: Sequence[MessageRecord]) -> int:
    """What the old estimate anchored on: the transcript's last reported usage."""
    for row in reversed(rows):
        if row.role == "assistant" and row.usage:
            usage = row.usage
            return int(sum(int(usage.get(k) or 0) for k in (*USAGE_KEYS, "output_tokens")))
    return 0


SIZABLE_REQUEST = 2_000


@dataclass(frozen=True)
class ImportRow:
    name: str
    messages: int
    built: int  # the fake's count of GET /context/request
    estimate: int  # GET /context, before the first turn
    source: int  # the transcript's last usage (the old anchor)

    @property
    def ratio(self) -> float:
        return ratio(self.estimate, self.built)

    @property
    def source_ratio(self) -> float:
        return ratio(self.source, self.built)


async def part_imports(h: Harness) -> dict[str, Any]:
    section("6. imported sessions: the estimate before the first turn / the request Parley builds")
    client, _ = await h.services()
    rows: list[ImportRow] = []
    for path in transcript_files(h.data, h.plan.import_files):
        session_id = await import_transcript(client, path)
        estimate = (await call(client, "GET", f"/sessions/{session_id}/context"))[
            "estimated_tokens"
        ]
        body = await call(client, "GET", f"/sessions/{session_id}/context/request")
        session = await get_session(h.db, session_id)
        async with h.db.sessionmaker() as s:
            chain = await store.chain(s, session.head_uuid, full=False)
        rows.append(
            ImportRow(label(path, h.data), len(chain), counted(body), estimate, source_usage(chain))
        )
    cells = [
        [
            r.name,
            str(r.messages),
            f"{r.built:,}",
            f"{r.estimate:,}",
            f"{r.ratio:.3f}",
            f"{r.source:,}",
            f"{r.source_ratio:.2f}",
        ]
        for r in rows
    ]
    print(
        table(
            [
                "transcript",
                "view rows",
                "request built",
                "estimate",
                "ratio",
                "source usage",
                "ratio (old anchor)",
            ],
            cells,
        )
    )
    errors = [abs(r.ratio - 1) for r in rows]
    within = sum(e <= TARGETS["import_error"] for e in errors)
    anchored = [r.source_ratio for r in rows if r.source]
    print(
        f"estimate / request built: median {median([r.ratio for r in rows]):.3f}, worst error "
        f"{max(errors):.1%}; {within}/{len(rows)} within "
        f"{TARGETS['import_error']:.0%} {verdict(max(errors), TARGETS['import_error'])}"
    )
    sizable = [abs(r.ratio - 1) for r in rows if r.built >= SIZABLE_REQUEST]
    if sizable:
        print(
            f"requests of at least {SIZABLE_REQUEST:,} tokens: {len(sizable)}, worst error "
            f"{max(sizable):.1%} (below that, tool-id framing the fake does not count but "
            f"the API does, {TOOL_ID_TOKENS} tokens a block in the estimate, is a large share)"
        )
    if anchored:
        print(
            f"(the transcript's own usage / request built, the old anchor: "
            f"{min(anchored):.2f}-{max(anchored):.2f}, median {median(anchored):.2f})"
        )
    return {
        "rows": [{**r.__dict__, "ratio": r.ratio} for r in rows],
        "median": median([r.ratio for r in rows]),
        "worst_error": max(errors),
    }


# --- 7. estimates after compaction, at real compaction points ---------------------------------


def request_texts(body: dict[str, Any]) -> str:
    """Every text a request carries (system, text blocks, tool results), joined."""
    parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        parts.append(system)
    for block in system if isinstance(system, list) else []:
        parts.append(str(block.get("text", "")))
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
            continue
        for block in content or []:
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_result":
                parts.append(result_text(block))
    return "\n".join(parts)


def is_summary_request(body: dict[str, Any] | None) -> bool:
    return bool(body) and SUMMARY_MARKER in request_texts(body or {})


async def fake_records(fake: httpx.AsyncClient) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = await call(fake, "GET", "/_fake/requests")
    return [r for r in records if r.get("path") == "/v1/messages"]


async def record_bodies(fake: httpx.AsyncClient) -> None:
    """A fresh log that keeps request bodies (the default config drops them)."""
    await call(fake, "POST", "/_fake/reset")
    await call(fake, "POST", "/_fake/config", json={"record_bodies": True, "max_records": 200})


async def compacted_span(h: Harness, boundary_uuid: str) -> list[MessageRecord]:
    """The stored rows a compaction summarised (its boundary's covered range)."""
    async with h.db.sessionmaker() as s:
        boundary = await s.get(Message, uuid.UUID(boundary_uuid))
        assert boundary is not None
        last = (boundary.meta or {}).get("covered", {}).get("last_uuid")
        if not last:
            return []
        return await store.chain(s, uuid.UUID(last), full=False)


def prompts_present(span: Sequence[MessageRecord], summary_body: dict[str, Any]) -> tuple[int, int]:
    """(prompts of the span found verbatim in the summary request, prompts of the span)."""
    prompts = human_prompts([row.to_node() for row in span])
    shown = request_texts(summary_body)
    return sum(p in shown for p in prompts), len(prompts)


@dataclass
class TruthRow:
    name: str
    step: int
    pre: int  # pre_tokens reported
    pre_real: int  # the fake's count of the request that would have been sent
    post: int  # post_tokens reported
    estimate: int  # GET /context right after
    next_real: int  # the next request, as the fake counted it
    files: int
    prompts: tuple[int, int]
    usage: int  # the compact run's usage (input, cached or not, and output)
    refused: str = ""

    @property
    def error(self) -> float:
        return ratio(self.estimate + CONTINUE_TOKENS, self.next_real) - 1

    @property
    def pre_error(self) -> float:
        return ratio(self.pre, self.pre_real) - 1

    @property
    def grew(self) -> bool:
        return self.next_real >= self.pre_real


CONTINUE = "continue"
CONTINUE_TOKENS = estimate_content([{"type": "text", "text": CONTINUE}])


async def compact_and_continue(
    h: Harness,
    client: httpx.AsyncClient,
    fake: httpx.AsyncClient,
    session_id: uuid.UUID,
    name: str,
    step: int,
) -> TruthRow:
    before = await call(client, "GET", f"/sessions/{session_id}/context/request")
    pre_real = counted(before)
    await record_bodies(fake)
    response = await client.post(f"/sessions/{session_id}/compact", json={})
    if response.status_code == 422:
        problem = response.json()
        return TruthRow(
            name,
            step,
            problem.get("pre_tokens") or 0,
            pre_real,
            problem.get("post_tokens") or 0,
            0,
            0,
            0,
            (0, 0),
            0,
            problem["type"],
        )
    if response.status_code != 200:
        raise BenchError(f"compact: {response.status_code} {response.text[:300]}")
    out = response.json()
    estimate = (await call(client, "GET", f"/sessions/{session_id}/context"))["estimated_tokens"]
    summaries = [r for r in await fake_records(fake) if is_summary_request(r.get("body"))]
    span = await compacted_span(h, out["boundary_uuid"])
    prompts = prompts_present(span, summaries[-1]["body"]) if summaries else (0, 0)
    view = await call(
        client, "GET", f"/sessions/{session_id}/messages", params={"view": "api", "limit": 1000}
    )
    files = sum(1 for m in view["data"] if m["subtype"] == "file")
    usage = out["run"]["usage"]
    await call(client, "POST", f"/sessions/{session_id}/messages", json={"content": CONTINUE})
    turn = [r for r in await fake_records(fake) if not is_summary_request(r.get("body"))]
    next_real = sum(int(turn[0]["usage"][k]) for k in USAGE_KEYS)
    return TruthRow(
        name,
        step,
        out["pre_tokens"],
        pre_real,
        out["post_tokens"],
        estimate,
        next_real,
        files,
        prompts,
        sum(int(usage.get(k, 0)) for k in (*USAGE_KEYS, "output_tokens")),
    )


async def part_truth(h: Harness) -> dict[str, Any]:
    section(
        "7. at each compaction point of the transcripts, three Parley compactions in a row "
        "(each followed by a turn): the figures against what the fake counted"
    )
    client, fake = await h.services()
    rows: list[TruthRow] = []
    points_done = 0
    for path in transcript_files(h.data, None):
        if h.plan.post_points is not None and points_done >= h.plan.post_points:
            break
        session_id = await import_transcript(client, path)
        patch = {"compaction": {"threshold_tokens": THRESHOLD}}
        await call(client, "PATCH", f"/sessions/{session_id}", json=patch)
        for point in await compaction_points(h, session_id):
            if h.plan.post_points is not None and points_done >= h.plan.post_points:
                break
            points_done += 1
            await call(
                client, "PUT", f"/sessions/{session_id}/head", json={"uuid": str(point.head)}
            )
            name = f"{label(path, h.data)} ({point.reason})"
            for step in (1, 2, 3):
                row = await compact_and_continue(h, client, fake, session_id, name, step)
                rows.append(row)
                print(f"  {truth_cells(row)}", flush=True)
                if row.refused:
                    break
    await call(fake, "POST", "/_fake/reset")
    return report_truth(rows)


TRUTH_HEADERS = [
    "point",
    "#",
    "pre",
    "pre (real)",
    "post",
    "estimate after",
    "next (real)",
    "error",
    "files",
    "prompts",
    "compact usage",
]


def truth_cells(r: TruthRow) -> list[str]:
    if r.refused:
        return [
            r.name,
            str(r.step),
            f"{r.pre:,}",
            f"{r.pre_real:,}",
            f"{r.post:,}",
            f"refused: {r.refused}",
            "",
            "",
            "",
            "",
            "",
        ]
    return [
        r.name,
        str(r.step),
        f"{r.pre:,}",
        f"{r.pre_real:,}",
        f"{r.post:,}",
        f"{r.estimate:,}",
        f"{r.next_real:,}",
        f"{r.error:+.1%}",
        str(r.files),
        f"{r.prompts[0]}/{r.prompts[1]}",
        f"{r.usage:,}",
    ]


def report_truth(rows: Sequence[TruthRow]) -> dict[str, Any]:
    done = [r for r in rows if not r.refused]
    if not done:
        raise BenchError("no compaction point to measure")
    print(table(TRUTH_HEADERS, [truth_cells(r) for r in rows]))
    errors = [abs(r.error) for r in done]
    pre_errors = [abs(r.pre_error) for r in done]
    grew = sum(r.grew or r.post >= r.pre for r in done)
    found = sum(r.prompts[0] for r in done)
    prompts = sum(r.prompts[1] for r in done)
    refused = [r for r in rows if r.refused]
    print(
        f"estimate right after compaction vs the next request: median error "
        f"{median(errors):.1%} {verdict(median(errors), TARGETS['after_median'])}, worst "
        f"{max(errors):.1%} {verdict(max(errors), TARGETS['after_worst'])} "
        f"({len(done)} compactions)"
    )
    print(
        f"pre_tokens vs the request that would have been sent: median error "
        f"{median(pre_errors):.1%}, worst {max(pre_errors):.1%}"
    )
    print(f"compactions that grew the context: {grew} {verdict(grew, 0)}")
    print(
        f"refused (nothing_to_gain): {len(refused)}; human prompts of the compacted spans "
        f"verbatim in the summary request: {found}/{prompts} "
        f"({ratio(found, prompts):.0%}) {verdict(ratio(found, prompts), 1.0, at_least=True)}"
    )
    print(
        f"files re-attached: {sum(r.files for r in done)} in {len(done)} compactions "
        f"(imported: from the conversation); compact runs' usage: "
        f"{sum(r.usage for r in done):,} tokens"
    )
    return {
        "rows": [{**r.__dict__, "error": r.error} for r in rows],
        "median_error": median(errors),
        "worst_error": max(errors),
        "grew": grew,
        "prompts_found": found,
        "prompts": prompts,
        "refused": len(refused),
    }


# --- 8. needless compactions in a scripted session ---------------------------------------------


def instruction_tokens(body: dict[str, Any]) -> int:
    """The fake's count of a cached-prefix summary request's final text block (the
    instruction, with any verbatim prompts before it)."""
    from tests.fake_anthropic.tokens import block_tokens

    last = body["messages"][-1]["content"]
    return int(block_tokens(last[-1])) if isinstance(last, list) and last else 0


async def part_needless(h: Harness) -> dict[str, Any]:
    plan = h.plan
    section(
        f"8. needless compactions: the cache session of part 5 ({plan.cache_turns} turns, "
        f"threshold {plan.cache_threshold:,}) on {MODEL_200K}, whose tokens the fake counts"
    )
    client, fake = await h.services()
    await record_bodies(fake)
    await call(fake, "POST", "/_fake/config", json={"record_bodies": True, "max_records": 5_000})
    session_id = await cache_session(h, client, model=MODEL_200K)
    records = await settle(fake)
    requests = [r for r in records if r.get("path") == "/v1/messages" and r.get("usage")]
    async with h.db.sessionmaker() as s:
        boundaries = list(
            await s.scalars(
                select(Message)
                .where(Message.session_id == session_id, Message.subtype == COMPACT_BOUNDARY)
                .order_by(Message.seq)
            )
        )
    summary_at = [i for i, r in enumerate(requests) if is_summary_request(r.get("body"))]
    cells, needless, grew, errors, rendered = [], 0, 0, [], 0
    found = prompts = 0
    for n, (i, boundary) in enumerate(zip(summary_at, boundaries, strict=False), 1):
        body = requests[i]["body"]
        usage = requests[i]["usage"]
        replaced: int | None = None
        if "<transcript>" in request_texts(body):
            rendered += 1
        else:
            replaced = sum(int(usage[k]) for k in USAGE_KEYS) - instruction_tokens(body)
        after = next((r for r in requests[i + 1 :] if not is_summary_request(r.get("body"))), None)
        next_real = sum(int(after["usage"][k]) for k in USAGE_KEYS) if after else 0
        meta = boundary.meta or {}
        post, pre = int(meta.get("post_tokens", 0)), int(meta.get("pre_tokens", 0))
        error = ratio(post, next_real) - 1 if next_real else 0.0
        errors.append(abs(error))
        needless += replaced is not None and replaced < plan.cache_threshold
        grew += bool(next_real and replaced is not None and next_real >= replaced)
        span = await compacted_span(h, str(boundary.uuid))
        got, total = prompts_present(span, body)
        found, prompts = found + got, prompts + total
        cells.append(
            [
                str(n),
                f"{pre:,}",
                f"{replaced:,}" if replaced is not None else "(rendered)",
                f"{post:,}",
                f"{next_real:,}",
                f"{error:+.1%}",
                f"{got}/{total}",
            ]
        )
    print(
        table(
            ["compaction", "pre", "replaced (real)", "post", "next (real)", "error", "prompts"],
            cells,
        )
    )
    session = (await call(client, "GET", f"/sessions/{session_id}"))["usage"]
    paid = {k: sum(int(r["usage"][k]) for r in requests) for k in (*USAGE_KEYS, "output_tokens")}
    counted_all = all(int(session[k]) == v for k, v in paid.items())
    print(
        f"compactions {len(boundaries)} ({rendered} summary requests rendered to text); "
        f"needless (the request replaced was under the threshold): {needless} "
        f"{verdict(needless, 0)}; grew: {grew} {verdict(grew, 0)}"
    )
    if errors:
        print(
            f"post_tokens vs the next request: median error {median(errors):.1%}, "
            f"worst {max(errors):.1%}"
        )
    print(
        f"human prompts of the compacted spans verbatim in the summary requests: "
        f"{found}/{prompts}; every call's usage on the session counters: "
        f"{'yes' if counted_all else 'NO'} ({sum(paid.values()):,} tokens in "
        f"{len(requests)} requests)"
    )
    await call(fake, "POST", "/_fake/reset")
    return {
        "compactions": len(boundaries),
        "needless": needless,
        "grew": grew,
        "median_error": median(errors) if errors else None,
        "prompts_found": found,
        "prompts": prompts,
        "usage_counted": counted_all,
    }


# --- running it -----------------------------------------------------------------------------


async def run_parts(h: Harness, parts: Sequence[int], profile: Path | None) -> dict[str, Any]:
    runners: dict[int, Callable[[], Awaitable[dict[str, Any]]]] = {
        1: lambda: part_micro(h),
        2: lambda: part_post(h),
        3: lambda: part_turn(h),
        4: lambda: part_time(h, profile),
        5: lambda: part_cache(h),
        6: lambda: part_imports(h),
        7: lambda: part_truth(h),
        8: lambda: part_needless(h),
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
        h = Harness(
            stack, plan, transcripts_folder(args.data), db_url, db, log_dir, args.profile_parley
        )
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
        ("imports", lambda r: r["worst_error"] <= TARGETS["import_error"]),
        (
            "truth",
            lambda r: (
                r["median_error"] <= TARGETS["after_median"]
                and r["worst_error"] <= TARGETS["after_worst"]
                and r["grew"] == 0
                and r["prompts_found"] == r["prompts"]
            ),
        ),
        (
            "needless",
            lambda r: (
                r["needless"] == 0
                and r["grew"] == 0
                and r["usage_counted"]
                and r["prompts_found"] == r["prompts"]
            ),
        ),
    ]
    ok = all(check(results[name]) for name, check in checks if name in results)
    return 0 if ok else 1


def parse_parts(text: str) -> list[int]:
    names = {v: k for k, v in PARTS.items()}
    parts = []
    for item in (p.strip() for p in text.split(",") if p.strip()):
        part = int(item) if item.isdigit() else names.get(item, 0)
        if part not in PARTS:
            raise SystemExit(f"unknown part {item!r}: 1-8 or {', '.join(PARTS.values())}")
        parts.append(part)
    return sorted(set(parts))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench compaction",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--part", default="1,2,3,4,5,6,7,8", help="parts to run: 1-8 or their names"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of small sizes")
    parser.add_argument("--no-save", action="store_true", help="no JSON in bench/results/")
    parser.add_argument(
        "--data",
        type=Path,
        help="transcripts folder (default: PARLEY_TRANSCRIPTS)",
    )
    parser.add_argument("--cache-threshold", type=int, help="part 5: threshold_tokens")
    parser.add_argument("--profile", type=Path, help="part 4: cProfile one compact() to FILE")
    parser.add_argument("--profile-parley", type=Path, help="run Parley under cProfile, to FILE")
    args = parser.parse_args(argv)
    if args.profile_parley:
        args.profile_parley = args.profile_parley.resolve()
    return asyncio.run(run(args, parse_parts(args.part)))
