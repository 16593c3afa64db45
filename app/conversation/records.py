"""`MessageRecord`: the one shape of a stored message, for every read and write.

Its fields are the columns of `messages`, in table order, so a row converts to a record
by position and a record to insert values by name. The pure context code works on
`Node`s (`to_node`); the API shows `payloads.message_out(record)`. A new column is added
in `models.Message`, a migration, and here.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from app.context.tokens import estimate_content
from app.context.types import Block, Node
from app.models import utcnow


@dataclass(frozen=True, slots=True)
class MessageRecord:
    uuid: UUID
    session_id: UUID
    seq: int  # order of insertion within the session; set by the store when appended
    parent_uuid: UUID | None
    logical_parent_uuid: UUID | None
    type: str
    subtype: str | None
    role: str | None
    content: list[Block]
    model: str | None
    stop_reason: str | None
    usage: dict[str, Any] | None
    is_meta: bool
    token_estimate: int
    copied_from: UUID | None
    run_id: UUID | None
    metadata: dict[str, Any] | None
    created_at: datetime = field(default_factory=utcnow)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> MessageRecord:
        """From a result row whose first columns are `COLUMNS` (extra ones ignored)."""
        return cls(*row[:COLUMN_COUNT])

    def values(self) -> dict[str, Any]:
        """Insert values, keyed by column name (shallow: the content is not copied)."""
        return {name: getattr(self, name) for name in COLUMNS}

    def with_(self, **changes: Any) -> MessageRecord:
        return replace(self, **changes)

    def to_node(self) -> Node:
        return Node(
            uuid=str(self.uuid),
            type=self.type,
            role=self.role,
            content=self.content,
            subtype=self.subtype,
            is_meta=self.is_meta,
            token_estimate=self.token_estimate,
            stop_reason=self.stop_reason,
            usage=self.usage,
            model=self.model,
            meta=self.metadata,
        )


COLUMNS = tuple(f.name for f in fields(MessageRecord))
COLUMN_COUNT = len(COLUMNS)


def new_message(
    *,
    session_id: uuid.UUID,
    parent_uuid: uuid.UUID | None,
    type: str,
    role: str | None,
    content: list[Block],
    subtype: str | None = None,
    logical_parent_uuid: uuid.UUID | None = None,
    model: str | None = None,
    stop_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    is_meta: bool = False,
    copied_from: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
    metadata: dict[str, Any] | None = None,
    uuid_: UUID | None = None,
    token_estimate: int | None = None,
    created_at: datetime | None = None,
    seq: int = 0,
) -> MessageRecord:
    """A message to append (the store gives it its seq, unless the caller knows it). Its
    token estimate is computed once, here (invariant 8)."""
    return MessageRecord(
        uuid=uuid_ or uuid.uuid4(),
        session_id=session_id,
        seq=seq,
        parent_uuid=parent_uuid,
        logical_parent_uuid=logical_parent_uuid,
        type=type,
        subtype=subtype,
        role=role,
        content=content,
        model=model,
        stop_reason=stop_reason,
        usage=usage,
        is_meta=is_meta,
        token_estimate=estimate_content(content) if token_estimate is None else token_estimate,
        copied_from=copied_from,
        run_id=run_id,
        metadata=metadata,
        created_at=created_at or utcnow(),
    )
