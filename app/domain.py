"""The vocabulary of runs, shared by every layer: statuses, kinds, and the typed JSON
values a run row carries between the routes, the loop and compaction."""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    REQUIRES_ACTION = "requires_action"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_active(self) -> bool:
        """Active runs hold their session (at most one per session)."""
        return self in ACTIVE_RUN_STATUSES

    @property
    def is_final(self) -> bool:
        return self in FINAL_RUN_STATUSES


ACTIVE_RUN_STATUSES = (RunStatus.RUNNING, RunStatus.REQUIRES_ACTION)
FINAL_RUN_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


# The usage figures a model response reports that are summed on the run, the session
# and the metrics (every model call counts: turns, summaries, collapses).
USAGE_COUNTERS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def usage_counts(usage: dict[str, Any] | None) -> dict[str, int]:
    """The counters of a response's usage (nested objects and unknown keys left out)."""
    return {
        key: int(value)
        for key, value in (usage or {}).items()
        if key in USAGE_COUNTERS and isinstance(value, int) and not isinstance(value, bool)
    }


class RunKind(StrEnum):
    TURN = "turn"
    COMPACT = "compact"


class CompactionTrigger(StrEnum):
    AUTO = "auto"
    MANUAL = "manual"
    REACTIVE = "reactive"


class IfBusy(StrEnum):
    """What posting a turn does while the session has an active run."""

    REJECT = "reject"
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"


class _Stored(BaseModel):
    # Rows written by older versions may carry keys this one does not know: keep them.
    model_config = ConfigDict(extra="allow")


class RunParams(_Stored):
    """What the client asked for, kept on the run until it starts (a queued turn)."""

    content: str | list[dict[str, Any]] | None = None  # the user turn (None: no new message)
    parent_uuid: uuid.UUID | None = None  # branch from here instead of the head
    regenerate: uuid.UUID | None = None  # the assistant reply being regenerated
    instructions: str | None = None  # a manual compaction's focus
    webhook_url: str | None = None  # told of this run's events as well (per-turn webhook)


class ToolResult(_Stored):
    content: str | list[dict[str, Any]]
    is_error: bool = False


class CompactionOutcome(_Stored):
    boundary_uuid: uuid.UUID
    summary_uuid: uuid.UUID
    summary: str
    pre_tokens: int
    post_tokens: int
    tokens_saved: int
    messages_compacted: int
    trigger: CompactionTrigger


class RunState(_Stored):
    """Loop state that must outlive the task running it."""

    model_calls: int = 0
    # tool results computed before a pause for client tools, by tool_use id
    results: dict[str, ToolResult] = {}
    compaction: CompactionOutcome | None = None  # what a `compact` run did
