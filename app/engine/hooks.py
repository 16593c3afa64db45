"""Before/after-compaction hooks, and the webhook told of each compaction."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import httpx

log = logging.getLogger("parley.compaction")


@dataclass(frozen=True)
class CompactionEvent:
    session_id: uuid.UUID
    trigger: str
    pre_tokens: int
    post_tokens: int | None = None
    summary: str | None = None
    boundary_uuid: uuid.UUID | None = None


class CompactionHooks:
    """Before/after-compaction hooks; subclass and register on `Resources.hooks`.
    A hook that raises is logged and never stops a compaction."""

    async def before(self, event: CompactionEvent) -> None:
        return None

    async def after(self, event: CompactionEvent) -> None:
        return None


class WebhookHook(CompactionHooks):
    """POSTs each completed compaction (trigger, tokens, summary) to a URL."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url
        self.timeout = timeout

    async def after(self, event: CompactionEvent) -> None:
        payload = {
            "type": "compaction.completed",
            "session_id": str(event.session_id),
            "trigger": event.trigger,
            "pre_tokens": event.pre_tokens,
            "post_tokens": event.post_tokens,
            "boundary_uuid": str(event.boundary_uuid) if event.boundary_uuid else None,
            "summary": event.summary,
        }
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            response = await client.post(self.url, json=payload)
            response.raise_for_status()


async def call_hooks(
    hooks: Sequence[CompactionHooks], stage: Literal["before", "after"], event: CompactionEvent
) -> None:
    for hook in hooks:
        try:
            await getattr(hook, stage)(event)
        except Exception:
            log.exception("compaction hook %s.%s failed", type(hook).__name__, stage)
