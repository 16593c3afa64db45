"""Small, shared questions about content blocks and stored messages.

Every other module of the package asks the same few questions (which tool ids does
this message use or answer, is this a real user prompt, will the model see this row at
all); answering them in one place keeps normalisation, cut points, micro-compaction
and collapse in agreement about what a message *is*. All functions read their input
and never change it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.context.types import (
    API_ERROR,
    ASSISTANT,
    COLLAPSED,
    COMPACT_SUMMARY,
    SYSTEM,
    USER,
    Block,
    Node,
)

# Subtypes of user-role rows that the service writes itself: they are model-visible
# but never a user's own turn.
SYNTHETIC_USER_SUBTYPES = frozenset({COMPACT_SUMMARY, COLLAPSED})


def as_blocks(content: str | list[Block] | None) -> list[Block]:
    """Content as a list of blocks. A non-empty string becomes one text block; an empty
    string or None becomes no blocks. A list is returned as is (not copied)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return content or []


def tool_use_ids(content: str | list[Block] | None) -> list[str]:
    """Ids of the tool_use blocks, in order (blocks without an id are skipped)."""
    if isinstance(content, str) or not content:
        return []
    return [b["id"] for b in content if b.get("type") == "tool_use" and b.get("id")]


def tool_result_ids(content: str | list[Block] | None) -> list[str]:
    """The tool_use_id of every tool_result block, in order (duplicates kept)."""
    if isinstance(content, str) or not content:
        return []
    return [
        b["tool_use_id"] for b in content if b.get("type") == "tool_result" and b.get("tool_use_id")
    ]


def has_tool_result(content: str | list[Block] | None) -> bool:
    if isinstance(content, str) or not content:
        return False
    return any(b.get("type") == "tool_result" for b in content)


def is_blank_text(block: Block) -> bool:
    """A text block the API would reject: empty or whitespace only."""
    text = block.get("text")
    return not isinstance(text, str) or not text or text.isspace()


def has_visible_block(content: str | list[Block] | None) -> bool:
    """True when some block would survive normalisation's block filter (anything but
    empty or whitespace-only text)."""
    if isinstance(content, str):
        return bool(content) and not content.isspace()
    if not content:
        return False
    return any(b.get("type") != "text" or not is_blank_text(b) for b in content)


def is_internal(node: Node) -> bool:
    """Rows the model never sees: no role, system rows (boundaries and the like) and
    stored API errors."""
    return node.role not in (USER, ASSISTANT) or node.type == SYSTEM or node.subtype == API_ERROR


def is_model_visible(node: Node) -> bool:
    """The row contributes at least one block to a model request. (A user row holding
    only orphan tool results counts as visible here: whether a result is an orphan
    depends on its neighbours, which normalisation decides.)"""
    return not is_internal(node) and has_visible_block(node.content)


def is_clean_user_turn(node: Node) -> bool:
    """A message the user really wrote: role user, type user (not an attachment), not
    meta, not a row the service synthesised (compact summary, collapsed span), no
    tool_result block, and some visible content (text or an image). Compaction cuts and
    collapse spans start at such a message, so everything after it is a fresh request."""
    if node.role != USER or node.type != USER or node.is_meta:
        return False
    if node.subtype in SYNTHETIC_USER_SUBTYPES or node.subtype == API_ERROR:
        return False
    return not has_tool_result(node.content) and has_visible_block(node.content)


def result_text(block: Block) -> str:
    """A tool_result's content as plain text: a string as is, text blocks joined by
    newlines, images and documents as `[image]` / `[document]`."""
    content: Any = block.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_nested_text(content))
    return str(content)


def _nested_text(blocks: Iterable[Any]) -> Iterable[str]:
    for b in blocks:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "text":
            yield str(b.get("text") or "")
        elif kind in ("image", "document"):
            yield f"[{kind}]"


def preview(content: str | list[Block] | None, limit: int = 200) -> str:
    """A one-line preview for tree listings: the text of the message with whitespace
    collapsed; tool calls as `[tool: Name]`, results as `[result] text`, thinking left
    out, images as `[image]`. At most `limit` characters (an ellipsis marks a cut)."""
    parts: list[str] = []
    size = 0
    for block in as_blocks(content):
        part = _preview_part(block)[: limit * 2]
        if part:
            parts.append(part)
            size += len(part) + 1
            if size > limit * 2:  # enough material; long messages stay cheap
                break
    text = " ".join(" ".join(parts).split())
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)].rstrip() + "…"


def _preview_part(block: Block) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text") or "")
    if kind == "tool_use":
        return f"[tool: {block.get('name', '?')}]"
    if kind == "tool_result":
        return "[result] " + result_text(block)
    if kind in ("image", "document"):
        return f"[{kind}]"
    return ""
