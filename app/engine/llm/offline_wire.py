"""The offline model's reply as Messages API stream events, cut at the `max_tokens` budget.

Blocks are sent in small deltas, as the API sends them, so the assembler and the
clients downstream see a real stream: text and thinking in pieces ending at word
boundaries, tool input as `input_json_delta` fragments, thinking signed at its end.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

from app.context.models import OFFLINE_MODEL

__all__ = ["CHARS_PER_TOKEN", "ReplyBlock", "render_wire_events"]

CHARS_PER_TOKEN: Final = 4
_TEXT_CHUNK: Final = 24  # characters per text or thinking delta, at word boundaries
_JSON_CHUNK: Final = 16  # characters per input_json_delta


@dataclass(frozen=True, slots=True)
class ReplyBlock:
    """One content block of a planned reply, before it is cut into deltas."""

    kind: Literal["thinking", "text", "tool_use"]
    text: str = ""
    name: str = ""
    input: dict[str, Any] | None = None


def _chunks(text: str, size: int) -> Iterator[str]:
    """Pieces of about `size` characters, ending after a space when one is near."""
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            space = text.find(" ", end, start + 2 * size)
            if space != -1:
                end = space + 1
        yield text[start:end]
        start = end


def render_wire_events(
    blocks: list[ReplyBlock],
    stop_reason: str,
    *,
    message_id: str,
    tool_id_prefix: str,
    input_tokens: int,
    budget: int,
) -> list[dict[str, Any]]:
    """Wire events for `blocks`, cut at `budget` characters like a max_tokens stop."""
    usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": OFFLINE_MODEL,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        }
    ]
    produced = 0
    cut = False
    tool_number = 0
    for index, block in enumerate(blocks):
        if produced >= budget:
            cut = True
            break
        room = budget - produced
        if block.kind == "tool_use":
            tool_number += 1
            start: dict[str, Any] = {
                "type": "tool_use",
                "id": f"{tool_id_prefix}{tool_number}",
                "name": block.name,
                "input": {},
            }
            payload = json.dumps(block.input, ensure_ascii=False)
            pieces = ["", *_chunks(payload, _JSON_CHUNK)]
            delta_type, key = "input_json_delta", "partial_json"
        elif block.kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            payload = block.text
            pieces = list(_chunks(payload, _TEXT_CHUNK))
            delta_type, key = "thinking_delta", "thinking"
        else:
            start = {"type": "text", "text": ""}
            payload = block.text
            pieces = list(_chunks(payload, _TEXT_CHUNK))
            delta_type, key = "text_delta", "text"
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        for piece in pieces:
            if len(piece) > room:
                piece = piece[:room]
                cut = True
            if piece or delta_type == "input_json_delta":
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": delta_type, key: piece},
                    }
                )
            room -= len(piece)
            produced += len(piece)
            if cut:
                break
        if block.kind == "thinking":
            signature = hashlib.sha256(payload.encode()).hexdigest()
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": f"offline-{signature}"},
                }
            )
        events.append({"type": "content_block_stop", "index": index})
        if cut:
            break
    output_tokens = max(1, -(-produced // CHARS_PER_TOKEN))
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens" if cut else stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        }
    )
    events.append({"type": "message_stop"})
    return events
