"""Prompt-cache breakpoints for a request, placed so a growing conversation is read
from the cache turn after turn.

The prompt is cached by prefix in the order tools, system, messages. Four breakpoints
at most (the API refuses a fifth), each on a block that can carry `cache_control`:

1. the last tool definition (tools rarely change: their prefix outlives a compaction);
2. the last system block;
3. the last block of the last message: writes the whole prompt for the next turn;
4. the last block of the last user message before the final one: where the previous
   request of an agent loop ended (`[..., U_prev] -> [..., U_prev, A, U_new]`), so the
   prefix written there last turn is read even when the new turn added more than the
   20 blocks the API looks back from a breakpoint.

Thinking and redacted_thinking blocks cannot carry a mark: the nearest earlier
cacheable block of the same message takes it, or the message gets none. Marks found on
the inputs are removed: this function owns placement, which is how the total stays at
most four. It returns new containers and copies only what it marks or unmarks; the
inputs are never changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from app.context.types import CACHEABLE_BLOCK_TYPES, USER, ApiMessage, Block

TTL_VALUES = (None, "5m", "1h")


def cache_mark(ttl: str | None = None) -> dict[str, str]:
    """The `cache_control` value: ephemeral, with `"ttl": "1h"` for the long lifetime."""
    if ttl not in TTL_VALUES:
        raise ValueError(f"cache ttl must be one of {TTL_VALUES}, not {ttl!r}")
    return {"type": "ephemeral", "ttl": "1h"} if ttl == "1h" else {"type": "ephemeral"}


def _unmarked(blocks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A new list with any stored cache_control removed (copying only those blocks)."""
    return [
        {k: v for k, v in b.items() if k != "cache_control"} if "cache_control" in b else b
        for b in blocks
    ]


def _mark_last(blocks: list[dict[str, Any]], mark: dict[str, str]) -> bool:
    """Mark the last cacheable block of `blocks` in place (the list is ours); the block
    itself is replaced by a marked copy. False when no block can carry a mark."""
    for k in range(len(blocks) - 1, -1, -1):
        block = blocks[k]
        if block.get("type", "text") in CACHEABLE_BLOCK_TYPES:
            blocks[k] = {**block, "cache_control": mark}
            return True
    return False


def _message_content(message: ApiMessage) -> list[Block]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content or ())


def add_cache_breakpoints(
    system: str | list[Block] | None,
    tools: list[dict[str, Any]],
    messages: list[ApiMessage],
    *,
    ttl: str | None = None,
    unmarked: bool = False,
) -> tuple[list[Block] | None, list[dict[str, Any]], list[ApiMessage]]:
    """`(system, tools, messages)` with cache breakpoints placed (see module doc).
    A string system prompt comes back as one text block; None or empty stays as given.
    `unmarked`: the messages carry no mark (`normalize_for_api` made them), so they are
    not searched for one (a pass over every block of the view)."""
    mark = cache_mark(ttl)

    new_tools = _unmarked(tools)
    if new_tools:
        new_tools[-1] = {**new_tools[-1], "cache_control": mark}

    new_system: list[Block] | None
    if isinstance(system, str):
        new_system = [{"type": "text", "text": system}] if system else None
    else:
        new_system = _unmarked(system) if system else system
    if new_system:
        _mark_last(new_system, mark)

    new_messages = list(messages)
    # Stored marks are removed first (normalize_for_api already drops them; callers
    # may not have normalised), then at most two are placed.
    for i, message in enumerate(() if unmarked else new_messages):
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if "cache_control" in block:
                    new_messages[i] = {**message, "content": _unmarked(content)}
                    break
    targets: list[int] = []
    if new_messages:
        targets.append(len(new_messages) - 1)
        for i in range(len(new_messages) - 2, -1, -1):
            if new_messages[i].get("role") == USER:
                targets.append(i)
                break
    for i in targets:
        content = _message_content(new_messages[i])
        if _mark_last(content, mark):
            new_messages[i] = {**new_messages[i], "content": content}
    return new_system, new_tools, new_messages


def cache_cold(last_request_at: datetime | None, ttl_seconds: float, now: datetime) -> bool:
    """Whether the prompt cache of a session's prefix is cold: expired, or never written
    (a session Parley never sent, such as an imported transcript: whatever the source
    cached is not Parley's prefix). A cold prefix is written afresh by the next request
    whatever it holds, so clearing or rendering it costs no cache read."""
    if last_request_at is None:
        return True
    if last_request_at.tzinfo is None:
        last_request_at = last_request_at.replace(tzinfo=UTC)
    return now - last_request_at > timedelta(seconds=ttl_seconds)
