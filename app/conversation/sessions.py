"""Agent sessions: create, list, change, delete, and their effective settings."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.context.estimates import anchored_estimate
from app.context.limits import Limits, default_max_tokens
from app.context.models import model_info
from app.context.session import CompactionConfig, SessionConfig
from app.conversation.views import ChainCache, load_view
from app.domain import ACTIVE_RUN_STATUSES
from app.errors import Conflict, Invalid, NotFound
from app.models import AgentSession, Run
from app.pagination import dated_key, newest_first, page
from app.schemas import (
    CompactionSettings,
    ContextSummary,
    EffectiveCompaction,
    SessionCreate,
    SessionOut,
    SessionPatch,
    Usage,
)


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


def compaction_config(session: AgentSession, settings: Settings) -> CompactionConfig:
    """The session's compaction settings with the service defaults filled in."""
    own = session.compaction or {}
    return CompactionConfig(
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


def config_of(session: AgentSession, settings: Settings) -> SessionConfig:
    return SessionConfig(
        model=session.model,
        system=session.system,
        tools=list(session.tools or []),
        builtin_tools=list(session.builtin_tools or []),
        max_tokens=session.max_tokens,
        thinking=session.thinking,
        compaction=compaction_config(session, settings),
    )


def check_thinking(max_tokens: int | None, thinking: dict[str, Any] | None, model: str) -> None:
    kind = (thinking or {}).get("type")
    modes = model_info(model).thinking_modes
    wanted = {"enabled": "extended", "adaptive": "adaptive"}.get(kind or "")
    if wanted and modes and wanted not in modes:
        raise Invalid.field(
            ["body", "thinking", "type"],
            "not supported by the model",
            f"model {model} does not support thinking type {kind!r} "
            f"(it supports: {', '.join(sorted(modes))})",
        )
    if thinking and kind == "enabled":
        budget = thinking["budget_tokens"]
        limit = max_tokens or default_max_tokens(model)
        if budget >= limit:
            raise Invalid.field(
                ["body", "thinking", "budget_tokens"],
                "must be below max_tokens",
                f"thinking.budget_tokens ({budget}) must be below max_tokens ({limit})",
            )


def check_tool_names(tools: list[dict[str, Any]], builtin: Sequence[str]) -> None:
    clash = {tool["name"] for tool in tools} & set(builtin)
    if clash:
        raise Invalid(f"client tools clash with built-in tools: {sorted(clash)}")


async def get(db: AsyncSession, tenant: str, session_id: uuid.UUID) -> AgentSession:
    """The tenant's session; another tenant's is as absent as a missing one."""
    return owned(await db.get(AgentSession, session_id), tenant, session_id)


def owned(session: AgentSession | None, tenant: str, session_id: uuid.UUID) -> AgentSession:
    if session is None or session.tenant != tenant:
        raise NotFound(f"Session {session_id} not found")
    return session


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
        token_budget=body.token_budget,
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
    if "model" in fields and fields["model"] is None:
        raise Invalid("model cannot be null")
    for key, value in fields.items():
        setattr(session, key, value)
    check_thinking(session.max_tokens, session.thinking, session.model)
    check_tool_names(session.tools or [], session.builtin_tools or [])
    await db.flush()
    return session


async def list_page(
    db: AsyncSession, tenant: str, *, limit: int, after: str | None
) -> tuple[list[AgentSession], str | None]:
    """Newest first; the cursor is the (created_at, id) of the last item."""
    query = newest_first(
        select(AgentSession).where(AgentSession.tenant == tenant), AgentSession, after, limit
    )
    return page(list(await db.scalars(query)), limit, dated_key)


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
    return {sid: str(status) for sid, status in result.all()}


async def estimated_tokens(
    db: AsyncSession, views: ChainCache, session: AgentSession, config: SessionConfig
) -> int:
    """The figure of the next request as the view stands now (`anchored_estimate`:
    real usage where it measured this view's prefix, estimates for the rest), the same
    figure `GET /context` reports. Reading it does not fill the view cache."""
    view = await load_view(db, views, session.id, session.head_uuid, config.compactable, keep=False)
    return anchored_estimate(config, view.projected)


async def to_out(
    db: AsyncSession,
    session: AgentSession,
    settings: Settings,
    views: ChainCache,
    status: str | None = None,
) -> SessionOut:
    if status is None:
        status = (await statuses(db, [session.id])).get(session.id, "idle")
    config = config_of(session, settings)
    limits = Limits.of(config)
    return SessionOut(
        id=session.id,
        title=session.title,
        model=session.model,
        system=session.system,
        tools=session.tools or [],
        builtin_tools=session.builtin_tools or [],
        max_tokens=session.max_tokens,
        token_budget=session.token_budget,
        thinking=session.thinking,
        compaction=EffectiveCompaction.model_validate(config.compaction, from_attributes=True),
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
            estimated_tokens=await estimated_tokens(db, views, session, config),
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
