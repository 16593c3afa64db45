"""Token estimates for content the model has not counted yet.

There is no offline tokenizer for current Claude models, so the service anchors its
figures on the usage the API reports for the last response and adds estimates only for
what came after it (docs/architecture.md, invariant 8). Estimates are made once per message when
it is stored (`Node.token_estimate`) and summed afterwards; nothing here is meant to be
recomputed over a whole history on every turn.

The ratio is one constant, `CHARS_PER_TOKEN`, measured on real Claude Code transcripts
(median 2.8 characters per token; chars/4 undercounts by about 30%). It is read at call
time, so calibrating it means changing that one number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from app.context.types import Block, Node

CHARS_PER_TOKEN = 2.8
# Images and documents are billed by size, which the stored block does not tell cheaply
# (a 1092x1092 image is about 1,600 tokens); one fixed figure keeps the estimate stable.
MEDIA_TOKENS = 1_600
# Framing the API adds around each block (type tags, ids, separators).
BLOCK_OVERHEAD_TOKENS = 3
# A tool_use id (and the tool_use_id of its result): ~30 random characters, which
# tokenize at barely one character a token. Leaving them out made tool rounds come out
# 60-80 tokens short on the real transcripts (bench/token_estimates.py).
TOOL_ID_TOKENS = 25
# Framing around a tool definition or a system block.
DEFINITION_OVERHEAD_TOKENS = 8


def chars_to_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN) if chars > 0 else 0


def _json_chars(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    except (TypeError, ValueError):
        return len(str(value))


def _media(kind: Any) -> bool:
    return kind in ("image", "document")


def _result_content_tokens(content: Any) -> int:
    """The tokens of a tool_result's `content` (a string, or nested blocks)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return chars_to_tokens(len(content))
    if isinstance(content, list):
        total = 0
        for nested in content:
            if isinstance(nested, dict):
                total += estimate_block(nested)
        return total
    return chars_to_tokens(len(str(content)))


def estimate_block(block: Block) -> int:
    """Estimated input tokens of one content block, framing included."""
    kind = block.get("type")
    if kind == "text":
        tokens = chars_to_tokens(len(block.get("text") or ""))
    elif kind == "tool_use":
        tokens = TOOL_ID_TOKENS + chars_to_tokens(
            len(block.get("name") or "") + _json_chars(block.get("input"))
        )
    elif kind == "tool_result":
        tokens = TOOL_ID_TOKENS + _result_content_tokens(block.get("content"))
    elif kind == "thinking":
        tokens = chars_to_tokens(len(block.get("thinking") or ""))
    elif kind == "redacted_thinking":
        tokens = chars_to_tokens(len(block.get("data") or ""))
    elif _media(kind):
        tokens = MEDIA_TOKENS
    else:
        tokens = chars_to_tokens(_json_chars(block))
    return tokens + BLOCK_OVERHEAD_TOKENS


def estimate_content(content: str | Sequence[Block] | None) -> int:
    """Estimated tokens of a message's content (a string or a list of blocks)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return chars_to_tokens(len(content)) + BLOCK_OVERHEAD_TOKENS if content else 0
    return sum(estimate_block(b) for b in content)


def node_tokens(node: Node) -> int:
    """A stored message's estimate: the stored figure when there is one, else computed."""
    return node.token_estimate if node.token_estimate > 0 else estimate_content(node.content)


def estimate_messages(nodes: Iterable[Node]) -> int:
    """Sum of the messages' estimates (stored figures preferred)."""
    return sum(node_tokens(n) for n in nodes)


def estimate_system(system: str | Sequence[Block] | None) -> int:
    """The system prompt: a string or text blocks."""
    if not system:
        return 0
    if isinstance(system, str):
        return chars_to_tokens(len(system)) + DEFINITION_OVERHEAD_TOKENS
    return sum(estimate_block(b) for b in system) + DEFINITION_OVERHEAD_TOKENS


def estimate_tools(tools: Sequence[dict[str, Any]] | None) -> int:
    """Tool definitions, as the JSON the API receives (name, description, schema)."""
    if not tools:
        return 0
    return sum(chars_to_tokens(_json_chars(t)) + DEFINITION_OVERHEAD_TOKENS for t in tools)
