"""Pydantic models of the HTTP contract (docs/api.md). Requests forbid unknown fields."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    field_validator,
    model_validator,
)

from app.context.shapes import RESULT_CONTENT_BLOCKS, ShapeError, check_block, check_storable
from app.context.tools import BuiltinTool
from app.domain import IfBusy, RunKind, RunStatus

T = TypeVar("T")

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
USER_BLOCK_TYPES = frozenset({"text", "image", "document"})


# --- text that can be stored ------------------------------------------------------------


def storable(value: T) -> T:
    """Refuse any string (or key, at any depth) holding NUL or a lone surrogate; the
    message names where it lies inside the field."""
    try:
        check_storable(value, "value")
    except ShapeError as exc:
        raise ValueError(str(exc)) from None
    return value


Storable = AfterValidator(storable)
# A string that can be stored: the type of every free-text field a client sends.
Text = Annotated[str, Storable]
JsonObject = Annotated[dict[str, Any], Storable]


class StrictModel(BaseModel):
    """A request body: unknown fields are refused, and so are values of another JSON type
    (`0` for a boolean, `"5"` for an integer): the body must match the documented schema.
    Strings that name a uuid or an enum member are converted (`Lax`)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# A uuid or an enum member, given in JSON as a string.
Lax = Strict(False)

_RFC3339_DATE = re.compile(r"\d{4}-\d\d-\d\d")


def _rfc3339_only(value: Any) -> Any:
    """A time as a query parameter: an RFC 3339 date and time, not a number of seconds
    (pydantic's lax mode would read `0.5` as 1970)."""
    if isinstance(value, str) and not _RFC3339_DATE.match(value):
        raise ValueError("must be an RFC 3339 date and time, such as 2026-12-01T00:00:00Z")
    return value


Timestamp = Annotated[datetime, BeforeValidator(_rfc3339_only)]


class Page(BaseModel, Generic[T]):
    data: list[T]
    next_cursor: str | None = None


# --- content -------------------------------------------------------------------------


def check_user_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not blocks:
        raise ValueError("content must not be empty")
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind not in USER_BLOCK_TYPES:
            raise ValueError(f"content[{i}]: block type must be one of {sorted(USER_BLOCK_TYPES)}")
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"content[{i}]: text blocks must contain non-whitespace text")
        else:
            try:  # what the model API would refuse on every later turn
                check_block(block, f"content[{i}]", USER_BLOCK_TYPES)
            except ShapeError as exc:
                raise ValueError(str(exc)) from None
    return blocks


UserContent = Annotated[Annotated[str, Field(min_length=1)] | list[dict[str, Any]], Storable]


def check_user_content(value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("content must contain non-whitespace text")
        return value
    return check_user_blocks(value)


# --- sessions ------------------------------------------------------------------------


class CompactionSettings(StrictModel):
    """Per-session compaction settings; each field left out takes its documented default."""

    auto: bool | None = Field(None, description="Auto-compaction near the limit (default true)")
    threshold_tokens: int | None = Field(
        None, ge=1000, description="Overrides the computed auto-compaction threshold"
    )
    context_window: int | None = Field(None, ge=2000, description="Overrides the model's window")
    keep_recent_tool_results: int | None = Field(
        None, ge=0, description="Micro-compaction keeps the newest N results (default 5)"
    )
    micro_batch_tokens: int | None = Field(
        None, ge=0, description="A micro-compaction must free at least this many (default 20000)"
    )
    micro: bool | None = Field(None, description="Micro-compaction on (default true)")
    collapse_at: float | None = Field(
        None, gt=0, le=1, description="Share of the threshold at which collapses apply (0.9)"
    )


class EffectiveCompaction(BaseModel):
    auto: bool
    threshold_tokens: int | None
    context_window: int | None
    keep_recent_tool_results: int
    micro_batch_tokens: int
    micro: bool
    collapse_at: float


class ThinkingConfig(StrictModel):
    """`enabled` with a budget (extended thinking), `adaptive` (the model decides how
    much to think; Claude 5 models support only this), or `disabled`."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(None, ge=1024)

    @model_validator(mode="after")
    def _budget_when_enabled(self) -> ThinkingConfig:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("thinking.budget_tokens is required when thinking is enabled")
        if self.type != "enabled" and self.budget_tokens is not None:
            raise ValueError("thinking.budget_tokens applies only to type enabled")
        return self


class ToolDefinition(BaseModel):
    """A client tool in the Anthropic shape; `compactable` is Parley's own key."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str
    description: Text | None = None
    input_schema: JsonObject
    compactable: bool = False

    @model_validator(mode="after")
    def _storable_extra(self) -> ToolDefinition:
        for key, value in (self.model_extra or {}).items():
            storable({key: value})
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not TOOL_NAME.match(value):
            raise ValueError("tool names match ^[a-zA-Z0-9_-]{1,64}$")
        return value

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError('input_schema must be a JSON schema with "type": "object"')
        return value


SystemPrompt = Annotated[str | list[dict[str, Any]], Storable]


def check_system(value: SystemPrompt | None) -> SystemPrompt | None:
    if isinstance(value, list):
        for i, block in enumerate(value):
            if block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise ValueError(f"system[{i}]: system blocks must be text blocks")
    return value


class SessionFields(StrictModel):
    # Enum members leave as plain names: the store and messages built from them (a tool
    # name clash) see exactly what the client sent.
    model_config = ConfigDict(extra="forbid", use_enum_values=True)

    title: Text | None = Field(None, max_length=500)
    model: Text | None = Field(None, min_length=1, max_length=200)
    system: SystemPrompt | None = None
    tools: list[ToolDefinition] | None = None
    builtin_tools: list[Annotated[BuiltinTool, Lax]] | None = None
    max_tokens: int | None = Field(None, ge=1, le=128_000)
    thinking: ThinkingConfig | None = None
    # Input + output tokens the session may use per budget period (null: no limit).
    token_budget: int | None = Field(None, ge=1, le=10**15)

    @field_validator("system")
    @classmethod
    def _system(cls, value: SystemPrompt | None) -> SystemPrompt | None:
        return check_system(value)

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value: list[ToolDefinition] | None) -> list[ToolDefinition] | None:
        if value is not None:
            names = [tool.name for tool in value]
            if len(names) != len(set(names)):
                raise ValueError("tool names must be unique")
        return value


