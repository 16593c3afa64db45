"""Running the tool calls of one model response.

Built-in tools run here against the session's workspace; consecutive read-only ones run
concurrently, a writing tool alone and in order, each in its own transaction. A writing
tool's result is recorded on the run (`record`) in that transaction, so its effect and
the record that it ran commit together: a resumed run does not apply it twice. The
result message follows in the loop's next step.
Client tools are left waiting for the client; a call to a tool the session does not
offer, or one cut off by the output limit, is answered with an error the model can act on.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.config import Settings
from app.context.session import SessionConfig
from app.context.tools import READ_ONLY_TOOLS, client_tool_names
from app.context.types import Block
from app.conversation.files import DbWorkspace, limits_of
from app.db import Database
from app.domain import ToolResult
from app.engine.tools.builtin import ToolOutcome, run_builtin, truncate_middle

TRUNCATED_TOOL_TEXT = (
    "The input of this tool call was cut off by the output token limit, so the tool did not "
    "run. Call it again with a shorter input."
)


@dataclass
class ToolRound:
    """The tool calls of one response: results so far (filled in as tools finish, so a
    cancel keeps what ran) and the client calls left waiting."""

    uses: list[Block]
    results: dict[str, ToolResult] = field(default_factory=dict)
    waiting: list[Block] = field(default_factory=list)

    def result_blocks(self) -> list[Block]:
        return [
            {
                "type": "tool_result",
                "tool_use_id": use["id"],
                "content": self.results[use["id"]].content,
                "is_error": self.results[use["id"]].is_error,
            }
            for use in self.uses
        ]


def plan_round(
    config: SessionConfig, uses: list[Block], truncated: set[str]
) -> tuple[ToolRound, list[Block]]:
    """The round, and the built-in calls it must run."""
    builtin = set(config.builtin_tools)
    client = client_tool_names(config.tools)
    round_ = ToolRound(uses)
    to_run: list[Block] = []
    for use in uses:
        if use["id"] in truncated:
            round_.results[use["id"]] = ToolResult(content=TRUNCATED_TOOL_TEXT, is_error=True)
        elif use["name"] in builtin:
            to_run.append(use)
        elif use["name"] in client:
            round_.waiting.append(use)
        else:
            round_.results[use["id"]] = ToolResult(
                content=f"Unknown tool {use['name']!r}: it is not available in this session",
                is_error=True,
            )
    return round_, to_run


Record = Callable[[AsyncSession, str, ToolResult], Awaitable[None]]


async def run_builtins(
    db: Database,
    session_id: uuid.UUID,
    uses: list[Block],
    round_: ToolRound,
    settings: Settings,
    record: Record | None = None,
) -> None:
    """Consecutive read-only tools run concurrently; a writing tool runs alone, in order."""
    batch: list[Block] = []
    for use in [*uses, None]:
        if use is not None and use["name"] in READ_ONLY_TOOLS:
            batch.append(use)
            continue
        if batch:
            outcomes = await asyncio.gather(*(_run_one(db, session_id, u, settings) for u in batch))
            round_.results.update(zip((u["id"] for u in batch), outcomes, strict=True))
            batch = []
        if use is not None:
            round_.results[use["id"]] = await _run_one(db, session_id, use, settings, record)


async def _run_one(
    db: Database,
    session_id: uuid.UUID,
    use: Block,
    settings: Settings,
    record: Record | None = None,
) -> ToolResult:
    """One call in its own transaction, stopped after the tool time limit (its writes
    roll back with the transaction). A writing tool's result is recorded (`record`) in
    the transaction of its effect, so a resumed run never applies it twice."""
    limit = settings.tool_timeout_seconds
    try:
        async with asyncio.timeout(limit), db.transaction() as tx:
            workspace = DbWorkspace(tx, session_id, limits_of(settings))
            outcome = await run_builtin(use["name"], use["input"], workspace)
            result = ToolResult(
                content=truncate_middle(outcome.content, settings.tool_result_max_chars),
                is_error=outcome.is_error,
            )
            if record is not None and use["name"] not in READ_ONLY_TOOLS:
                await record(tx, use["id"], result)
    except TimeoutError:
        outcome = ToolOutcome(
            f"{use['name']} was stopped after {limit:g} seconds, its time limit, and changed "
            "nothing; narrow it (a more specific path, glob or pattern) and call it again",
            is_error=True,
        )
        result = ToolResult(content=outcome.content, is_error=True)
    metrics.tool_calls.labels(use["name"], str(outcome.is_error).lower()).inc()
    return result
