"""The fake's deterministic token estimate, and the prompt as a sequence of cacheable blocks.

The estimate (exported so tests can compute expected numbers):

    block tokens = ceil(chars(block) / CHARS_PER_TOKEN) + BLOCK_OVERHEAD_TOKENS
    request tokens = sum of block tokens over every prompt block

Prompt blocks, in order: each tool definition, each system text block (a ``system`` string
is one block), then each content block of each message (a string ``content`` is one text
block). Consecutive same-role messages are merged first, as the real API does; merging
changes no count.

``chars(block)`` by block type:

- ``text``: ``len(text)``
- ``thinking``: ``len(thinking)`` (the signature is free); ``redacted_thinking``: ``len(data)``
- ``tool_use`` / ``server_tool_use``: ``len(name) + len(compact_json(input))``
- ``tool_result``: its ``content`` string length, or the sum over its nested blocks
  (``text`` -> ``len(text)``, ``image`` -> ``IMAGE_TOKENS * CHARS_PER_TOKEN``, others ->
  compact JSON)
- ``image``: ``IMAGE_TOKENS * CHARS_PER_TOKEN``
- a tool definition, or any other block: ``len(compact_json(block without cache_control))``

``compact_json`` is ``json.dumps(x, separators=(",", ":"), ensure_ascii=False,
sort_keys=True)``. CHARS_PER_TOKEN is the 2.8 characters per token of real Claude Code
transcripts, so the service's estimates relate to these counts as they do to the real API's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

# The median of real Claude Code transcripts (as in app/context/tokens.py), so that the service's
# estimates and the fake's counts agree the way they do against the real API.
CHARS_PER_TOKEN = 2.8
BLOCK_OVERHEAD_TOKENS = 3
IMAGE_TOKENS = 1600

__all__ = [
    "BLOCK_OVERHEAD_TOKENS",
    "CHARS_PER_TOKEN",
    "IMAGE_TOKENS",
    "PromptBlock",
    "block_chars",
    "block_tokens",
    "compact_json",
    "count_tokens",
    "merge_messages",
    "normalize_content",
    "output_tokens",
    "prompt_blocks",
    "tool_tokens",
]


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b)


def _strip(block: dict[str, Any]) -> dict[str, Any]:
    """The block without its cache_control key (and without keys set to None)."""
    return {k: v for k, v in block.items() if k != "cache_control" and v is not None}


def _nested_chars(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    total = 0
    if isinstance(content, list):
        for item in content:
            if not isinstance(item, dict):
                total += len(compact_json(item))
            elif item.get("type") == "text" and isinstance(item.get("text"), str):
                total += len(item["text"])
            elif item.get("type") == "image":
                total += int(IMAGE_TOKENS * CHARS_PER_TOKEN)
            else:
                total += len(compact_json(_strip(item)))
        return total
    return len(compact_json(content))


def block_chars(block: dict[str, Any]) -> int:
    """Characters a message or system content block counts for (see module docstring)."""
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return len(text) if isinstance(text, str) else 0
    if kind == "thinking":
        text = block.get("thinking")
        return len(text) if isinstance(text, str) else 0
    if kind == "redacted_thinking":
        data = block.get("data")
        return len(data) if isinstance(data, str) else 0
    if kind in ("tool_use", "server_tool_use"):
        return len(str(block.get("name", ""))) + len(compact_json(block.get("input", {})))
    if kind == "tool_result":
        return _nested_chars(block.get("content"))
    if kind == "image":
        return int(IMAGE_TOKENS * CHARS_PER_TOKEN)
    return len(compact_json(_strip(block)))


def block_tokens(block: dict[str, Any]) -> int:
    """Tokens of one message or system content block."""
    return _ceil_div(block_chars(block), CHARS_PER_TOKEN) + BLOCK_OVERHEAD_TOKENS


def tool_tokens(tool: dict[str, Any]) -> int:
    """Tokens of one tool definition."""
    return _ceil_div(len(compact_json(_strip(tool))), CHARS_PER_TOKEN) + BLOCK_OVERHEAD_TOKENS


def output_tokens(content: list[dict[str, Any]]) -> int:
    """The fake's output token count for generated content: ceil(chars / 4), at least 1."""
    chars = sum(block_chars(b) for b in content)
    return max(1, _ceil_div(chars, CHARS_PER_TOKEN))


