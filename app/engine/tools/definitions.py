"""The tools a session offers the model: its enabled built-ins, then its client tools."""

from __future__ import annotations

from typing import Any

from app.engine.tools.builtin import BUILTIN_TOOLS
from app.models import AgentSession

PARLEY_TOOL_KEYS = ("compactable",)  # Parley's own keys, never sent to the model


def tool_definitions(session: AgentSession) -> list[dict[str, Any]]:
    """Built-in tools first, then the client's, without Parley's own keys."""
    tools = [BUILTIN_TOOLS[name].to_api() for name in session.builtin_tools or []]
    for tool in session.tools or []:
        tools.append({k: v for k, v in tool.items() if k not in PARLEY_TOOL_KEYS})
    return tools


def client_tool_names(session: AgentSession) -> set[str]:
    return {tool["name"] for tool in session.tools or []}
