"""Reading the request's messages for the offline model, and quoting from them.

Every accessor skips content of an unexpected shape rather than raising: the stand-in
answers whatever body it is given.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "blocks_of",
    "first_line",
    "plural",
    "quote",
    "result_text",
    "text_of",
    "tool_use_names",
]


def text_of(content: object, *, skip: str | None = None) -> str:
    """The text of a message's content; text blocks containing `skip` are left out."""
    if isinstance(content, str):
        return "" if skip and skip in content else content
    if not isinstance(content, list):
        return ""
    texts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str) and not (skip and skip in text):
                texts.append(text)
    return "\n".join(texts)


def blocks_of(content: object, btype: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == btype]


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return text_of(content)


def tool_use_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Tool name by tool_use id, over the assistant messages."""
    names: dict[str, str] = {}
    for message in messages:
        if message.get("role") == "assistant":
            for block in blocks_of(message.get("content"), "tool_use"):
                if isinstance(block.get("id"), str):
                    names[block["id"]] = str(block.get("name", "?"))
    return names


def quote(text: str, limit: int) -> str:
    """`text` on one line, shortened to `limit` characters, as a JSON string."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return json.dumps(flat, ensure_ascii=False)


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
