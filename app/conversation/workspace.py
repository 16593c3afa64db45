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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

# The width of `files.path`; normalisation never lengthens a path, so checking the
# input bounds the result as well.
MAX_PATH_CHARS = 1024

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


class PathError(ValueError):
    """A path the workspace cannot use; the message says why, for a client or the model."""


class LimitExceeded(ValueError):
    """A write that would pass a file's size limit or the workspace's quota."""


@dataclass(frozen=True)
class Limits:
    """The size of one file, and the bytes and files of one session's workspace."""

    max_file_bytes: int = 10 * 1024 * 1024
    max_bytes: int = 100 * 1024 * 1024
    max_files: int = 10_000

    def check_file(self, path: str, size: int) -> None:
        if size > self.max_file_bytes:
            raise LimitExceeded(
                f"{path} would be {size} bytes, over the limit of {self.max_file_bytes} "
                "bytes for one file"
            )

    def check_write(self, path: str, size: int, files: int, total: int, old: int | None) -> None:
        """A write of `size` bytes to `path` in a workspace of `files` files and `total`
        bytes, where `path` now holds `old` bytes (None: no such file)."""
        self.check_file(path, size)
        if old is None and files + 1 > self.max_files:
            raise LimitExceeded(
                f"the workspace holds {files} files, the most it may; delete one first"
            )
        after = total - (old or 0) + size
        if after > self.max_bytes:
            raise LimitExceeded(
                f"writing {path} would make the workspace {after} bytes, over its quota of "
                f"{self.max_bytes} bytes; delete or shorten files first"
            )


def check_clash(path: str, paths: Iterable[str]) -> None:
    """A file cannot lie under another file, nor take the name of a directory (one
    with files under it); `paths` holds at least every existing path that could clash."""
    prefix = path + "/"
    ancestors = {"/".join(path.split("/")[:depth]) for depth in range(1, path.count("/") + 1)}
    for existing in paths:
        if existing.startswith(prefix):
            raise PathError(f"{path} is a directory (files lie under it); choose another name")
        if existing in ancestors:
            raise PathError(f"{existing} is a file, so {path} cannot be created under it")


class Workspace(Protocol):
    limits: Limits

    async def read(self, path: str) -> bytes | None:
        """The file's content, or None when there is no file at `path`."""
        ...

    async def write(self, path: str, data: bytes) -> None:
        """Create the file or replace its content; raises PathError when the path clashes
        with a file or directory, LimitExceeded past the limits."""
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

    def __init__(
        self, files: Mapping[str, bytes | str] | None = None, limits: Limits | None = None
    ) -> None:
        self.limits = limits or Limits()
        self.files: dict[str, bytes] = {}
        for path, data in (files or {}).items():
            self.files[normalize_path(path)] = data.encode() if isinstance(data, str) else data

    async def read(self, path: str) -> bytes | None:
        return self.files.get(path)

    async def write(self, path: str, data: bytes) -> None:
        old = self.files.get(path)
        if old is None:
            check_clash(path, self.files)
        total = sum(len(content) for content in self.files.values())
        self.limits.check_write(
            path, len(data), len(self.files), total, None if old is None else len(old)
        )
        self.files[path] = data

    async def list_paths(self) -> list[str]:
        return sorted(self.files)
