"""A session's settings as the context code needs them: a plain value, built once per
request or step from the stored session and the service defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.context.tools import compactable_tools, tool_definitions
from app.context.types import Block


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """The effective compaction settings (the session's own, defaults filled in)."""

    auto: bool
    threshold_tokens: int | None
    context_window: int | None
    keep_recent_tool_results: int
    micro_batch_tokens: int
    micro: bool
    collapse_at: float


@dataclass(frozen=True, slots=True)
class SessionConfig:
    model: str
    system: str | list[Block] | None
    tools: list[dict[str, Any]]  # client tool definitions, as stored (Parley keys included)
    builtin_tools: list[str]
    max_tokens: int | None
    thinking: dict[str, Any] | None
    compaction: CompactionConfig
    # derived once: every request and estimate of the session uses them
    tool_definitions: list[dict[str, Any]] = field(init=False)
    compactable: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "tool_definitions", tool_definitions(self.builtin_tools, self.tools)
        )
        object.__setattr__(self, "compactable", compactable_tools(self.tools))
