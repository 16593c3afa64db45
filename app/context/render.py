"""Compacted messages rendered as plain text for the summariser.

When a summary request cannot reuse the cached prefix (or the oldest rounds had to be
dropped to make it fit), the part being forgotten is sent as text instead of as
messages. Compaction is translation, not deletion: tool calls and their results are
the facts of the session (which files were read, what a command printed), so each
becomes one short line (`[called Read({"file_path": ...})]`, `[result: ...]`) rather
than disappearing; thinking is dropped (long, and not a fact); earlier summaries are
kept, since they are all that is left of what came before them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.context.blocks import as_blocks, is_blank_text, is_internal, result_text
from app.context.types import ASSISTANT, COLLAPSED, COMPACT_SUMMARY, Block, Node


def shorten(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the cut marked with how much was left out."""
    if limit < 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def _input_json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def render_block(block: Block, *, max_result_chars: int = 500, max_input_chars: int = 200) -> str:
    """One block as a line of text ('' for blocks left out)."""
    kind = block.get("type")
    if kind == "text":
        return "" if is_blank_text(block) else str(block["text"])
    if kind == "tool_use":
        arguments = shorten(_input_json(block.get("input", {})), max_input_chars)
        return f"[called {block.get('name', '?')}({arguments})]"
    if kind == "tool_result":
        label = "result (error)" if block.get("is_error") else "result"
        return f"[{label}: {shorten(result_text(block), max_result_chars)}]"
    if kind in ("thinking", "redacted_thinking"):
        return ""
    return f"[{kind}]"


def _label(node: Node) -> str:
    if node.subtype == COMPACT_SUMMARY:
        return "Summary of the conversation before this"
    if node.subtype == COLLAPSED:
        return "Summary of earlier work"
    return "Assistant" if node.role == ASSISTANT else "User"


def render_for_summary(
    nodes: Sequence[Node], *, max_result_chars: int = 500, max_input_chars: int = 200
) -> str:
    """The messages as a transcript: one paragraph per message, `User:` / `Assistant:`
    followed by its blocks one per line. Rows the model never sees are skipped."""
    paragraphs: list[str] = []
    for node in nodes:
        if is_internal(node):
            continue
        lines = [
            line
            for block in as_blocks(node.content)
            if (
                line := render_block(
                    block, max_result_chars=max_result_chars, max_input_chars=max_input_chars
                )
            )
        ]
        if lines:
            paragraphs.append(f"{_label(node)}: " + "\n".join(lines))
    return "\n\n".join(paragraphs)
