"""ORM rows. Every message is a node of its session's tree; nothing here is ever
rewritten to forget: compaction, snips, micro-compaction and collapse add rows.

Index notes: a chain walk follows `parent_uuid` (or `logical_parent_uuid` past a
compact boundary) through primary-key lookups, so it costs O(chain length) however
large the table grows. `parent_uuid` and `logical_parent_uuid` are indexed as well,
because Postgres checks the self-referencing foreign keys when rows are deleted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    Uuid,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, JSONType, PydanticJSON, StrEnumType
from app.domain import RunKind, RunParams, RunState, RunStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


# The partial index's predicate: the active statuses (`RunStatus.is_active`).
ACTIVE_STATUS_SQL = "status IN ('running', 'requires_action')"


class AgentSession(Base):
    __tablename__ = "agent_sessions"

    id: Mapped[UUID] = mapped_column(Uuid, primary_key=True, default=uuid4)
    tenant: Mapped[str] = mapped_column(String(200))
    title: Mapped[str | None] = mapped_column(String(500))
    model: Mapped[str] = mapped_column(String(200))
    system: Mapped[Any] = mapped_column(JSONType, nullable=True)
    tools: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    builtin_tools: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    thinking: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    compaction: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    head_uuid: Mapped[UUID | None] = mapped_column(Uuid)
    message_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_read_input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_creation_input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    compact_failures: Mapped[int] = mapped_column(Integer, default=0)
    # Bumped by every write of the session's marks (snips, micro watermarks, collapses):
    # a cached copy of the marks read at this version is still the truth.
    marks_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Input + output tokens this session may use per budget period (None: no limit).
    token_budget: Mapped[int | None] = mapped_column(BigInteger)
    last_request_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )

    __table_args__ = (Index("ix_agent_sessions_tenant_created", "tenant", "created_at", "id"),)


class Message(Base):
    __tablename__ = "messages"

    uuid: Mapped[UUID] = mapped_column(Uuid, primary_key=True, default=uuid4)
    session_id: Mapped[UUID] = mapped_column(ForeignKey("agent_sessions.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(BigInteger)
    parent_uuid: Mapped[UUID | None] = mapped_column(
        ForeignKey("messages.uuid", ondelete="CASCADE"), index=True
    )
    logical_parent_uuid: Mapped[UUID | None] = mapped_column(
        ForeignKey("messages.uuid", ondelete="CASCADE"), index=True
    )
    type: Mapped[str] = mapped_column(String(32))
    subtype: Mapped[str | None] = mapped_column(String(64))
    role: Mapped[str | None] = mapped_column(String(16))
    content: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    model: Mapped[str | None] = mapped_column(String(200))
    stop_reason: Mapped[str | None] = mapped_column(String(64))
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    is_meta: Mapped[bool] = mapped_column(Boolean, default=False)
    token_estimate: Mapped[int] = mapped_column(Integer, default=0)
    copied_from: Mapped[UUID | None] = mapped_column(Uuid)
    run_id: Mapped[UUID | None] = mapped_column(Uuid, index=True)
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (Index("uq_messages_session_seq", "session_id", "seq", unique=True),)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[UUID] = mapped_column(Uuid, primary_key=True, default=uuid4)
    session_id: Mapped[UUID] = mapped_column(ForeignKey("agent_sessions.id", ondelete="CASCADE"))
    kind: Mapped[RunKind] = mapped_column(StrEnumType(RunKind, 16), default=RunKind.TURN)
    status: Mapped[RunStatus] = mapped_column(StrEnumType(RunStatus, 32))
    user_message_uuid: Mapped[UUID | None] = mapped_column(Uuid)
    required_action: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    usage: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    # What the client asked for (kept until the run starts, so a queued turn is never lost).
    params: Mapped[RunParams] = mapped_column(PydanticJSON(RunParams), default=RunParams)
    # Loop state that must survive a pause (tool results computed before requires_action).
    state: Mapped[RunState] = mapped_column(PydanticJSON(RunState), default=RunState)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    # The client tool results accepted, by the ids they answer: each post's body hash and
    # where its answer started, so a repeat answers as the first did.
    tool_answers: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    last_event_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Fencing: bumped at every claim or take-over; a write of the run's owner holds only
    # while the row still has the owner's epoch.
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The highest event id an owner may have sent: a later owner starts after it, so no
    # id is ever given to two events.
    reserved_seq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    takeovers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The model message being streamed (announced as discarded if its owner stops).
    streaming_uuid: Mapped[UUID | None] = mapped_column(Uuid)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        # At most one active run per session, whichever process tries to start one.
        Index(
            "uq_runs_one_active_per_session",
            "session_id",
            unique=True,
            postgresql_where=text(ACTIVE_STATUS_SQL),
            sqlite_where=text(ACTIVE_STATUS_SQL),
        ),
        Index(
            "uq_runs_session_idempotency_key",
            "session_id",
            "idempotency_key",
            unique=True,
            postgresql_where=text("idempotency_key IS NOT NULL"),
            sqlite_where=text("idempotency_key IS NOT NULL"),
        ),
        Index("ix_runs_session_created", "session_id", "created_at", "id"),
        Index("ix_runs_status", "status", "lease_expires_at"),
    )


class RunEvent(Base):
    __tablename__ = "run_events"

    run_id: Mapped[UUID] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    event: Mapped[str] = mapped_column(String(64))
    # The exact JSON text that was sent; JSONB would reorder keys and break byte-equal replay.
    data: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class File(Base):
    __tablename__ = "files"

    session_id: Mapped[UUID] = mapped_column(
        ForeignKey("agent_sessions.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    content: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKey(Base):
    """A key kept hashed in the database, beside those of PARLEY_API_KEYS."""

    __tablename__ = "api_keys"

    id: Mapped[UUID] = mapped_column(Uuid, primary_key=True, default=uuid4)
    tenant: Mapped[str] = mapped_column(String(200))
    name: Mapped[str | None] = mapped_column(String(200))
    key_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Snip(Base):
    """A message left out of every later model request (it stays in history)."""

    __tablename__ = "snips"

    message_uuid: Mapped[UUID] = mapped_column(
        ForeignKey("messages.uuid", ondelete="CASCADE"), primary_key=True
    )
    session_id: Mapped[UUID] = mapped_column(
        ForeignKey("agent_sessions.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class MicroWatermark(Base):
    """Micro-compaction clears compactable tool results up to `anchor_uuid` on the chain.

    Monotone along a chain: a new row is only ever written further down it. The view
    uses the deepest watermark that lies on the current chain, so a head move or a
    fork keeps the right one.
    """

    __tablename__ = "micro_watermarks"

    id: Mapped[UUID] = mapped_column(Uuid, primary_key=True, default=uuid4)
    session_id: Mapped[UUID] = mapped_column(
        ForeignKey("agent_sessions.id", ondelete="CASCADE"), index=True
    )
    anchor_uuid: Mapped[UUID] = mapped_column(
        ForeignKey("messages.uuid", ondelete="CASCADE"), index=True
    )
    tokens_freed: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Collapse(Base):
    """A completed span of the chain, shown to the model as its summary once applied."""

    __tablename__ = "collapses"

    id: Mapped[UUID] = mapped_column(Uuid, primary_key=True, default=uuid4)
    session_id: Mapped[UUID] = mapped_column(
        ForeignKey("agent_sessions.id", ondelete="CASCADE"), index=True
    )
    start_uuid: Mapped[UUID] = mapped_column(
        ForeignKey("messages.uuid", ondelete="CASCADE"), index=True
    )
    end_uuid: Mapped[UUID] = mapped_column(
        ForeignKey("messages.uuid", ondelete="CASCADE"), index=True
    )
    summary: Mapped[str] = mapped_column(Text)
    tokens_saved: Mapped[int] = mapped_column(Integer, default=0)
    model: Mapped[str | None] = mapped_column(String(200))
    # Set the first time a request shows the span collapsed; it stays collapsed after
    # that, so the request prefix (and the prompt cache) stays stable.
    applied_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WebhookEndpoint(Base):
    """A tenant's receiver of run and compaction events. The secret (Standard Webhooks,
    `whsec_...`) is kept as is: every delivery is signed with it."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[UUID] = mapped_column(Uuid, primary_key=True, default=uuid4)
    tenant: Mapped[str] = mapped_column(String(200), index=True)
    url: Mapped[str] = mapped_column(String(2000))
    events: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    secret: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WebhookDelivery(Base):
    """The outbox: one event for one receiver, written in the transaction of the state it
    reports and sent by whichever replica claims it first. `endpoint_id` is None for a
    turn's own `webhook_url` (signed with the tenant's turn secret)."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[UUID] = mapped_column(Uuid, primary_key=True, default=uuid4)
    tenant: Mapped[str] = mapped_column(String(200))
    endpoint_id: Mapped[UUID | None] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )
    url: Mapped[str] = mapped_column(String(2000))
    run_id: Mapped[UUID | None] = mapped_column(Uuid)  # the run reported (no foreign key:
    # a delivery outlives its session)
    event: Mapped[str] = mapped_column(String(64))
    # The exact JSON body that is signed and sent.
    payload: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "created_at", "id"),
        Index("ix_webhook_deliveries_run", "run_id"),
    )


class RateWindow(Base):
    """A fixed-window request counter shared by every replica (`limits/rate.py`)."""

    __tablename__ = "rate_windows"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)


class TokenUsage(Base):
    """Input and output tokens of one session in one hour: what budgets and `GET /usage`
    read. Every model call adds to its row (turns, summaries, collapses)."""

    __tablename__ = "token_usage"

    session_id: Mapped[UUID] = mapped_column(Uuid, primary_key=True)
    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(200))
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)

    __table_args__ = (Index("ix_token_usage_tenant_hour", "tenant", "hour"),)
