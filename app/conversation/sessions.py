"""Agent sessions: create, list, change, delete, and their effective settings."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.context.tokens import estimate_system, estimate_tools
from app.context.tools import tool_definitions
from app.conversation.store import chain_rows
from app.conversation.views import VIEW_CACHE
from app.engine.llm.models import model_info
from app.errors import BadRequest, Conflict, Invalid
from app.models import ACTIVE_RUN_STATUSES, AgentSession, Run
from app.schemas import (
    CompactionSettings,
    ContextSummary,
    EffectiveCompaction,
    SessionCreate,
    SessionOut,
    SessionPatch,
    Usage,
)

AUTOCOMPACT_BUFFER_TOKENS = 13_000
SUMMARY_OUTPUT_RESERVE = 20_000
WARNING_BUFFER_TOKENS = 20_000


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON Merge Patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def effective_compaction(session: AgentSession, settings: Settings) -> EffectiveCompaction:
    own = session.compaction or {}
    return EffectiveCompaction(
        auto=own.get("auto", settings.compaction_auto),
        threshold_tokens=own.get("threshold_tokens"),
        context_window=own.get("context_window"),
        keep_recent_tool_results=own.get(
            "keep_recent_tool_results", settings.keep_recent_tool_results
        ),
        micro_batch_tokens=own.get("micro_batch_tokens", settings.micro_batch_tokens),
        micro=own.get("micro", settings.compaction_micro),
        collapse_at=own.get("collapse_at", settings.collapse_at),
    )


class Limits:
    """The token limits of a session: window, output reserve and thresholds."""

    def __init__(self, session: AgentSession, settings: Settings) -> None:
        info = model_info(session.model)
        compaction = effective_compaction(session, settings)
        self.context_window = compaction.context_window or info.context_window
        self.max_output_tokens = info.max_output_tokens
        computed = (
            self.context_window
            - min(self.max_output_tokens, SUMMARY_OUTPUT_RESERVE)
            - AUTOCOMPACT_BUFFER_TOKENS
        )
        # A tiny window (tests, odd gateways) still gets a positive threshold.
        computed = max(computed, self.context_window // 2)
        self.auto_compact_threshold = compaction.threshold_tokens or computed
        self.warning_threshold = max(self.auto_compact_threshold - WARNING_BUFFER_TOKENS, 0)
        self.compaction = compaction


def check_thinking(max_tokens: int | None, thinking: dict[str, Any] | None, model: str) -> None:
    kind = (thinking or {}).get("type")
    modes = model_info(model).thinking_modes
    wanted = {"enabled": "extended", "adaptive": "adaptive"}.get(kind or "")
    if wanted and modes and wanted not in modes:
        raise Invalid(
            f"model {model} does not support thinking type {kind!r} "
            f"(it supports: {', '.join(sorted(modes))})",
            errors=[
                {
                    "loc": ["body", "thinking", "type"],
                    "msg": "not supported by the model",
                    "type": "value_error",
                }
            ],
        )
    if thinking and kind == "enabled":
        budget = thinking["budget_tokens"]
        limit = max_tokens or default_max_tokens(model)
        if budget >= limit:
            raise Invalid(
                f"thinking.budget_tokens ({budget}) must be below max_tokens ({limit})",
                errors=[
                    {
                        "loc": ["body", "thinking", "budget_tokens"],
                        "msg": "must be below max_tokens",
                        "type": "value_error",
                    }
                ],
            )


def default_max_tokens(model: str) -> int:
    return min(model_info(model).max_output_tokens, 16_000)


def check_tool_names(tools: list[dict[str, Any]], builtin: Sequence[str]) -> None:
    clash = {tool["name"] for tool in tools} & set(builtin)
    if clash:
        raise Invalid(f"client tools clash with built-in tools: {sorted(clash)}")


async def create(
    db: AsyncSession, tenant: str, body: SessionCreate, settings: Settings
) -> AgentSession:
    model = body.model or settings.model
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
    builtin = list(dict.fromkeys(body.builtin_tools or []))
    thinking = body.thinking.model_dump(exclude_none=True) if body.thinking else None
    check_thinking(body.max_tokens, thinking, model)
    check_tool_names(tools, builtin)
    session = AgentSession(
        id=uuid.uuid4(),
        tenant=tenant,
        title=body.title,
        model=model,
        system=body.system,
        tools=tools,
        builtin_tools=builtin,
        max_tokens=body.max_tokens,
        thinking=thinking,
        meta=body.metadata,
        compaction=body.compaction.model_dump(exclude_none=True),
    )
    db.add(session)
    await db.flush()
    return session


async def patch(db: AsyncSession, session: AgentSession, body: SessionPatch) -> AgentSession:
    fields = body.model_dump(exclude_unset=True)
    if "compaction" in fields:
        merged = merge_patch(session.compaction or {}, fields.pop("compaction") or {})
        try:
            session.compaction = CompactionSettings.model_validate(merged).model_dump(
                exclude_none=True
            )
        except ValueError as exc:
            raise Invalid(f"compaction: {exc}") from exc
    if "metadata" in fields:
        session.meta = merge_patch(session.meta or {}, fields.pop("metadata") or {})
    if "tools" in fields:
        fields["tools"] = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
    if "builtin_tools" in fields:
        fields["builtin_tools"] = list(dict.fromkeys(fields["builtin_tools"] or []))
    for key in ("model",):
        if key in fields and fields[key] is None:
            raise Invalid(f"{key} cannot be null")
    for key, value in fields.items():
        setattr(session, key, value)
    check_thinking(session.max_tokens, session.thinking, session.model)
    check_tool_names(session.tools or [], session.builtin_tools or [])
    await db.flush()
    return session


def _encode_cursor(created_at: datetime, session_id: uuid.UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(session_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, sid = json.loads(base64.urlsafe_b64decode(padded))
        return datetime.fromisoformat(created), uuid.UUID(sid)
    except (ValueError, TypeError) as exc:
        raise BadRequest("The cursor is not valid") from exc


async def list_page(
    db: AsyncSession, tenant: str, *, limit: int, after: str | None
) -> tuple[list[AgentSession], str | None]:
    """Newest first; the cursor is the (created_at, id) of the last item."""
    query = select(AgentSession).where(AgentSession.tenant == tenant)
    if after:
        created, sid = _decode_cursor(after)
        query = query.where(
            or_(
                AgentSession.created_at < created,
                and_(AgentSession.created_at == created, AgentSession.id < sid),
            )
        )
    query = query.order_by(AgentSession.created_at.desc(), AgentSession.id.desc()).limit(limit + 1)
    rows = list((await db.scalars(query)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = _encode_cursor(rows[-1].created_at, rows[-1].id) if more and rows else None
    return rows, cursor


async def delete_session(db: AsyncSession, session: AgentSession) -> None:
    await db.execute(delete(AgentSession).where(AgentSession.id == session.id))


async def statuses(db: AsyncSession, session_ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    if not session_ids:
        return {}
    result = await db.execute(
        select(Run.session_id, Run.status).where(
            Run.session_id.in_(session_ids), Run.status.in_(ACTIVE_RUN_STATUSES)
        )
    )
    return {sid: status for sid, status in result.all()}


async def estimated_tokens(db: AsyncSession, session: AgentSession) -> int:
    """The last response's real usage plus the stored estimates of what came after it
    (invariant 8); system and tools estimated when no response is in the view."""
    rows = VIEW_CACHE.peek(session.id, session.head_uuid)
    if rows is None:
        rows = await chain_rows(
            db, session.head_uuid, full=False, columns=("role", "usage", "token_estimate")
        )
    return estimate_from_rows(session, rows)


def estimate_from_rows(session: AgentSession, rows: Any) -> int:
    """Stored estimates are in calibration tokens; newer models' tokenizers count more
    for the same text (`tokens_per_char_factor`)."""
    factor = model_info(session.model).tokens_per_char_factor
    after = 0
    for row in reversed(rows):
        usage = row.usage
        if row.role == "assistant" and usage:
            anchored = (
                usage.get("input_tokens", 0)
                + usage.get("cache_read_input_tokens", 0)
                + usage.get("cache_creation_input_tokens", 0)
                + usage.get("output_tokens", 0)
            )
            if anchored:
                return int(anchored + after * factor)
        if row.role is not None:
            after += row.token_estimate
    definitions = estimate_system(session.system) + estimate_tools(
        tool_definitions(session.builtin_tools or [], session.tools or [])
    )
    return int((after + definitions) * factor)


async def to_out(
    db: AsyncSession, session: AgentSession, settings: Settings, status: str | None = None
) -> SessionOut:
    if status is None:
        status = (await statuses(db, [session.id])).get(session.id, "idle")
    limits = Limits(session, settings)
    return SessionOut(
        id=session.id,
        title=session.title,
        model=session.model,
        system=session.system,
        tools=session.tools or [],
        builtin_tools=session.builtin_tools or [],
        max_tokens=session.max_tokens,
        thinking=session.thinking,
        compaction=limits.compaction,
        status=status,
        head_uuid=session.head_uuid,
        created_at=session.created_at,
        updated_at=session.updated_at,
        metadata=session.meta or {},
        usage=Usage(
            input_tokens=session.input_tokens,
            output_tokens=session.output_tokens,
            cache_read_input_tokens=session.cache_read_input_tokens,
            cache_creation_input_tokens=session.cache_creation_input_tokens,
        ),
        context=ContextSummary(
            estimated_tokens=await estimated_tokens(db, session),
            context_window=limits.context_window,
            auto_compact_threshold=limits.auto_compact_threshold,
        ),
    )


async def active_run(db: AsyncSession, session_id: uuid.UUID) -> Run | None:
    return await db.scalar(
        select(Run).where(Run.session_id == session_id, Run.status.in_(ACTIVE_RUN_STATUSES))
    )


async def require_idle(db: AsyncSession, session: AgentSession) -> None:
    """Moving the head under an active run would graft its output onto another branch."""
    run = await active_run(db, session.id)
    if run is not None:
        raise Conflict(
            f"Session {session.id} has an active run {run.id}; cancel it or wait",
            extra={"run_id": str(run.id)},
        )
