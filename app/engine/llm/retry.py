"""How long to wait before retrying a failed model call: pure, so it can be tested exactly.

Exponential backoff with jitter spreads the retries of many runs hit by the same
overload; equal jitter (the default) keeps at least half of the exponential step, so a
retry after a 529 is never immediate, while full jitter spreads widest. A server's
`retry-after` is a floor (up to a minute): retrying earlier only earns another 429.
"""

from __future__ import annotations

import math
import random
from typing import Final, Literal

__all__ = ["MAX_RETRY_AFTER_SECONDS", "backoff_delay"]

# The longest retry-after obeyed: a run is not held for however long a server asks,
# it retries after this and fails once out of retries.
MAX_RETRY_AFTER_SECONDS: Final = 60.0
# Jitter added on top of a retry-after floor, as a fraction of it, so runs told to come
# back at the same second do not all come back at that very instant.
_RETRY_AFTER_SPREAD: Final = 0.1


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None,
    rng: random.Random | None = None,
    jitter: Literal["equal", "full"] = "equal",
) -> float:
    """Seconds to sleep before retry number `attempt` (0 for the first retry).

    The exponential step is `min(cap, base * 2**attempt)`; equal jitter draws from
    `[step/2, step]`, full jitter from `[0, step]`. With `retry_after` (seconds, from
    the server) the result is at least `min(retry_after, MAX_RETRY_AFTER_SECONDS)`,
    with up to 10% spread above it. Never negative; at most `cap` without a
    retry-after, at most `max(cap, MAX_RETRY_AFTER_SECONDS)` with one.
    """
    draw = rng.random() if rng is not None else random.random()
    base = max(0.0, base) if math.isfinite(base) else 0.0
    cap = max(0.0, cap) if math.isfinite(cap) else MAX_RETRY_AFTER_SECONDS
    exponent = min(max(attempt, 0), 64)  # a float power that cannot overflow
    step = min(cap, base * (2.0**exponent))
    delay = step * draw if jitter == "full" else step / 2.0 + step / 2.0 * draw
    if retry_after is not None and math.isfinite(retry_after) and retry_after > 0:
        floor = retry_after * (1.0 + _RETRY_AFTER_SPREAD * draw)
        delay = max(delay, min(floor, MAX_RETRY_AFTER_SECONDS))
    return delay
