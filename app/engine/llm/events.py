"""What one model response looks like while it streams, as plain immutable values.

The agent loop and compaction's summary request consume these from any `ModelClient`
(the Anthropic adapter or the offline stand-in), so they never see SDK types or raw
SSE. Deltas carry only what the client shows live; `MessageDone` carries the whole
message exactly as a non-streamed Messages API response would hold it, which is what
gets stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = [
    "MessageDone",
    "MessageStart",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolUseReady",
    "empty_usage",
]


def empty_usage() -> dict[str, int]:
    """The four usage counters the service accounts on, all zero."""
    return {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }


@dataclass(frozen=True, slots=True)
class MessageStart:
    """The response began: its id, the model that answers, and the input usage."""

    message_id: str
    model: str
    usage: dict[str, int]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the text block at content `index`."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    """A piece of the thinking block at content `index`."""

    index: int
    thinking: str


@dataclass(frozen=True, slots=True)
class ToolUseReady:
    """A `tool_use` block whose input JSON is complete, so it can be shown or started.

    Sent for every `tool_use` block, built-in and client tools alike; server tool
    blocks (`server_tool_use`, `mcp_tool_use`) get none. `block` is
    `{"type": "tool_use", "id", "name", "input"}` and is the same object as in
    `MessageDone.content`: treat it as read-only. A tool use whose input was cut off (by
    `max_tokens`) never gets this event; see `MessageDone.truncated_tool_use_ids`.
    """

    index: int
    block: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MessageDone:
    """The response ended normally; `content` is the complete message.

    A tool use whose input JSON could not be parsed is kept in `content` with
    `input: {}` (so the history stays a valid tool_use/tool_result pairing) and its id
    is listed in `truncated_tool_use_ids`, so the loop can answer it with an error.
    """

    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: dict[str, int]
    model: str
    message_id: str
    request_id: str | None
    truncated_tool_use_ids: tuple[str, ...] = ()


StreamEvent: TypeAlias = MessageStart | TextDelta | ThinkingDelta | ToolUseReady | MessageDone
