"""Regular expressions matched in linear time (RE2), for patterns that come from a model.

Python's `re` backtracks: `(a+)+$` against a line of 27 "a"s and a "b" takes seconds,
and each more character doubles it. RE2 matches in time linear in the text for every
pattern, at the price of back-references and look-around, which it refuses at compile
time (a clear error the model can act on). Its memory per pattern is bounded too.
"""

from __future__ import annotations

from typing import Any, Protocol

import re2

MAX_PATTERN_MEMORY = 8 << 20  # bytes of RE2 program; a larger pattern is refused


class LinearPattern(Protocol):
    def search(self, text: str) -> Any: ...

    def fullmatch(self, text: str) -> Any: ...


class PatternError(ValueError):
    """RE2 refused the pattern; the message says why."""


def compile_linear(pattern: str, *, ignore_case: bool = False) -> LinearPattern:
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False  # refusals are answered, not logged
    options.max_mem = MAX_PATTERN_MEMORY
    try:
        compiled: LinearPattern = re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(str(reason)) from None
    return compiled
