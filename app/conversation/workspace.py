"""A session's workspace as the built-in tools see it, and the one path rule for it.

A workspace is a flat map from normalised paths to bytes: directories are implicit
(a directory exists while some file lies under it). Every path that reaches a
`Workspace` has gone through `normalize_path` first; implementations may rely on it.

Path rules (`normalize_path`), shared by the tools and the Files HTTP routes:
- paths are POSIX, relative to the workspace root; a leading `/` means that root, so
  `/src/a.py`, `src/a.py` and `./src//a.py` all name `src/a.py`;
- `.` segments, empty segments and a trailing `/` are dropped; `..` removes the segment
  before it and is an error when there is none left (it would leave the root);
- rejected: an empty path (or one that names the root itself), paths longer than
  `MAX_PATH_CHARS` characters, backslashes, NUL and other control characters, and text
  that is not valid Unicode (lone surrogates).

Backslashes are rejected rather than read as separators: `a\\b` is a legal POSIX file
name but a Windows path, and guessing either way would let two spellings of one name
exist. Control characters are rejected because a newline in a name would break the
one-path-a-line output of Glob and Grep. Nothing is case-folded or Unicode-normalised:
names are compared exactly, as on a POSIX file system.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol

# The width of `files.path`; normalisation never lengthens a path, so checking the
# input bounds the result as well.
MAX_PATH_CHARS = 1024

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class PathError(ValueError):
    """A path the workspace cannot use; the message says why, for a client or the model."""


class Workspace(Protocol):
    async def read(self, path: str) -> bytes | None:
        """The file's content, or None when there is no file at `path`."""
        ...

    async def write(self, path: str, data: bytes) -> None:
        """Create the file or replace its content."""
        ...

    async def list_paths(self) -> list[str]:
        """Every file path, sorted by code point (Python's `sorted`)."""
        ...


def _segments(path: str) -> list[str]:
    """Validate `path` and resolve it to its segments; `[]` means the root."""
    if len(path) > MAX_PATH_CHARS:
        raise PathError(f"path is too long ({len(path)} characters, at most {MAX_PATH_CHARS})")
    if "\\" in path:
        raise PathError(f"path {path!r} contains a backslash; use '/' to separate directories")
    if _CONTROL_CHARS.search(path):
        raise PathError(f"path {path!r} contains a NUL or other control character")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise PathError(f"path {path!r} is not valid Unicode text") from None
    resolved: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment != "..":
            resolved.append(segment)
        elif resolved:
            resolved.pop()
        else:
            raise PathError(f"path {path!r} leaves the workspace root ('..' goes above it)")
    return resolved


def normalize_path(path: str) -> str:
    """The canonical workspace-relative form of a file path; raises PathError."""
    if not path:
        raise PathError("path is empty")
    segments = _segments(path)
    if not segments:
        raise PathError(f"path {path!r} names the workspace root, not a file")
    return "/".join(segments)


def normalize_dir(path: str) -> str:
    """Like `normalize_path` for a directory, where the root is allowed and is `""`."""
    return "/".join(_segments(path))


class MemoryWorkspace:
    """A dict-backed workspace, for tests and the offline model."""

    def __init__(self, files: Mapping[str, bytes | str] | None = None) -> None:
        self.files: dict[str, bytes] = {}
        for path, data in (files or {}).items():
            self.files[normalize_path(path)] = data.encode() if isinstance(data, str) else data

    async def read(self, path: str) -> bytes | None:
        return self.files.get(path)

    async def write(self, path: str, data: bytes) -> None:
        self.files[path] = data

    async def list_paths(self) -> list[str]:
        return sorted(self.files)