class SessionCreate(SessionFields):
    metadata: JsonObject = Field(default_factory=dict)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)


class SessionPatch(SessionFields):
    """`metadata` and `compaction` are JSON Merge Patches (RFC 7396)."""

    metadata: JsonObject | None = None
    compaction: JsonObject | None = None


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class ContextSummary(BaseModel):
    estimated_tokens: int
    context_window: int
    auto_compact_threshold: int


class SessionOut(BaseModel):
    id: UUID
    title: str | None
    model: str
    system: SystemPrompt | None
    tools: list[dict[str, Any]]
    builtin_tools: list[str]
    max_tokens: int | None
    token_budget: int | None
    thinking: dict[str, Any] | None
    compaction: EffectiveCompaction
    status: Literal["idle", "running", "requires_action"]
    head_uuid: UUID | None
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any]
    usage: Usage
    context: ContextSummary


# --- messages and the tree -------------------------------------------------------------


class MessageOut(BaseModel):
    uuid: Annotated[UUID, Lax]
    parent_uuid: UUID | None
    logical_parent_uuid: UUID | None
    type: str
    subtype: str | None
    role: str | None
    content: list[dict[str, Any]]
    model: str | None
    stop_reason: str | None
    usage: dict[str, Any] | None
    is_meta: bool
    copied_from: UUID | None
    created_at: datetime
    metadata: dict[str, Any] | None = None


class TreeNode(BaseModel):
    uuid: Annotated[UUID, Lax]
    parent_uuid: UUID | None
    logical_parent_uuid: UUID | None
    type: str
    subtype: str | None
    role: str | None
    preview: str
    created_at: datetime


class HeadIn(StrictModel):
    uuid: Annotated[UUID, Lax]


class ForkIn(StrictModel):
    at_uuid: Annotated[UUID, Lax] | None = None


class SnipIn(StrictModel):
    uuids: list[Annotated[UUID, Lax]] = Field(min_length=1, max_length=1000)


class SnipOut(BaseModel):
    snipped: list[UUID]


# --- runs ------------------------------------------------------------------------------


class DeliveryMode(StrictModel):
    stream: bool = False
    background: bool = False

    @model_validator(mode="after")
    def _one_mode(self) -> DeliveryMode:
        if self.stream and self.background:
            raise ValueError("stream and background cannot both be true")
        return self


