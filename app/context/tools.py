"""The tool registry: the built-in tools' specs, and the tools a session offers the model.

Pure: plain values in and out. What a tool is (its name, what the model reads about it,
whether it only reads, whether micro-compaction may clear its results) is said once, in
`BUILTIN_TOOLS`; the sets the engine and the projections use derive from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# Part of Read's description; the engine's Read keeps to them.
READ_DEFAULT_LIMIT = 2000
MAX_LINE_CHARS = 2000

PARLEY_TOOL_KEYS = ("compactable",)  # Parley's own keys of a client tool, never sent to the model


class BuiltinTool(StrEnum):
    """The built-in workspace tools a session can enable, by the name the model calls."""

    Read = "Read"
    Write = "Write"
    Edit = "Edit"
    Glob = "Glob"
    Grep = "Grep"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]  # JSON schema of the input object, as the Anthropic API takes
    read_only: bool  # changes nothing, so consecutive read-only uses run concurrently
    compactable: bool  # its results can be had again, so micro-compaction may clear them

    def to_api(self) -> dict[str, Any]:
        """The tool definition for a model request."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_FILE_PATH = {
    "type": "string",
    "description": "Path of the file, relative to the workspace root ('/' also means the root).",
}

BUILTIN_TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            name=BuiltinTool.Read.value,
            description=(
                "Reads a text file from the session workspace. By default it returns up to "
                f"{READ_DEFAULT_LIMIT} lines from the start of the file; for longer files "
                "pass offset (the 1-based line number to start at) and limit (how many "
                "lines). Output is in `cat -n` format: each line is prefixed with its line "
                "number and a tab. The prefix is not part of the file, so leave it out when "
                f"you copy text into Edit. Lines longer than {MAX_LINE_CHARS} characters "
                "are truncated. Binary files cannot be displayed."
            ),
            input_schema=_schema(
                {
                    "file_path": _FILE_PATH,
                    "offset": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "1-based line number to start reading at (0 reads "
                        "from the start too). Only needed for files too long to read at once.",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "description": f"Number of lines to read (default {READ_DEFAULT_LIMIT}).",
                    },
                },
                ["file_path"],
            ),
            read_only=True,
            compactable=True,
        ),
        ToolSpec(
            name=BuiltinTool.Write.value,
            description=(
                "Writes a file in the session workspace, creating it or replacing its whole "
                "content. Directories are implicit: writing 'src/app/main.py' needs no "
                "setup. To change part of an existing file, prefer Edit."
            ),
            input_schema=_schema(
                {
                    "file_path": _FILE_PATH,
                    "content": {"type": "string", "description": "The complete new content."},
                },
                ["file_path", "content"],
            ),
            read_only=False,
            compactable=True,
        ),
        ToolSpec(
            name=BuiltinTool.Edit.value,
            description=(
                "Replaces text in an existing workspace file. old_string must match the "
                "file exactly, including whitespace and indentation (copy it from Read "
                "output without the line-number prefix). It must occur exactly once unless "
                "replace_all is true; if it is not unique, include more surrounding lines. "
                "new_string must differ from old_string. The file must exist: create files "
                "with Write."
            ),
            input_schema=_schema(
                {
                    "file_path": _FILE_PATH,
                    "old_string": {"type": "string", "description": "The exact text to replace."},
                    "new_string": {"type": "string", "description": "The text to put instead."},
                    "replace_all": {
                        "type": "boolean",
                        "description": "Replace every occurrence of old_string (default false).",
                    },
                },
                ["file_path", "old_string", "new_string"],
            ),
            read_only=False,
            compactable=True,
        ),
        ToolSpec(
            name=BuiltinTool.Glob.value,
            description=(
                "Finds workspace files whose paths match a glob pattern, such as '**/*.py' "
                "or 'src/*.{ts,tsx}'. '*' matches within one path segment, '**' any number "
                "of segments (none included), '?' one character, '[abc]' one of a set, "
                "'{a,b}' either alternative. The pattern is matched against paths relative "
                "to `path` (a directory; default the workspace root), so '*.py' matches "
                "only files directly in it. Returns full workspace paths, sorted, one a line."
            ),
            input_schema=_schema(
                {
                    "pattern": {"type": "string", "description": "The glob pattern."},
                    "path": {
                        "type": "string",
                        "description": "Directory to search in (default the workspace root).",
                    },
                },
                ["pattern"],
            ),
            read_only=True,
            compactable=True,
        ),
        ToolSpec(
            name=BuiltinTool.Grep.value,
            description=(
                "Searches the content of workspace files with a regular expression (RE2 "
                "syntax: like Python `re`, without back-references or look-around), line "
                "by line. output_mode 'files_with_matches' (the default) "
                "lists the matching files; 'content' shows matching lines as "
                "path:line_number:line; 'count' shows path:number_of_matching_lines. Narrow "
                "the search with path (a file or directory) and glob (e.g. '*.py'; a glob "
                "without '/' matches file names at any depth). Set -i for a case-insensitive "
                "search. Binary files are skipped."
            ),
            input_schema=_schema(
                {
                    "pattern": {"type": "string", "description": "The regular expression."},
                    "path": {
                        "type": "string",
                        "description": "File or directory to search (default the workspace root).",
                    },
                    "glob": {
                        "type": "string",
                        "description": "Only search files matching this glob, e.g. '*.{ts,tsx}'.",
                    },
                    "output_mode": {
                        "type": "string",
                        "enum": ["content", "files_with_matches", "count"],
                        "description": "What to show (default 'files_with_matches').",
                    },
                    "-i": {"type": "boolean", "description": "Ignore case (default false)."},
                },
                ["pattern"],
            ),
            read_only=True,
            compactable=True,
        ),
    )
}

if list(BUILTIN_TOOLS) != list(BuiltinTool):
    raise RuntimeError("BUILTIN_TOOLS and BuiltinTool disagree")

READ_ONLY_TOOLS = frozenset(name for name, spec in BUILTIN_TOOLS.items() if spec.read_only)
COMPACTABLE_BUILTINS = frozenset(name for name, spec in BUILTIN_TOOLS.items() if spec.compactable)


def tool_definitions(
    builtin_tools: Sequence[str], client_tools: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The tools of a model request: the enabled built-ins first, then the client's
    without Parley's own keys."""
    tools = [BUILTIN_TOOLS[name].to_api() for name in builtin_tools]
    for tool in client_tools:
        tools.append({k: v for k, v in tool.items() if k not in PARLEY_TOOL_KEYS})
    return tools


def client_tool_names(client_tools: Sequence[dict[str, Any]]) -> set[str]:
    return {tool["name"] for tool in client_tools}


def compactable_tools(client_tools: Sequence[dict[str, Any]]) -> frozenset[str]:
    """Names whose results micro-compaction may clear: the compactable built-ins, and
    client tools marked `"compactable": true`."""
    client = {tool["name"] for tool in client_tools if tool.get("compactable")}
    return COMPACTABLE_BUILTINS | frozenset(client)
