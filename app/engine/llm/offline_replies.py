"""The offline model's answers to an ordinary turn: the echo, `/tool` calls, `/long`
filler, the `/think` block and the report on tool results (see `offline` for the rules).
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from .offline_messages import first_line, plural, quote, result_text, text_of, tool_use_names
from .offline_wire import CHARS_PER_TOKEN, ReplyBlock

__all__ = [
    "ECHO_PREFIX",
    "describe_results",
    "echo",
    "filler",
    "long_request_tokens",
    "prompt_text",
    "thinking_blocks",
    "tool_calls",
    "tool_names",
]

ECHO_PREFIX: Final = "Offline model (not a language model). "
_MAX_LONG_TOKENS: Final = 128_000  # above any model's max_tokens
_TOOL_LINE = re.compile(r"^\s*/tool\s+(\S+)(?:\s+(.*?))?\s*$")
_LONG_LINE = re.compile(r"^\s*/long\s+(\d+)\s*$")
_THINK_LINE = re.compile(r"^\s*/think\s*$")


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """Text of the newest user message that has any: the turn's prompt."""
    for message in reversed(messages):
        if message.get("role") == "user":
            text = text_of(message.get("content"))
            if text:
                return text
    return ""


def _thinking_enabled(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def thinking_blocks(body: dict[str, Any], prompt: str) -> list[ReplyBlock]:
    """The `/think` block when the prompt asks for it and the body enables thinking."""
    if not _thinking_enabled(body):
        return []
    if not any(_THINK_LINE.match(line) for line in prompt.splitlines()):
        return []
    text = (
        "Offline thinking (a fixed template, not reasoning): the prompt has "
        f"{plural(len(prompt), 'character')} on {plural(len(prompt.splitlines()), 'line')}."
    )
    return [ReplyBlock("thinking", text=text)]


def tool_names(body: dict[str, Any]) -> set[str]:
    tools = body.get("tools") or []
    return {t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)}


def tool_calls(text: str, available: set[str]) -> tuple[list[ReplyBlock], list[str]]:
    """The calls `/tool` lines ask for, and why the lines that make none were ignored."""
    calls: list[ReplyBlock] = []
    ignored: list[str] = []
    for line in text.splitlines():
        match = _TOOL_LINE.match(line)
        if match is None:
            continue
        name, raw = match.group(1), match.group(2) or ""
        if name not in available:
            ignored.append(f"/tool {name}: no such tool in this request")
            continue
        try:
            tool_input = json.loads(raw) if raw else {}
        except ValueError:
            tool_input = None
        if not isinstance(tool_input, dict):
            ignored.append(f"/tool {name}: the input is not a JSON object")
            continue
        calls.append(ReplyBlock("tool_use", name=name, input=tool_input))
    return calls, ignored


def describe_results(results: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str:
    """A report on each tool result: its line count and first line, or its error."""
    names = tool_use_names(messages)
    lines = [ECHO_PREFIX.strip()]
    for block in results:
        name = names.get(str(block.get("tool_use_id")), "unknown")
        text = result_text(block)
        first = first_line(text)
        if block.get("is_error"):
            lines.append(f"Tool {name} failed: {first or '(no message)'}")
            continue
        count = len(text.splitlines())
        lines.append(f"Tool {name} returned {plural(count, 'line')}.")
        if first:
            lines.append(f"First line: {quote(first, 200)}")
    return "\n".join(lines)


def long_request_tokens(text: str) -> int | None:
    """N of the first `/long N` line, clamped to 1.._MAX_LONG_TOKENS; None without one."""
    for line in text.splitlines():
        match = _LONG_LINE.match(line)
        if match is not None:
            return max(1, min(int(match.group(1)), _MAX_LONG_TOKENS))
    return None


def filler(tokens: int) -> str:
    """Numbered filler sentences, exactly `tokens` * CHARS_PER_TOKEN characters."""
    target = tokens * CHARS_PER_TOKEN
    parts: list[str] = []
    size = 0
    n = 0
    while size < target:
        n += 1
        sentence = f"Offline filler sentence {n}. "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)[:target]


def _is_command(line: str) -> bool:
    return any(pattern.match(line) for pattern in (_TOOL_LINE, _LONG_LINE, _THINK_LINE))


def echo(text: str, ignored: list[str]) -> str:
    """The default reply: `text` quoted back without its command lines."""
    kept = "\n".join(line for line in text.splitlines() if not _is_command(line)).strip()
    reply = ECHO_PREFIX + (f"You said: {kept}" if kept else "You sent no text.")
    if ignored:
        reply += "\nIgnored: " + "; ".join(ignored) + "."
    return reply
