"""The built-in workspace tools, Read, Write, Edit, Glob and Grep, with Claude Code's inputs.

Their specs live in the registry (`app.context.tools`); here are their handlers, one per
`BuiltinTool`. Pure: they act only through the `Workspace` protocol. `run_builtin` turns
every problem the model can fix (bad input, a missing file, an ambiguous edit, a bad
regex) into an error outcome worded so the model can act on it; failures of the
workspace itself (a database error) are not the model's to fix and propagate to the caller.

Text files are UTF-8. Lines are split on `\\n` only (a trailing `\\r` is hidden from
output), so Read's line numbers and Grep's always agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.context.tools import BUILTIN_TOOLS, MAX_LINE_CHARS, READ_DEFAULT_LIMIT, BuiltinTool
from app.conversation.workspace import (
    LimitExceeded,
    PathError,
    Workspace,
    check_clash,
    normalize_dir,
    normalize_path,
)
from app.engine.tools.globs import GlobError, compile_glob
from app.engine.tools.linear import LinearPattern, PatternError, compile_linear
from app.engine.tools.validation import check_input

TRUNCATION_MARKER = "\n\n[... {} characters truncated ...]\n\n"


@dataclass(frozen=True)
class ToolOutcome:
    content: str
    is_error: bool = False


class ToolError(Exception):
    """A problem the model can fix; its message becomes an error result."""


# ---------------------------------------------------------------------------------------
# Helpers.


def _decode(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _encode(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(f"{what} contains lone surrogate characters, which are not text") from None


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines[-1] == "":  # a final newline ends the last line; it does not start a new one
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _clip(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    dropped = len(line) - MAX_LINE_CHARS
    return f"{line[:MAX_LINE_CHARS]} [... line truncated, {dropped} more characters]"


async def _missing(workspace: Workspace, path: str) -> ToolError:
    if any(p.startswith(path + "/") for p in await workspace.list_paths()):
        return ToolError(f"{path} is a directory, not a file; use Glob to list its files")
    return ToolError(f"File not found: {path}. Use Glob to see which files exist.")


async def _read_text(workspace: Workspace, path: str, action: str) -> str:
    data = await workspace.read(path)
    if data is None:
        raise await _missing(workspace, path)
    text = _decode(data)
    if text is None:
        raise ToolError(
            f"{path} is a binary file ({len(data)} bytes, not UTF-8 text); "
            f"{action} cannot display or change binary content"
        )
    return text


def _under(paths: list[str], directory: str) -> list[tuple[str, str]]:
    """(path, path relative to directory) for files under it; raises if there are none."""
    if not directory:
        return [(p, p) for p in paths]
    prefix = directory + "/"
    found = [(p, p[len(prefix) :]) for p in paths if p.startswith(prefix)]
    if not found:
        if directory in paths:
            raise ToolError(f"{directory} is a file, not a directory")
        raise ToolError(f"Directory not found: {directory}")
    return found


# ---------------------------------------------------------------------------------------
# The tools. Each takes validated input and returns its text, or raises ToolError
# (GlobError for an unusable glob).


async def _read(args: dict[str, Any], workspace: Workspace) -> str:
    path = normalize_path(args["file_path"])
    lines = _lines(await _read_text(workspace, path, "Read"))
    if not lines:
        return f"(The file {path} exists but is empty.)"
    offset = max(args.get("offset", 1), 1)
    if offset > len(lines):
        count = f"{len(lines)} line{'s' if len(lines) > 1 else ''}"
        raise ToolError(f"{path} has {count}; offset {offset} is past its end")
    end = min(offset - 1 + args.get("limit", READ_DEFAULT_LIMIT), len(lines))
    numbered = (f"{n:>6}\t{_clip(line)}" for n, line in enumerate(lines[offset - 1 : end], offset))
    out = "\n".join(numbered)
    if end < len(lines):
        out += f"\n\n(Showing lines {offset}-{end} of {len(lines)}; use offset={end + 1} for more.)"
    return out


async def _check_writable(workspace: Workspace, path: str) -> bool:
    """Whether the file exists; raises when the path clashes with a directory or file."""
    paths = await workspace.list_paths()
    if path in paths:
        return True
    check_clash(path, paths)
    return False


async def _write(args: dict[str, Any], workspace: Workspace) -> str:
    path = normalize_path(args["file_path"])
    data = _encode(args["content"], "content")
    existed = await _check_writable(workspace, path)
    await workspace.write(path, data)
    return f"{'Updated' if existed else 'Created'} {path} ({len(data)} bytes)."


def _match_line_endings(text: str, old: str, new: str) -> tuple[str, str]:
    """Read hides `\\r`, so a multi-line old_string from a CRLF file arrives with `\\n`."""
    if old in text or "\r\n" not in text or "\n" not in old:
        return old, new
    crlf = old.replace("\r\n", "\n").replace("\n", "\r\n")
    if crlf not in text:
        return old, new
    return crlf, new.replace("\r\n", "\n").replace("\n", "\r\n")


async def _edit(args: dict[str, Any], workspace: Workspace) -> str:
    path = normalize_path(args["file_path"])
    old, new = args["old_string"], args["new_string"]
    if not old:
        raise ToolError("old_string is empty; to create or replace a whole file use Write")
    if old == new:
        raise ToolError("old_string and new_string are identical, so nothing would change")
    text = await _read_text(workspace, path, "Edit")
    old, new = _match_line_endings(text, old, new)
    count = text.count(old)
    if count > 1 and args.get("replace_all", False):
        # the size the file would have, before building it (a replace_all can multiply it)
        grows = len(new.encode("utf-8", "surrogatepass")) - len(old.encode("utf-8"))
        workspace.limits.check_file(path, len(text.encode("utf-8")) + count * grows)
    if count == 0:
        raise ToolError(
            f"old_string was not found in {path}. It must match the file exactly, including "
            "whitespace and indentation; Read the file and copy the text without the "
            "line-number prefix."
        )
    if count > 1 and not args.get("replace_all", False):
        raise ToolError(
            f"old_string occurs {count} times in {path}; include more surrounding lines to "
            "make it unique, or set replace_all to true to replace every occurrence."
        )
    line = text.count("\n", 0, text.find(old)) + 1
    await workspace.write(path, _encode(text.replace(old, new), "new_string"))
    if count == 1:
        return f"Edited {path}: 1 replacement at line {line}."
    return f"Edited {path}: {count} replacements (the first at line {line})."


async def _glob(args: dict[str, Any], workspace: Workspace) -> str:
    pattern: str = args["pattern"]
    # A leading '/' anchors the pattern at the root, as it does for paths.
    directory = "" if pattern.startswith("/") else normalize_dir(args.get("path", ""))
    matcher = compile_glob(pattern)
    files = _under(await workspace.list_paths(), directory)
    hits = await asyncio.to_thread(_glob_hits, matcher, files)
    if not hits:
        return f"No files found matching {pattern!r}" + (f" in {directory}" if directory else "")
    return "\n".join(hits)


def _glob_hits(matcher: LinearPattern, files: list[tuple[str, str]]) -> list[str]:
    return sorted(path for path, rel in files if matcher.fullmatch(rel))


async def _grep_files(args: dict[str, Any], workspace: Workspace) -> list[str]:
    target = normalize_dir(args.get("path", ""))
    paths = await workspace.list_paths()
    if target in paths:
        return [target]
    files = _under(paths, target)
    glob: str | None = args.get("glob")
    if glob is None:
        return [path for path, _ in files]
    matcher = compile_glob(glob)
    if "/" in glob:
        return [path for path, rel in files if matcher.fullmatch(rel)]
    return [path for path, rel in files if matcher.fullmatch(rel.rsplit("/", 1)[-1])]


def _compile_regex(pattern: str, ignore_case: bool) -> LinearPattern:
    try:
        return compile_linear(pattern, ignore_case=ignore_case)
    except PatternError as exc:
        raise ToolError(
            f"invalid regular expression {pattern!r}: {exc} (the syntax is RE2's: no "
            "back-references or look-around)"
        ) from None


def _matching_lines(regex: LinearPattern, text: str) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(_lines(text), 1) if regex.search(line)]


async def _grep(args: dict[str, Any], workspace: Workspace) -> str:
    regex = _compile_regex(args["pattern"], args.get("-i", False))
    mode = args.get("output_mode", "files_with_matches")
    out: list[str] = []
    for path in await _grep_files(args, workspace):
        data = await workspace.read(path)
        text = None if data is None else _decode(data)
        if text is None:  # binary, or gone since it was listed
            continue
        # off the event loop: a large file takes a while even in linear time
        matches = await asyncio.to_thread(_matching_lines, regex, text)
        if not matches:
            continue
        if mode == "content":
            out += (f"{path}:{n}:{_clip(line)}" for n, line in matches)
        elif mode == "count":
            out.append(f"{path}:{len(matches)}")
        else:
            out.append(path)
    return "\n".join(out) if out else "No matches found."


_Handler = Callable[[dict[str, Any], Workspace], Awaitable[str]]
HANDLERS: dict[str, _Handler] = {
    BuiltinTool.Read: _read,
    BuiltinTool.Write: _write,
    BuiltinTool.Edit: _edit,
    BuiltinTool.Glob: _glob,
    BuiltinTool.Grep: _grep,
}
if set(HANDLERS) != set(BUILTIN_TOOLS):
    raise RuntimeError("every registered built-in tool needs a handler, and only those")


async def run_builtin(name: str, tool_input: dict[str, Any], workspace: Workspace) -> ToolOutcome:
    """Run a built-in tool. Never raises for the model's mistakes: those come back as
    `is_error=True` outcomes. Errors of the workspace itself propagate."""
    spec = BUILTIN_TOOLS.get(name)
    if spec is None:
        available = ", ".join(sorted(BUILTIN_TOOLS))
        return ToolOutcome(f"Unknown built-in tool {name!r}; available: {available}", True)
    args, problem = check_input(spec, tool_input)
    if problem:
        return ToolOutcome(f"Invalid input for {name}: {problem}", is_error=True)
    try:
        return ToolOutcome(await HANDLERS[name](args, workspace))
    except (ToolError, GlobError, PathError, LimitExceeded) as exc:
        return ToolOutcome(str(exc), is_error=True)


def truncate_middle(text: str, max_chars: int = 50_000) -> str:
    """Shorten `text` longer than `max_chars` around a marker naming what was dropped.

    Text of at most `max_chars` characters comes back unchanged. Longer text keeps its
    first `max_chars * 7 // 10` characters and its last `max_chars - that` characters,
    with `TRUNCATION_MARKER` (formatted with the number dropped) between them, so the
    result is exactly `max_chars + len(marker)` characters long.
    """
    if max_chars < 0:
        raise ValueError("max_chars must not be negative")
    if len(text) <= max_chars:
        return text
    head = max_chars * 7 // 10
    tail = max_chars - head
    marker = TRUNCATION_MARKER.format(len(text) - max_chars)
    # Slice the tail by index: text[-0:] would be the whole text.
    return text[:head] + marker + text[len(text) - tail :]
