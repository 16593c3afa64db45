"""Streaming one model response of a run to its clients.

Deltas are published as they arrive (and stored in small batches by the event hub); a
response that breaks mid-way is announced as `message.discarded` so clients drop what
they showed, then retried as a new message; what arrived so far is kept in `partial`,
so a cancel can store it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.context.types import Block
from app.engine.events import EventHub
from app.engine.llm.client import ModelClient
from app.engine.llm.errors import ModelError
from app.engine.llm.events import (
    MessageDone,
    MessageStart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseReady,
)
from app.engine.llm.retrying import RetryPolicy, stream_with_retries


@dataclass
class Partial:
    """What a model response has produced so far (kept if the run is cancelled)."""

    uuid: uuid.UUID
    started: bool = False
    texts: dict[int, list[str]] = field(default_factory=dict)
    tool_uses: dict[int, Block] = field(default_factory=dict)

    @property
    def shown(self) -> bool:
        return self.started or bool(self.texts) or bool(self.tool_uses)

    def content(self) -> list[Block]:
        blocks: dict[int, Block] = {
            i: {"type": "text", "text": "".join(chunks)} for i, chunks in self.texts.items()
        }
        blocks.update(self.tool_uses)
        return [
            blocks[i]
            for i in sorted(blocks)
            if blocks[i].get("type") != "text" or blocks[i]["text"].strip()
        ]


class ReplyStream:
    """The model calls of one run, streamed into its event log."""

    def __init__(
        self,
        llm: ModelClient,
        events: EventHub,
        run_id: uuid.UUID,
        retry: RetryPolicy,
        on_attempt: Callable[[], None],
        durably: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]] | None = None,
        *,
        reserved_uuid: uuid.UUID | None = None,
    ) -> None:
        self.llm = llm
        self.events = events
        self.run_id = run_id
        self.retry = retry
        self.on_attempt = on_attempt
        # How its writes ride out a database outage (the run's retry policy).
        self.durably = durably or (lambda work: work())
        self.partial: Partial | None = None
        self._reserved_uuid = reserved_uuid  # the first call's, reserved by the claim

    async def call(self, body: dict[str, Any]) -> tuple[uuid.UUID, MessageDone]:
        """One whole response (retried on transient faults) and the uuid it is stored as."""
        # Ids are reserved before any delta is sent, with the message they belong to: if
        # this process stops, the next owner announces it as discarded.
        if self._reserved_uuid is not None:
            partial = self.partial = Partial(self._reserved_uuid)
            self._reserved_uuid = None
        else:
            partial = self.partial = Partial(uuid.uuid4())
            await self.durably(
                lambda: self.events.reserve(self.run_id, streaming_uuid=partial.uuid)
            )
        done = await stream_with_retries(
            self.llm,
            body,
            self.retry,
            on_event=self._on_event,
            on_failure=self._on_failure,
            on_attempt=self.on_attempt,
        )
        return self.partial.uuid, done

    def _on_event(self, event: StreamEvent) -> bool:
        """Report `event`; whether a follower was handed it."""
        partial = self.partial
        assert partial is not None
        key = str(partial.uuid)
        emit = self.events.emit_nowait
        if isinstance(event, TextDelta):
            partial.texts.setdefault(event.index, []).append(event.text)
            return emit(
                self.run_id,
                "text.delta",
                {"message_uuid": key, "index": event.index, "text": event.text},
            )
        if isinstance(event, ThinkingDelta):
            return emit(
                self.run_id,
                "thinking.delta",
                {"message_uuid": key, "index": event.index, "thinking": event.thinking},
            )
        if isinstance(event, ToolUseReady):
            partial.tool_uses[event.index] = event.block
            block = event.block
            return emit(
                self.run_id,
                "tool_use",
                {
                    "message_uuid": key,
                    "id": block["id"],
                    "name": block["name"],
                    "input": block["input"],
                },
            )
        if isinstance(event, MessageStart):
            partial.started = True
            return emit(
                self.run_id,
                "message.started",
                {"uuid": key, "role": "assistant", "model": event.model},
            )
        return False

    async def _on_failure(self, exc: ModelError) -> None:
        partial = self.partial
        assert partial is not None
        # A retry is a new message with a uuid of its own.
        retry = self.partial = Partial(uuid.uuid4())

        async def withdrawn() -> None:
            async with self.events.step(self.run_id) as step:
                if partial.shown:
                    data = {"uuid": str(partial.uuid), "reason": exc.message}
                    step.add("message.discarded", data)
                step.run_values["streaming_uuid"] = retry.uuid

        await self.durably(withdrawn)

    def take_partial(self) -> Partial | None:
        partial, self.partial = self.partial, None
        return partial