def normalize_content(content: Any) -> list[Any]:
    """Message content as a list of blocks (a string is one text block; "" is no block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return content
    return []


def merge_messages(messages: list[Any]) -> list[tuple[str, list[Any]]]:
    """Consecutive same-role messages merged: a list of (role, content blocks)."""
    merged: list[tuple[str, list[Any]]] = []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        blocks = normalize_content(message.get("content") if isinstance(message, dict) else None)
        if merged and merged[-1][0] == role:
            merged[-1] = (role, merged[-1][1] + blocks)
        else:
            merged.append((str(role), list(blocks)))
    return merged


@dataclass(slots=True)
class PromptBlock:
    """One block of the prompt, in cache order (tools, system, messages)."""

    path: str  # "tools.0", "system.1", "messages.3.content.2" (merged message indices)
    tokens: int
    cache_control: dict[str, Any] | None
    tag: str  # "tool", "system" or "<merged message index>:<role>"
    source: dict[str, Any]  # the block as sent

    def key(self) -> bytes:
        """What the prefix hash covers: the block without cache_control, and its place."""
        block = self.source
        if block.get("type") == "text" and all(
            k in ("type", "text", "cache_control") or block[k] is None for k in block
        ):
            return f"{self.tag}\x1ftext\x1f{block.get('text')}".encode()
        return f"{self.tag}\x1fjson\x1f{compact_json(_hash_view(block))}".encode()


def _cache_control_of(block: dict[str, Any]) -> dict[str, Any] | None:
    cc = block.get("cache_control")
    if isinstance(cc, dict):
        return cc
    # a breakpoint on a block nested in a tool_result counts as one on the tool_result
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        for item in block["content"]:
            if isinstance(item, dict) and isinstance(item.get("cache_control"), dict):
                return item["cache_control"]
    return None


def _hash_view(block: dict[str, Any]) -> dict[str, Any]:
    view = _strip(block)
    if view.get("type") == "tool_result" and isinstance(view.get("content"), list):
        view["content"] = [_strip(c) if isinstance(c, dict) else c for c in view["content"]]
    return view


def prompt_blocks(body: dict[str, Any]) -> list[PromptBlock]:
    """The request's prompt as blocks with token counts and breakpoints.

    A top-level ``cache_control`` puts a breakpoint on the last block.
    """
    blocks: list[PromptBlock] = []
    tools = body.get("tools") or []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            continue
        cc = tool.get("cache_control")
        blocks.append(
            PromptBlock(
                f"tools.{i}", tool_tokens(tool), cc if isinstance(cc, dict) else None, "tool", tool
            )
        )
    system = body.get("system")
    system_blocks: list[Any] = (
        ([{"type": "text", "text": system}] if system else [])
        if isinstance(system, str)
        else (system if isinstance(system, list) else [])
    )
    for i, block in enumerate(system_blocks):
        if isinstance(block, dict):
            blocks.append(
                PromptBlock(
                    f"system.{i}", block_tokens(block), _cache_control_of(block), "system", block
                )
            )
    messages = body.get("messages") or []
    for m, (role, content) in enumerate(merge_messages(messages)):
        tag = f"{m}:{role}"
        for j, block in enumerate(content):
            if isinstance(block, dict):
                blocks.append(
                    PromptBlock(
                        f"messages.{m}.content.{j}",
                        block_tokens(block),
                        _cache_control_of(block),
                        tag,
                        block,
                    )
                )
    top = body.get("cache_control")
    if isinstance(top, dict) and blocks and blocks[-1].cache_control is None:
        blocks[-1].cache_control = top
    return blocks


def count_tokens(body: dict[str, Any]) -> int:
    """The fake's token count of a whole request (tools + system + messages)."""
    return sum(b.tokens for b in prompt_blocks(body))
