"""The exact body of a Messages API request, built from a session and its view."""

from __future__ import annotations

from typing import Any

from app.context.cache import add_cache_breakpoints
from app.context.normalize import normalize_for_api
from app.context.tools import tool_definitions
from app.context.types import Node
from app.conversation.sessions import default_max_tokens
from app.models import AgentSession


def system_blocks(system: Any) -> list[dict[str, Any]] | None:
    if not system:
        return None
    if isinstance(system, str):
        return [{"type": "text", "text": system}]
    return [dict(block) for block in system]


def max_tokens_of(session: AgentSession) -> int:
    return session.max_tokens or default_max_tokens(session.model)


def build_body(
    session: AgentSession,
    nodes: list[Node],
    *,
    model: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    system: Any = None,
    thinking: bool = True,
) -> dict[str, Any]:
    """Normalise the view (invariant 4) and place cache breakpoints so the prefix of a
    growing conversation is read from the prompt cache turn after turn."""
    messages = normalize_for_api(nodes)
    if tools is None:
        tools = tool_definitions(session.builtin_tools or [], session.tools or [])
    system_out, tools_out, messages = add_cache_breakpoints(
        system_blocks(session.system if system is None else system), tools, messages
    )
    body: dict[str, Any] = {
        "model": model or session.model,
        "max_tokens": max_tokens_of(session),
        "messages": messages,
    }
    if system_out:
        body["system"] = system_out
    if tools_out:
        body["tools"] = tools_out
    if thinking and session.thinking and session.thinking.get("type") != "disabled":
        body["thinking"] = dict(session.thinking)
    return body
