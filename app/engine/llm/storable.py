"""Model output made storable: Postgres text and JSONB hold neither NUL nor a lone UTF-16
surrogate, and neither can be encoded as UTF-8 for the wire. The model can still produce
both (a `\\u0000` or an unpaired `\\ud800` escape in the stream's JSON), so the assembler
replaces each with U+FFFD as output arrives: every delta sent, every event stored and the
final message hold the same text, and no write of the run can fail on it.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
# Decoded JSON joins a valid surrogate pair into one character: any surrogate left is lone.
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    if not text.isascii():  # O(1): ASCII text (most deltas) needs no further look
        try:
            text.encode()
        except UnicodeEncodeError:
            text = _SURROGATE.sub(REPLACEMENT, text)
    return text


def storable(value: Any) -> Any:
    """A JSON value (a block, a tool's input) with every string and key made storable."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value
