"""The narrow interface between a run and the work done inside it (compaction): what it
may read of the run, and the one way it may write, a step.

A step is a transaction holding the rows of one finished piece of work and the events
that report it; the events are sent only after it commits (the event log's rule), and
the head it moved to becomes the run's head then.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app.context.session import SessionConfig
from app.conversation import store
from app.conversation.records import MessageRecord
from app.domain import RunStatus
from app.engine.events import Step
from app.engine.resources import Resources
from app.models import AgentSession


@dataclass
class RunStep:
    """One step of a run: its transaction (`db`), the messages it appends and the events
    it reports."""

    db: AsyncSession
    log: Step
    head: uuid.UUID | None
    stored: list[MessageRecord] = field(default_factory=list)  # the messages it appended

    async def append(
        self,
        *messages: MessageRecord,
        add: dict[str, int] | None = None,
        session_values: dict[str, Any] | None = None,
    ) -> list[MessageRecord]:
        """Store messages (each naming its parent); the last becomes the head."""
        records = await store.append_many(self.db, messages, add=add, session_values=session_values)
        self.head = records[-1].uuid
        self.stored += records
        return records

    def report(self, event: str, data: Any) -> None:
        self.log.add(event, data)

    @property
    def run_values(self) -> dict[str, Any]:
        """Values set on the run row with the step's events."""
        return self.log.run_values


class RunHandle(Protocol):
    """What compaction sees of the run it works in."""

    @property
    def run_id(self) -> uuid.UUID: ...

    @property
    def resources(self) -> Resources: ...

    @property
    def session(self) -> AgentSession: ...

    @property
    def config(self) -> SessionConfig: ...

    @property
    def head(self) -> uuid.UUID | None: ...

    @property
    def run_usage(self) -> dict[str, int]:
        """The run's usage so far (summed over its model calls), updated in place."""
        ...

    def step(self) -> AbstractAsyncContextManager[RunStep]: ...

    async def emit(self, event: str, data: Any) -> None: ...

    async def finish(self, status: RunStatus, error: dict[str, Any] | None = None) -> None: ...
