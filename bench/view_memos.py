"""What a turn's pure context work costs as a session grows, with the session's memos
and without them, side by side in one run.

The workload is an agent session of tool rounds (an assistant message calling Read, a
user message holding its 3,000-character result) behind a micro-compaction watermark
40 rows from the end, the shape of a long Claude Code session. Each timed turn adds a
round, then runs what the loop runs before a model request: the projection
(`projection.project`), micro-compaction's plan (`micro.plan_micro`), the anchored
estimate, the request body (`request.build_body`) and the request's estimate. With
memos, one `views.ViewMemos` is kept across the turns, as the loop keeps one per
session; without, each call starts from the first row. The two variants alternate turn
by turn; the process CPU of each is summed over its turns. The memos must not change
a result: every turn's body and figures are compared between the two.

    uv run python -m bench view_memos [--quick] [--turns N]
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from app.config import Settings
from app.context.estimates import REQUEST_ESTIMATE, anchored_estimate, request_estimate
from app.context.micro import plan_micro
from app.context.projection import project
from app.context.request import build_body
from app.context.types import ASSISTANT, USER, Node
from app.conversation.sessions import config_of
from app.conversation.views import ViewMemos
from app.models import AgentSession
from bench.common import ratio, section, table

SIZES = (200, 1_000, 3_000)
QUICK_SIZES = (100, 400)
WATERMARK_BACK = 40  # rows after the micro watermark
# A session with the service's default settings (compaction on) and the Read tool.
CONFIG = config_of(
    AgentSession(
        model="claude-sonnet-4-5", system="You are a coding agent.", builtin_tools=["Read"]
    ),
    Settings(model_provider="offline"),
)


def tool_round(i: int) -> list[Node]:
    """An assistant message calling Read (its usage measured its request) and the result."""
    call = {
        "type": "tool_use",
        "id": f"toolu_{i}",
        "name": "Read",
        "input": {"file_path": f"{i}.py"},
    }
    result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "x" * 3_000}
    return [
        Node(
            str(uuid.uuid4()),
            ASSISTANT,
            ASSISTANT,
            [call],
            token_estimate=40,
            usage={"input_tokens": 1_000 * i, "output_tokens": 30},
            meta={REQUEST_ESTIMATE: 950 * i},
        ),
        Node(str(uuid.uuid4()), USER, USER, [result], token_estimate=760),
    ]


def turn_work(nodes: list[Node], watermark: int, memos: ViewMemos | None) -> tuple[Any, ...]:
    """What the loop computes from the view before a model request."""
    projected = project(
        nodes,
        snipped=set(),
        watermark=watermark,
        compactable=CONFIG.compactable,
        collapses=[],
        memo=memos.clear if memos else None,
    )
    settings = CONFIG.compaction
    plan = plan_micro(
        nodes,
        watermark=watermark,
        compactable=CONFIG.compactable,
        keep_recent=settings.keep_recent_tool_results,
        batch_tokens=settings.micro_batch_tokens,
        cache_cold=False,
        memo=memos.scan if memos else None,
    )
    tokens = memos.tokens if memos else None
    estimate = anchored_estimate(CONFIG, projected, tokens)
    body = build_body(CONFIG, projected, memo=memos.merge if memos else None)
    return plan, estimate, body, request_estimate(CONFIG, projected, tokens)


def cpu(nodes: list[Node], watermark: int, memos: ViewMemos | None) -> tuple[float, Any]:
    """`turn_work` and the process CPU it took."""
    started = time.process_time()
    out = turn_work(nodes, watermark, memos)
    return time.process_time() - started, out


def measure(size: int, turns: int) -> dict[str, float]:
    first = [
        Node("start", USER, USER, [{"type": "text", "text": "Fix the tests."}], token_estimate=5)
    ]
    for i in range(1, size // 2 + 1):
        first += tool_round(i)
    watermark = len(first) - WATERMARK_BACK
    memos = ViewMemos()
    nodes = first
    turn_work(nodes, watermark, memos)  # the session's first request here fills the memos
    spent = {"memos": 0.0, "none": 0.0}
    for k in range(turns):
        nodes = nodes + tool_round(size + k)
        order = ("memos", "none") if k % 2 == 0 else ("none", "memos")
        results = {}
        for variant in order:
            seconds, results[variant] = cpu(nodes, watermark, memos if variant == "memos" else None)
            spent[variant] += seconds
        if results["memos"] != results["none"]:
            raise SystemExit(f"the memos changed a result at {len(nodes)} rows")
    return {name: seconds / turns for name, seconds in spent.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench view_memos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sessions, few turns")
    parser.add_argument("--turns", type=int, default=50, help="timed turns per size")
    args = parser.parse_args(argv)
    sizes, turns = (QUICK_SIZES, 5) if args.quick else (SIZES, args.turns)
    section(f"a turn's pure context work, {turns} turns per size (process CPU per turn)")
    rows = []
    for size in sizes:
        figures = measure(size, turns)
        rows.append(
            [
                f"{size:,} rows",
                f"{figures['memos'] * 1e3:.2f} ms",
                f"{figures['none'] * 1e3:.2f} ms",
                f"{ratio(figures['memos'], figures['none']):.3f}",
            ]
        )
    print(table(["session", "with memos", "without", "with / without"], rows))
    print("(the same body, plan and figures both ways on every turn)")
    return 0
