"""The exact body of a Messages API request, built from a session's settings and its view."""

from __future__ import annotations

from typing import Any

from app.context.cache import add_cache_breakpoints
from app.context.limits import max_tokens_of
from app.context.normalize import MergeMemo, normalize_for_api
from app.context.session import SessionConfig
from app.context.types import Block, Node


def system_blocks(system: str | list[Block] | None) -> list[Block] | None:
    if not system:
        return None
    if isinstance(system, str):
        return [{"type": "text", "text": system}]
    return [dict(block) for block in system]


def build_body(
    config: SessionConfig,
    nodes: list[Node],
    *,
    model: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    system: str | list[Block] | None = None,
    thinking: bool = True,
    memo: MergeMemo | None = None,
) -> dict[str, Any]:
    """Normalise the view (invariant 4; `memo`: the session's, see `MergeMemo`) and place
    cache breakpoints so the prefix of a growing conversation is read from the prompt
    cache turn after turn."""
    messages = normalize_for_api(nodes, memo)
    system_out, tools_out, messages = add_cache_breakpoints(
        system_blocks(config.system if system is None else system),
        config.tool_definitions if tools is None else tools,
        messages,
        unmarked=True,
    )
    body: dict[str, Any] = {
        "model": model or config.model,
        "max_tokens": max_tokens_of(config),
        "messages": messages,
    }
    if system_out:
        body["system"] = system_out
    if tools_out:
        body["tools"] = tools_out
    if thinking and config.thinking and config.thinking.get("type") != "disabled":
        body["thinking"] = dict(config.thinking)
    return body
