"""Script items: their normalisation, and small constructors for tests.

Item shapes (JSON):

- ``{"type": "message", "content": [blocks], "stop_reason": ..., "stop_sequence": null,
  "usage": {"output_tokens": N}}``. Blocks: ``{"type": "text", "text": ...}``,
  ``{"type": "tool_use", "name": ..., "input": {...}, "id": optional}``,
  ``{"type": "thinking", "thinking": ...}`` (the fake signs it),
  ``{"type": "redacted_thinking", "data": optional}``. Without ``content`` the default
  reply is used; ``stop_reason`` defaults to ``tool_use`` when there is a tool_use block,
  else ``end_turn``. A bare string is a one-text-block message.
- ``{"type": "error", "status": 429, "error_type": "rate_limit_error", "message": "...",
  "retry_after": 1, "retry_after_ms": ..., "should_retry": bool, "details": {...},
  "headers": {...}}``; only ``status`` is required.
- ``{"type": "stream_error", "after_events": K, "error_type": "overloaded_error",
  "message": "Overloaded", ...message fields}``: a 200 stream, K events, then ``event: error``.
- ``{"type": "drop", "after_events": K, ...message fields}``: K events, then the TCP
  connection is closed mid-body.

Any item may carry ``"delay": seconds`` (slept before the answer starts).
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "DEFAULT_ERROR_MESSAGES",
    "ERROR_TYPES_BY_STATUS",
    "drop",
    "error",
    "message",
    "normalize_item",
    "overloaded",
    "rate_limit",
    "stream_error",
    "text",
    "thinking",
    "tool_use",
]

ERROR_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
DEFAULT_ERROR_MESSAGES = {
    "invalid_request_error": "Invalid request",
    "authentication_error": "invalid x-api-key",
    "billing_error": "Your credit balance is too low to access the Anthropic API.",
    "permission_error": "Your API key does not have permission to use the specified resource.",
    "not_found_error": "Not found",
    "timeout_error": "Request timed out",
    "conflict_error": "Conflict",
    "request_too_large": "Request exceeds the maximum allowed number of bytes.",
    "rate_limit_error": "This request would exceed the rate limit for your organization. "
    "Please try again later.",
    "api_error": "Internal server error",
    "overloaded_error": "Overloaded",
}
OUTPUT_BLOCK_TYPES = frozenset({"text", "tool_use", "thinking", "redacted_thinking"})
STOP_REASONS = frozenset(
    {
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    }
)
ITEM_TYPES = frozenset({"message", "error", "stream_error", "drop"})


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    return float(value)


def _normalize_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ValueError(f"content must be a list of blocks, got {content!r}")
    out: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, str):
            block = {"type": "text", "text": block}
        if not isinstance(block, dict) or block.get("type") not in OUTPUT_BLOCK_TYPES:
            raise ValueError(
                f"content blocks must be one of {sorted(OUTPUT_BLOCK_TYPES)}, got {block!r}"
            )
        kind = block["type"]
        if kind == "text" and not isinstance(block.get("text"), str):
            raise ValueError(f"a text block needs a string 'text': {block!r}")
        if kind == "tool_use":
            if not isinstance(block.get("name"), str):
                raise ValueError(f"a tool_use block needs a string 'name': {block!r}")
            if not isinstance(block.get("input", {}), dict):
                raise ValueError(f"a tool_use block's 'input' must be an object: {block!r}")
        if kind == "thinking" and not isinstance(block.get("thinking"), str):
            raise ValueError(f"a thinking block needs a string 'thinking': {block!r}")
        out.append(copy.deepcopy(block))
    return out


def normalize_item(item: Any) -> dict[str, Any]:
    """A checked copy of a script item; raises ValueError (so mistakes show at script time)."""
    if isinstance(item, str):
        item = {"type": "message", "content": [{"type": "text", "text": item}]}
    if not isinstance(item, dict):
        raise ValueError(f"a script item must be an object or a string, got {item!r}")
    out = copy.deepcopy(item)
    kind = out.setdefault("type", "message")
    if kind not in ITEM_TYPES:
        raise ValueError(f"unknown script item type {kind!r}; expected one of {sorted(ITEM_TYPES)}")
    if "delay" in out:
        out["delay"] = _number(out["delay"], "delay")
    if kind == "error":
        status = out.get("status")
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"an error item needs an HTTP error 'status', got {status!r}")
        out.setdefault("error_type", ERROR_TYPES_BY_STATUS.get(status, "api_error"))
        out.setdefault("message", DEFAULT_ERROR_MESSAGES.get(out["error_type"], "Error"))
        for key in ("retry_after", "retry_after_ms"):
            if out.get(key) is not None:
                _number(out[key], key)
        return out
    if "text" in out and "content" not in out:
        out["content"] = [{"type": "text", "text": out.pop("text")}]
    if out.get("content") is not None:
        out["content"] = _normalize_blocks(out["content"])
    stop = out.get("stop_reason")
    if stop is not None and stop not in STOP_REASONS:
        raise ValueError(f"unknown stop_reason {stop!r}")
    usage = out.get("usage")
    if usage is not None and (
        not isinstance(usage, dict)
        or not isinstance(usage.get("output_tokens", 0), int)
        or isinstance(usage.get("output_tokens", 0), bool)
    ):
        raise ValueError(f"usage must be {{'output_tokens': int}}, got {usage!r}")
    if kind in ("stream_error", "drop"):
        k = out.setdefault("after_events", 0)
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"after_events must be a non-negative int, got {k!r}")
    if kind == "stream_error":
        out.setdefault("error_type", "overloaded_error")
        out.setdefault("message", DEFAULT_ERROR_MESSAGES.get(out["error_type"], "Error"))
    return out


# ---- constructors -------------------------------------------------------------------------


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(
    name: str, input: dict[str, Any] | None = None, id: str | None = None
) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_use", "name": name, "input": input or {}}
    if id is not None:
        block["id"] = id
    return block


def thinking(value: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": value}


def message(
    *blocks: dict[str, Any] | str,
    stop_reason: str | None = None,
    stop_sequence: str | None = None,
    output_tokens: int | None = None,
    delay: float | None = None,
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "message",
        "content": [text(b) if isinstance(b, str) else b for b in blocks],
    }
    if stop_reason is not None:
        item["stop_reason"] = stop_reason
    if stop_sequence is not None:
        item["stop_sequence"] = stop_sequence
    if output_tokens is not None:
        item["usage"] = {"output_tokens": output_tokens}
    if delay is not None:
        item["delay"] = delay
    return item


def error(
    status: int,
    message: str | None = None,
    *,
    error_type: str | None = None,
    retry_after: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "error", "status": status, **extra}
    if message is not None:
        item["message"] = message
    if error_type is not None:
        item["error_type"] = error_type
    if retry_after is not None:
        item["retry_after"] = retry_after
    return item


def rate_limit(retry_after: float | None = 1, message: str | None = None) -> dict[str, Any]:
    return error(429, message, retry_after=retry_after)


def overloaded() -> dict[str, Any]:
    return error(529)


def stream_error(
    after_events: int,
    *blocks: dict[str, Any] | str,
    error_type: str = "overloaded_error",
    message: str | None = None,
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "stream_error",
        "after_events": after_events,
        "error_type": error_type,
    }
    if message is not None:
        item["message"] = message
    if blocks:
        item["content"] = [text(b) if isinstance(b, str) else b for b in blocks]
    return item


def drop(after_events: int, *blocks: dict[str, Any] | str) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "drop", "after_events": after_events}
    if blocks:
        item["content"] = [text(b) if isinstance(b, str) else b for b in blocks]
    return item
