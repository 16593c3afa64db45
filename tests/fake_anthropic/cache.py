"""The fake's prompt-cache model.

The prompt is a sequence of blocks (tools, system, messages; see ``tokens.prompt_blocks``).
Position ``p`` names the prefix of blocks ``0..p``; its hash chains the model name and the
blocks' keys (blocks without ``cache_control``, so moving a breakpoint changes no hash).

For one request:

1. Read: for each breakpoint ``b`` (a block with ``cache_control``), look for a live entry
   at ``b``, ``b-1``, ..., ``b-lookback`` (the nearest wins). ``cache_read`` is the token
   length of the longest prefix found over all breakpoints; that entry's life is refreshed.
2. Write: every breakpoint past the read point whose prefix is at least ``min_tokens`` long
   is written with its TTL (``"ttl": "1h"`` or the 5-minute default). ``cache_creation`` is
   the tokens from the read point up to the last written breakpoint.
3. ``input_tokens = total - cache_read - cache_creation``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .tokens import PromptBlock

__all__ = ["PromptCache"]


class PromptCache:
    """Prefix hash -> (expires_at, ttl). Not thread-safe: the caller holds a lock."""

    def __init__(self) -> None:
        self.entries: dict[bytes, tuple[float, float]] = {}

    def clear(self) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)

    def _purge(self, now: float) -> None:
        self.entries = {k: v for k, v in self.entries.items() if v[0] > now}

    def apply(
        self,
        blocks: list[PromptBlock],
        *,
        model: str,
        now: float,
        min_tokens: int,
        lookback: int,
        ttl_5m: float,
        ttl_1h: float,
        write: bool = True,
    ) -> dict[str, Any]:
        """Reads (and, with ``write``, writes) the cache for one request; returns usage."""
        total = 0
        cum: list[int] = []
        for b in blocks:
            total += b.tokens
            cum.append(total)
        breakpoints = [i for i, b in enumerate(blocks) if b.cache_control is not None]
        usage: dict[str, Any] = {
            "input_tokens": total,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        }
        if not breakpoints:
            return usage
        if len(self.entries) > 100_000:
            self._purge(now)

        digests: list[bytes] = []
        h = hashlib.sha256(model.encode())
        last_bp = breakpoints[-1]
        for i in range(last_bp + 1):
            key = blocks[i].key()
            h.update(len(key).to_bytes(8, "big"))
            h.update(key)
            digests.append(h.copy().digest())

        entries = self.entries
        best = -1
        for bp in breakpoints:
            for p in range(bp, max(-1, bp - lookback - 1), -1):
                if p <= best:
                    break
                entry = entries.get(digests[p])
                if entry is not None and entry[0] > now:
                    best = p
                    break
        read = cum[best] if best >= 0 else 0
        if best >= 0 and write:
            ttl = entries[digests[best]][1]
            entries[digests[best]] = (now + ttl, ttl)

        creation = 0
        by_ttl = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
        prev = read
        for bp in breakpoints:
            if bp <= best or cum[bp] < min_tokens:
                continue
            is_1h = blocks[bp].cache_control.get("ttl") == "1h"  # type: ignore[union-attr]
            ttl = ttl_1h if is_1h else ttl_5m
            if write:
                entries[digests[bp]] = (now + ttl, ttl)
            segment = cum[bp] - prev
            prev = cum[bp]
            creation += segment
            by_ttl["ephemeral_1h_input_tokens" if is_1h else "ephemeral_5m_input_tokens"] += segment

        usage["input_tokens"] = total - read - creation
        usage["cache_read_input_tokens"] = read
        usage["cache_creation_input_tokens"] = creation
        usage["cache_creation"] = by_ttl
        return usage
