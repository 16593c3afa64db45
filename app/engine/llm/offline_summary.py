"""The offline model's answer to a compaction request: an extractive summary.

No language model means no real summary, so this one quotes lines from the
conversation under the nine fixed section headings the summary instruction asks for:
enough for compaction to run end to end offline, with output tests can check.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from app.context.summary_prompt import SUMMARY_MARKER

from .offline_messages import (
    blocks_of,
    first_line,
    plural,
    quote,
    result_text,
    text_of,
    tool_use_names,
)

__all__ = ["SUMMARY_HEADINGS", "extractive_summary", "summary_marker", "transcript_messages"]

SUMMARY_HEADINGS: Final = (
    "1. Primary Request and Intent",
    "2. Key Technical Concepts",
    "3. Files and Code Sections",
    "4. Errors and fixes",
    "5. Problem Solving",
    "6. All user messages",
    "7. Pending Tasks",
    "8. Current Work",
    "9. Optional Next Step",
)
_PATH_KEYS: Final = ("file_path", "path", "notebook_path")


def summary_marker() -> str:
    """The phrase of the summary instruction that marks a request as a compaction."""
    return SUMMARY_MARKER


def extractive_summary(messages: list[dict[str, Any]], marker: str) -> str:
    """An extractive summary: lines quoted from the conversation under fixed headings."""
    user_texts: list[str] = []
    assistant_texts: list[str] = []
    tool_counts: dict[str, int] = {}
    files: list[str] = []
    errors: list[str] = []
    names = tool_use_names(messages)
    for message in messages:
        content = message.get("content")
        text = text_of(content, skip=marker).strip()
        if message.get("role") == "user":
            if text:
                user_texts.append(text)
            for block in blocks_of(content, "tool_result"):
                if block.get("is_error"):
                    name = names.get(str(block.get("tool_use_id")), "unknown")
                    first = quote(first_line(result_text(block)), 200)
                    errors.append(f"- Tool {name} failed: {first}")
        elif message.get("role") == "assistant":
            if text:
                assistant_texts.append(text)
            for block in blocks_of(content, "tool_use"):
                name = str(block.get("name", "?"))
                tool_counts[name] = tool_counts.get(name, 0) + 1
                tool_input = block.get("input")
                if isinstance(tool_input, dict):
                    for key in _PATH_KEYS:
                        value = tool_input.get(key)
                        if isinstance(value, str) and value not in files:
                            files.append(value)

    latest = user_texts[-1] if user_texts else ""
    sections = (
        [f"- {quote(user_texts[0], 500)}"] if user_texts else [],
        [f"- Tool {name} used {plural(n, 'time')}." for name, n in tool_counts.items()],
        [f"- {path}" for path in files],
        errors,
        [f"- {quote(first_line(t), 200)}" for t in assistant_texts[-10:-1]],
        [f"- {quote(t, 300)}" for t in user_texts],
        [f"- Latest request: {quote(latest, 300)}"] if latest else [],
        [f"- {quote(assistant_texts[-1], 500)}"] if assistant_texts else [],
        [f"- Continue with: {quote(latest, 200)}"] if latest else [],
    )
    lines = ["<summary>"]
    for heading, body in zip(SUMMARY_HEADINGS, sections, strict=True):
        lines.append(f"{heading}:")
        lines.extend(body or ["- None recorded."])
        lines.append("")
    lines[-1] = "</summary>"
    return "\n".join(lines)


_TRANSCRIPT = re.compile(r"<transcript>\n?(.*?)\n?</transcript>", re.DOTALL)
_CALLED = re.compile(r"^\[called ([^(\s]+)\((.*)\)\]$")
_RESULT = re.compile(r"^\[result( \(error\))?: (.*)\]$")
_QUOTED_PATH = re.compile(r'"(?:file_path|path|notebook_path)": "([^"]*)"')


def transcript_messages(text: str) -> list[dict[str, Any]]:
    """Messages recovered from a `<transcript>` in the instruction, best effort.

    A summary request that cannot reuse the cached prefix carries the conversation as
    text (`app.context.render.render_for_summary`): "User: " / "Assistant: " /
    "Summary of ...: " paragraphs (the last read as user messages), tool calls as
    `[called Name({...})]`, results as `[result: ...]`.
    """
    match = _TRANSCRIPT.search(text)
    if match is None:
        return []
    messages: list[dict[str, Any]] = []
    last_tool_id = ""
    for paragraph in match.group(1).split("\n\n"):
        label, sep, rest = paragraph.partition(": ")
        if sep and label in ("User", "Assistant"):
            messages.append({"role": label.lower(), "content": []})
        elif sep and label.startswith("Summary of"):
            messages.append({"role": "user", "content": []})
        elif messages:  # a blank line inside a message
            rest = paragraph
        else:
            continue
        content: list[dict[str, Any]] = messages[-1]["content"]
        for line in rest.splitlines():
            called = _CALLED.match(line)
            result = _RESULT.match(line)
            if called is not None:
                last_tool_id = f"transcript_{len(messages)}_{len(content)}"
                try:
                    tool_input = json.loads(called.group(2))
                except ValueError:  # shortened by the renderer
                    path = _QUOTED_PATH.search(called.group(2))
                    tool_input = {"file_path": path.group(1)} if path else {}
                content.append(
                    {
                        "type": "tool_use",
                        "id": last_tool_id,
                        "name": called.group(1),
                        "input": tool_input,
                    }
                )
            elif result is not None:
                content.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": last_tool_id,
                        "is_error": result.group(1) is not None,
                        "content": result.group(2),
                    }
                )
            elif line.strip():
                content.append({"type": "text", "text": line})
    return messages