class TurnIn(DeliveryMode):
    content: UserContent
    parent_uuid: Annotated[UUID, Lax] | None = None
    if_busy: Annotated[IfBusy, Lax] = IfBusy.REJECT
    # Told of this run's events (signed with the tenant's turn secret), beside the
    # tenant's registered endpoints.
    webhook_url: Text | None = Field(None, min_length=8, max_length=2000)

    @field_validator("content")
    @classmethod
    def _content(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        return check_user_content(value)


class ToolResultIn(StrictModel):
    tool_use_id: Text = Field(min_length=1, max_length=256)
    content: Annotated[str | list[dict[str, Any]], Storable] = ""
    is_error: bool = False

    @field_validator("content")
    @classmethod
    def _blocks(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, list):
            try:  # what the model API would refuse on every later turn
                for i, block in enumerate(value):
                    check_block(block, f"content[{i}]", RESULT_CONTENT_BLOCKS)
            except ShapeError as exc:
                raise ValueError(str(exc)) from None
        return value


class ToolResultsIn(DeliveryMode):
    results: list[ToolResultIn] = Field(min_length=1)


class CompactIn(StrictModel):
    instructions: Text | None = Field(None, max_length=20_000)
    background: bool = False


class RunError(BaseModel):
    type: str
    message: str
    request_id: str | None = None
    # a compaction refused as `nothing_to_gain`: the request now, the one it would leave
    pre_tokens: int | None = None
    post_tokens: int | None = None
    min_saving: float | None = None
    # `budget_exceeded`: which budget (tenant, session), its limit, what was used, period
    budget: Literal["tenant", "session"] | None = None
    limit: int | None = None
    used: int | None = None
    period: str | None = None


class ToolUseRequest(BaseModel):
    id: str
    name: str
    input: dict[str, Any]


class RequiredAction(BaseModel):
    type: Literal["tool_results"] = "tool_results"
    tool_uses: list[ToolUseRequest]


class RunOut(BaseModel):
    id: UUID
    session_id: UUID
    kind: RunKind
    status: RunStatus
    user_message_uuid: UUID | None
    required_action: RequiredAction | None
    usage: Usage
    error: RunError | None
    created_at: datetime
    finished_at: datetime | None


class TurnResult(BaseModel):
    run: RunOut
    messages: list[MessageOut]


class CompactResult(BaseModel):
    run: RunOut
    boundary_uuid: UUID | None
    summary_uuid: UUID | None
    summary: str | None
    pre_tokens: int
    post_tokens: int
    tokens_saved: int
    messages_compacted: int


class CompactRefused(BaseModel):
    """A refused compaction (`application/problem+json`): `type` is `invalid_request`
    (nothing can be compacted; `detail` says why) or `nothing_to_gain` (compacting would
    not make the next request smaller by `min_saving`: `pre_tokens` is the request now,
    `post_tokens` what it would be after; estimates in the session model's tokens)."""

    type: Literal["invalid_request", "nothing_to_gain"]
    title: str
    status: int
    detail: str
    pre_tokens: int | None = None
    post_tokens: int | None = None
    min_saving: float | None = None


# --- context and files -----------------------------------------------------------------


class ContextBreakdown(BaseModel):
    system: int
    tools: int
    messages: int
    tool_results: int


class ContextOut(BaseModel):
    estimated_tokens: int
    context_window: int
    max_output_tokens: int
    auto_compact_threshold: int
    warning_threshold: int
    percent_used: float
    breakdown: ContextBreakdown
    last_compaction: dict[str, Any] | None


class FileOut(BaseModel):
    path: str
    size: int
    sha256: str
    updated_at: datetime


class ProblemError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    """An error answer (RFC 9457, `application/problem+json`): `type` is what clients
    branch on (`invalid_request`, `unauthorized`, `not_found`, `conflict`, ...); a 422
    names the offending fields in `errors`; some problems add members (`run_id`)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    errors: list[ProblemError] | None = None


class Health(BaseModel):
    status: str
    detail: str | None = None


# --- webhooks ---------------------------------------------------------------------------

WebhookEvent = Literal[
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.requires_action",
    "compaction.completed",
]


class WebhookIn(StrictModel):
    url: str = Field(min_length=8, max_length=2000)
    events: list[WebhookEvent] = Field(min_length=1)


class WebhookOut(BaseModel):
    id: UUID
    url: str
    events: list[WebhookEvent]
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret (whsec_...): shown only now")


class WebhookDeliveryOut(BaseModel):
    id: UUID = Field(description="Also the `webhook-id` header of every attempt")
    endpoint_id: UUID | None = Field(description="None: a turn's own webhook_url")
    url: str
    run_id: UUID | None
    event: WebhookEvent
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: datetime | None
    last_status: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    payload: dict[str, Any]


class TurnSecretOut(BaseModel):
    secret: str = Field(description="Signs the deliveries to a turn's own webhook_url")


# --- usage and browser tokens -------------------------------------------------------------


class SessionUsage(BaseModel):
    session_id: UUID
    input_tokens: int
    output_tokens: int


class UsageOut(BaseModel):
    from_: datetime = Field(alias="from", serialization_alias="from")
    to: datetime
    input_tokens: int = Field(description="Every token the model read, cached or not")
    output_tokens: int
    sessions: list[SessionUsage]

    model_config = ConfigDict(populate_by_name=True)


class TokenIn(StrictModel):
    session_id: Annotated[UUID, Lax]
    read_only: bool = False
    ttl_seconds: int = Field(900, ge=10, description="Lifetime, at most the server's maximum")


class TokenOut(BaseModel):
    token: str
    session_id: UUID
    read_only: bool
    expires_at: datetime
