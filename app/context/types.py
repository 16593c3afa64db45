"""The plain data the pure context code works on: one stored message, as a value.

`Node` mirrors a `messages` row without any I/O attached. Content blocks are the
Anthropic shapes as plain dicts (`{"type": "text", "text": ...}`, `tool_use`,
`tool_result`, `thinking`, `redacted_thinking`, `image`, `document`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Block = dict[str, Any]
ApiMessage = dict[str, Any]  # {"role": "user" | "assistant", "content": [Block, ...]}

# Message types and subtypes that are stored in the tree.
USER = "user"
ASSISTANT = "assistant"
SYSTEM = "system"
ATTACHMENT = "attachment"

COMPACT_BOUNDARY = "compact_boundary"
COMPACT_SUMMARY = "compact_summary"
API_ERROR = "api_error"
INTERRUPTED = "interrupted"
REFUSED = "refused"  # the user message of a turn the model API refused (off the chain)

CLEARED_TOOL_RESULT = "[Old tool result content cleared]"


@dataclass(frozen=True, slots=True)
class Node:
    uuid: str
    type: str  # "user" | "assistant" | "system" | "attachment"
    role: str | None  # "user" | "assistant" | None for rows the model never sees
    content: list[Block]
    subtype: str | None = None
    is_meta: bool = False
    token_estimate: int = 0
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    meta: dict[str, Any] | None = field(default=None)

    @property
    def is_boundary(self) -> bool:
        return self.subtype == COMPACT_BOUNDARY

    def with_content(self, content: list[Block], token_estimate: int) -> Node:
        """A copy with other content and estimate (a projection: micro-compaction).
        Spelled out rather than dataclasses.replace, which costs twice as much on a
        path that runs for thousands of nodes per request; a new field must be added
        here (tests/unit/test_context_blocks.py checks every field is carried)."""
        return Node(
            uuid=self.uuid,
            type=self.type,
            role=self.role,
            content=content,
            subtype=self.subtype,
            is_meta=self.is_meta,
            token_estimate=token_estimate,
            stop_reason=self.stop_reason,
            usage=self.usage,
            model=self.model,
            meta=self.meta,
        )


def extends(nodes: Sequence[Node], kept: Sequence[Node]) -> bool:
    """Whether `nodes` starts with the very rows of `kept` (the same objects): how the
    memos of the per-request work tell the next view of a conversation from another.
    `map` compares in C: this runs over whole views on every request."""
    return len(kept) <= len(nodes) and all(map(operator.is_, kept, nodes))


# Added for the context package.
COLLAPSED = "collapsed"  # subtype of the synthetic user node that stands for a collapsed span

# The error result normalize_for_api puts under a tool_use that has no stored answer
# (the run was interrupted, a client never answered, a head was moved onto it).
MISSING_TOOL_RESULT = "[Tool call interrupted: no result was recorded for this tool use]"
# The user text put in front of a view that starts with an assistant message.
EARLIER_CONVERSATION_OMITTED = "[Earlier conversation omitted]"

# Block types that may carry `cache_control` (thinking blocks may not).
CACHEABLE_BLOCK_TYPES = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "search_result"}
)
