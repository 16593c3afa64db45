"""Token figures of a request: anchored on real usage when there is some (invariant 8),
estimated from content otherwise, in the session model's tokens."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from app.context.models import model_info
from app.context.session import SessionConfig
from app.context.tokens import estimate_content, estimate_system, estimate_tools
from app.context.types import Node


class UsageLike(Protocol):
    """What an estimate reads of a stored message."""

    @property
    def role(self) -> str | None: ...
    @property
    def usage(self) -> dict[str, Any] | None: ...
    @property
    def token_estimate(self) -> int: ...


def definitions_estimate(config: SessionConfig) -> int:
    """The system prompt and the tool definitions, in calibration tokens."""
    return estimate_system(config.system) + estimate_tools(config.tool_definitions)


def view_estimate(config: SessionConfig, nodes: Iterable[Node]) -> int:
    """A pure estimate of a request built from `nodes` (system and tools included)."""
    chars_based = definitions_estimate(config) + sum(
        node.token_estimate or estimate_content(node.content) for node in nodes
    )
    return int(chars_based * model_info(config.model).tokens_per_char_factor)


def anchored_estimate(config: SessionConfig, rows: Sequence[UsageLike]) -> int:
    """The last response's real usage plus the stored estimates of what came after it;
    system and tools estimated when no response is in the view. Stored estimates are in
    calibration tokens; newer models' tokenizers count more for the same text."""
    factor = model_info(config.model).tokens_per_char_factor
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
    return int((after + definitions_estimate(config)) * factor)
