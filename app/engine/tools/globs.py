"""Globs translated to regular expressions (fnmatch knows no `**` and lets `*` cross `/`).

`*` and `?` stay within one path segment, `**` spans any number of segments, `[...]`
is a character class and `{a,b}` alternatives (nested too).
"""

from __future__ import annotations

import itertools
import re

from app.engine.tools.linear import LinearPattern, PatternError, compile_linear

# `{a,b}{c,d}...` doubles per group; past this many alternatives a pattern is refused.
MAX_GLOB_ALTERNATIVES = 256


class GlobError(ValueError):
    """A pattern that cannot be used; its message is worded for the model."""


def _expand_braces(pattern: str) -> list[str]:
    """`a{b,c}d` -> `abd`, `acd`; nested groups expand too; an unclosed `{` is literal."""
    depth, start = 0, 0
    commas: list[int] = []
    for i, char in enumerate(pattern):
        if char == "{":
            if depth == 0:
                start, commas = i, []
            depth += 1
        elif char == "," and depth == 1:
            commas.append(i)
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                bounds = [start, *commas, i]
                head, tail = pattern[:start], pattern[i + 1 :]
                expanded: list[str] = []
                for lo, hi in itertools.pairwise(bounds):
                    expanded += _expand_braces(head + pattern[lo + 1 : hi] + tail)
                    if len(expanded) > MAX_GLOB_ALTERNATIVES:
                        raise GlobError(f"glob {pattern!r} has too many {{...}} alternatives")
                return expanded
    return [pattern]


def _class_regex(segment: str, i: int) -> tuple[str, int] | None:
    """The `[...]` class starting at `segment[i]` and the index of its `]`, if closed."""
    j = i + 1
    negate = j < len(segment) and segment[j] in "!^"
    j += negate
    end = segment.find("]", j + 1 if j < len(segment) and segment[j] == "]" else j)
    if end < 0:
        return None
    body = "".join(c if c == "-" else re.escape(c) for c in segment[j:end])
    return f"[{'^/' if negate else ''}{body}]", end


def _segment_regex(segment: str) -> str:
    parts: list[str] = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":
                i += 1
            parts.append("[^/]*")
        elif char == "?":
            parts.append("[^/]")
        elif char == "[" and (found := _class_regex(segment, i)):
            parts.append(found[0])
            i = found[1]
        else:
            parts.append(re.escape(char))
        i += 1
    return "".join(parts)


def _glob_regex(pattern: str) -> str:
    segments = [s for s in pattern.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise GlobError(f"glob {pattern!r} contains '..'; choose the directory with path instead")
    if not segments:
        raise GlobError(f"glob {pattern!r} matches no file name")
    parts: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:[^/]+/)*")
        else:
            parts.append(_segment_regex(segment) + ("" if last else "/"))
    return "".join(parts)


def compile_glob(pattern: str) -> LinearPattern:
    """A regex that `fullmatch`es the relative paths the glob names, matched in linear
    time (`*a*a*a*ab` would backtrack in `re`); raises GlobError."""
    alternatives = "|".join(f"(?:{_glob_regex(p)})" for p in _expand_braces(pattern))
    try:
        return compile_linear(alternatives)
    except PatternError as exc:
        raise GlobError(f"invalid glob {pattern!r}: {exc}") from None
