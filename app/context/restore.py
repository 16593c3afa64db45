"""What a compaction re-attaches: the files the compacted part read, and, when the
workspace does not hold one, its content as the conversation last showed it.

A compaction forgets the Read results it summarises, so the files read most recently
come back as attachments after the summary (Claude Code does the same). Their content
is the workspace's when it has the file; an imported transcript's paths are the source
machine's, which the workspace never holds, so the conversation itself is the fallback:
the file's last `Write` input, or its last `Read` result (line numbers taken off, lines
merged when it was read in pieces), with the successful `Edit`s made after it applied.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.context.blocks import result_text
from app.context.types import ASSISTANT, Block, Node

MAX_FILES = 5

# A numbered line of a Read result: Parley's `     1<TAB>text`, Claude Code's `     1→text`.
_NUMBERED = re.compile(r"^\s*(\d+)[\t\u2192](.*)$")
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def workspace_path(path: str) -> str:
    """A tool's `file_path` as the workspace keys it (no leading slash)."""
    return path.lstrip("/")


def _read_paths(nodes: Sequence[Node]) -> list[str]:
    paths = []
    for node in nodes:
        if node.role != ASSISTANT:
            continue
        for block in node.content:
            if block.get("type") == "tool_use" and block.get("name") == "Read":
                path = (block.get("input") or {}).get("file_path")
                if isinstance(path, str):
                    paths.append(workspace_path(path))
    return paths


def files_to_reattach(compacted: Sequence[Node], kept: Sequence[Node]) -> list[str]:
    """Up to MAX_FILES paths read most recently in the compacted part and not still
    visible in the kept part (newest first)."""
    visible = set(_read_paths(kept))
    paths: list[str] = []
    for path in reversed(_read_paths(compacted)):
        if path not in visible and path not in paths:
            paths.append(path)
        if len(paths) >= MAX_FILES:
            break
    return paths


@dataclass
class _Seen:
    """A file as the conversation shows it: whole text (a Write, or text an Edit was
    applied to) or numbered lines (Read results)."""

    text: str | None = None
    lines: dict[int, str] = field(default_factory=dict)

    def current(self) -> str | None:
        if self.text is not None:
            return self.text
        if not self.lines:
            return None
        out: list[str] = []
        expected = 1
        for number in sorted(self.lines):
            if number > expected:
                out.append(f"[... lines {expected}-{number - 1} not shown in the conversation ...]")
            out.append(self.lines[number])
            expected = number + 1
        return "\n".join(out)


def _read_lines(block: Block) -> dict[int, str]:
    lines: dict[int, str] = {}
    for line in _REMINDER.sub("", result_text(block)).splitlines():
        match = _NUMBERED.match(line)
        if match:
            lines[int(match.group(1))] = match.group(2)
    return lines


def _numbered(text: str) -> dict[int, str]:
    return dict(enumerate(text.splitlines(), 1))


def _apply_edit(seen: _Seen, tool_input: dict[str, object]) -> None:
    old, new = tool_input.get("old_string"), tool_input.get("new_string")
    text = seen.current()
    if text is None or not isinstance(old, str) or not isinstance(new, str) or not old:
        return
    if old not in text:
        return  # the file as shown is not the file the edit saw: keep what was shown
    count = -1 if tool_input.get("replace_all") else 1
    seen.text = text.replace(old, new, count)
    seen.lines = {}


def file_from_history(nodes: Sequence[Node], path: str) -> str | None:
    """The newest content of `path` (workspace form) that `nodes` show: its last Write
    input or Read result with the later successful Edits applied; None when the
    conversation never showed it."""
    target = workspace_path(path)
    uses: dict[str, Block] = {}
    seen = _Seen()
    found = False
    for node in nodes:
        for block in node.content:
            kind = block.get("type")
            if kind == "tool_use" and node.role == ASSISTANT:
                tool_input = block.get("input") or {}
                file_path = tool_input.get("file_path") if isinstance(tool_input, dict) else None
                if isinstance(file_path, str) and workspace_path(file_path) == target:
                    uses[str(block.get("id"))] = block
            elif kind == "tool_result" and node.role != ASSISTANT:
                use = uses.pop(str(block.get("tool_use_id")), None)
                if use is None or block.get("is_error"):
                    continue
                name, tool_input = use.get("name"), use.get("input") or {}
                if name == "Write" and isinstance(tool_input.get("content"), str):
                    seen, found = _Seen(text=tool_input["content"]), True
                elif name == "Read":
                    lines = _read_lines(block)
                    if lines and found and tool_input.get("offset"):  # a piece: merged
                        base = seen.lines if seen.text is None else _numbered(seen.text)
                        seen = _Seen(lines={**base, **lines})
                    elif lines:
                        seen, found = _Seen(lines=lines), True
                elif name == "Edit" and found:
                    _apply_edit(seen, tool_input)
    return seen.current() if found else None
