"""One model response, retried on transient faults: the helper the turn and the summary
requests share, so both follow the same policy and count in the same metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app import metrics
from app.config import Settings
from app.engine.llm.client import ModelClient
from app.engine.llm.errors import ModelError, PromptTooLong
from app.engine.llm.events import MessageDone, StreamEvent
from app.engine.llm.retry import backoff_delay

log = logging.getLogger("parley.llm")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int
    base_seconds: float
    max_seconds: float

    @classmethod
    def of(cls, settings: Settings) -> RetryPolicy:
        return cls(settings.max_retries, settings.retry_base_seconds, settings.retry_max_seconds)


async def stream_with_retries(
    llm: ModelClient,
    body: dict[str, Any],
    policy: RetryPolicy,
    *,
    on_event: Callable[[StreamEvent], bool] | None = None,
    on_failure: Callable[[ModelError], Awaitable[None]] | None = None,
    on_attempt: Callable[[], None] | None = None,
) -> MessageDone:
    """Stream `body` until a whole message arrives. `on_event` sees every event of every
    attempt, and says whether it woke someone (then they run before the next event: a
    stream whose events are already buffered would otherwise hold the event loop until
    it waits for I/O, and the first delta would reach a client only after the last was
    read); `on_failure` hears of each failed attempt (before a retry, or before the
    error is raised) so a caller can withdraw what it showed; `on_attempt` counts calls.
    A "prompt is too long" answer is raised at once: only compacting can help."""
    attempt = 0
    while True:
        try:
            done: MessageDone | None = None
            try:
                async for event in llm.stream(body):
                    if on_event is not None and on_event(event):
                        await asyncio.sleep(0)
                    if isinstance(event, MessageDone):
                        done = event
            finally:
                if on_attempt is not None:
                    on_attempt()
            if done is None:
                raise ModelError("stream_broken", "The model stream ended early", retryable=True)
            metrics.model_calls.labels("ok").inc()
            return done
        except PromptTooLong:
            metrics.model_calls.labels("prompt_too_long").inc()
            raise
        except ModelError as exc:
            metrics.model_calls.labels(exc.kind).inc()
            if on_failure is not None:
                await on_failure(exc)
            if not exc.retryable or attempt >= policy.max_retries:
                raise
            delay = backoff_delay(
                attempt,
                base=policy.base_seconds,
                cap=policy.max_seconds,
                retry_after=exc.retry_after,
            )
            log.warning("model call failed (%s), retry %d in %.2fs", exc.kind, attempt + 1, delay)
            attempt += 1
            await asyncio.sleep(delay)
