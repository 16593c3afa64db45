"""Raw Messages API stream events in, `StreamEvent`s and the final message out.

Kept apart from the HTTP code so the protocol handling can be fed and tested directly,
and shared by the offline model, which produces the same wire events: both clients
then agree on deltas, tool-use readiness and truncation by construction.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import error_from_body
from .events import (
    MessageDone,
    MessageStart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseReady,
    empty_usage,
)
from .storable import storable, storable_text

__all__ = ["MessageAssembler"]

_USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
# Blocks whose input arrives as input_json_delta chunks.
_JSON_INPUT_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def _merge_usage(target: dict[str, int], source: object) -> None:
    if not isinstance(source, dict):
        return
    for key in _USAGE_KEYS:
        value = source.get(key)
        if isinstance(value, int):
            target[key] = value


class MessageAssembler:
    """Folds raw stream events (decoded JSON dicts) into `StreamEvent`s and the final message.

    Text, thinking and tool input chunks are collected in lists and joined once at
    `content_block_stop` (joining per delta would be quadratic in the block length).
    What Postgres cannot store (NUL, lone surrogates) is replaced as it arrives
    (`storable`), so the deltas and the final message agree.
    """

    __slots__ = (
        "_blocks",
        "_parts",
        "_truncated",
        "message_id",
        "model",
        "request_id",
        "started",
        "stop_reason",
        "stop_sequence",
        "stopped",
        "usage",
    )

    def __init__(self, request_id: str | None = None) -> None:
        self.request_id = request_id
        self.message_id = ""
        self.model = ""
        self.usage = empty_usage()
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.started = False
        self.stopped = False
        self._blocks: dict[int, dict[str, Any]] = {}
        self._parts: dict[int, list[str]] = {}
        self._truncated: list[str] = []

    def feed(self, event: dict[str, Any]) -> StreamEvent | list[StreamEvent] | None:
        """Apply one event; return what to yield (None for most bookkeeping events).

        Raises `ModelError` for an `error` event; `KeyError`, `TypeError` or
        `AttributeError` mean a malformed stream, which the caller reports as such.
        """
        etype = event["type"]
        if etype == "content_block_delta":
            index = event["index"]
            delta = event["delta"]
            dtype = delta["type"]
            if dtype == "text_delta":
                text = storable_text(delta["text"])
                self._parts[index].append(text)
                return TextDelta(index, text)
            if dtype == "input_json_delta":
                self._parts[index].append(delta["partial_json"])
                return None
            if dtype == "thinking_delta":
                thinking = storable_text(delta["thinking"])
                self._parts[index].append(thinking)
                return ThinkingDelta(index, thinking)
            if dtype == "signature_delta":
                self._blocks[index]["signature"] = delta["signature"]
            elif dtype == "citations_delta":
                block = self._blocks[index]
                citations = block.get("citations")
                if not isinstance(citations, list):
                    citations = block["citations"] = []
                citations.append(storable(delta["citation"]))
            return None
        if etype == "content_block_start":
            index = event["index"]
            block = storable(dict(event["content_block"]))
            self._blocks[index] = block
            btype = block.get("type")
            if btype == "text":
                self._parts[index] = [block.get("text") or ""]
            elif btype == "thinking":
                self._parts[index] = [block.get("thinking") or ""]
            elif btype in _JSON_INPUT_BLOCKS:
                self._parts[index] = []
            return None
        if etype == "content_block_stop":
            return self._finish_block(event["index"])
        if etype == "message_start":
            message = event["message"]
            self.message_id = message.get("id") or ""
            self.model = message.get("model") or ""
            _merge_usage(self.usage, message.get("usage"))
            self.started = True
            return MessageStart(self.message_id, self.model, dict(self.usage))
        if etype == "message_delta":
            delta = event.get("delta") or {}
            self.stop_reason = delta.get("stop_reason", self.stop_reason)
            self.stop_sequence = delta.get("stop_sequence", self.stop_sequence)
            _merge_usage(self.usage, event.get("usage"))
            return None
        if etype == "message_stop":
            return self.finish()
        if etype == "error":
            raise error_from_body(200, event, request_id=self.request_id)
        return None  # ping, and event types newer than this code

    def _finish_block(self, index: int) -> ToolUseReady | None:
        parts = self._parts.pop(index, None)
        if parts is None:
            return None
        block = self._blocks[index]
        btype = block.get("type")
        if btype == "text":
            block["text"] = "".join(parts)
            return None
        if btype == "thinking":
            block["thinking"] = "".join(parts)
            return None
        raw = "".join(parts)
        parsed: object
        if not raw:
            parsed = block.get("input") if isinstance(block.get("input"), dict) else {}
        else:
            try:
                parsed = storable(json.loads(raw))
            except ValueError:
                parsed = None
        if isinstance(parsed, dict):
            block["input"] = parsed
            return ToolUseReady(index, block) if btype == "tool_use" else None
        block["input"] = {}
        if btype == "tool_use":
            self._truncated.append(block["id"])
        return None

    def finish(self) -> list[StreamEvent]:
        """Close blocks that never got a stop event, then the final `MessageDone`."""
        out: list[StreamEvent] = []
        for index in sorted(self._parts):
            ready = self._finish_block(index)
            if ready is not None:
                out.append(ready)
        self.stopped = True
        out.append(
            MessageDone(
                content=[self._blocks[i] for i in sorted(self._blocks)],
                stop_reason=self.stop_reason,
                stop_sequence=self.stop_sequence,
                usage=dict(self.usage),
                model=self.model,
                message_id=self.message_id,
                request_id=self.request_id,
                truncated_tool_use_ids=tuple(self._truncated),
            )
        )
        return out
