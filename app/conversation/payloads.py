"""How stored rows are shown: to API clients and in run events. One place for each
shape, so a message or a run reads the same in a response, a stream and a replay."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row

from app.context.blocks import preview
from app.context.projection import CollapseSpan
from app.context.types import Block, Node
from app.conversation.records import MessageRecord
from app.models import Run
from app.schemas import MessageOut, RunOut, TreeNode

EVENT_RESULT_CHARS = 2000  # tool results in `tool_result` events are shortened to this


def message_out(record: MessageRecord, content: list[Block] | None = None) -> MessageOut:
    """A stored message; `content` as a projection shows it (micro-compaction), if given."""
    return MessageOut(
        uuid=record.uuid,
        parent_uuid=record.parent_uuid,
        logical_parent_uuid=record.logical_parent_uuid,
        type=record.type,
        subtype=record.subtype,
        role=record.role,
        content=record.content if content is None else content,
        model=record.model,
        stop_reason=record.stop_reason,
        usage=record.usage,
        is_meta=record.is_meta,
        copied_from=record.copied_from,
        created_at=record.created_at,
        metadata=record.metadata,
    )


def collapsed_out(node: Node, span: CollapseSpan) -> MessageOut:
    """A collapsed span as the model's view shows it: one message with no row of its own."""
    return MessageOut(
        uuid=span.id,
        parent_uuid=None,
        logical_parent_uuid=span.end_uuid,
        type="user",
        subtype=node.subtype,
        role="user",
        content=node.content,
        model=span.model,
        stop_reason=None,
        usage=None,
        is_meta=True,
        copied_from=None,
        created_at=span.created_at,
        metadata={
            "collapse": {
                "start_uuid": str(span.start_uuid),
                "end_uuid": str(span.end_uuid),
                "tokens_saved": span.tokens_saved,
            }
        },
    )


def tree_node(record: MessageRecord) -> TreeNode:
    return TreeNode(
        uuid=record.uuid,
        parent_uuid=record.parent_uuid,
        logical_parent_uuid=record.logical_parent_uuid,
        type=record.type,
        subtype=record.subtype,
        role=record.role,
        preview=preview(record.content),
        created_at=record.created_at,
    )


def message_payload(record: MessageRecord) -> dict[str, Any]:
    """A stored message as sent in `message.completed`."""
    return message_out(record).model_dump(mode="json")


def result_events(record: MessageRecord) -> list[tuple[str, Any]]:
    """The events that report a stored tool_result message: one `tool_result` per
    result (content shortened), then `message.completed`."""
    key = str(record.uuid)
    events: list[tuple[str, Any]] = []
    for block in record.content:
        if block.get("type") != "tool_result":
            continue
        content = block.get("content")
        if isinstance(content, str) and len(content) > EVENT_RESULT_CHARS:
            content = content[:EVENT_RESULT_CHARS] + f"... [{len(content)} characters]"
        events.append(
            (
                "tool_result",
                {
                    "message_uuid": key,
                    "tool_use_id": block["tool_use_id"],
                    "is_error": bool(block.get("is_error")),
                    "content": content,
                },
            )
        )
    events.append(("message.completed", message_payload(record)))
    return events


def run_out(run: Run | Row[Any] | RunOut) -> RunOut:
    """A run, from its ORM object or a row of the runs table (an UPDATE ... RETURNING)."""
    return RunOut.model_validate(run, from_attributes=True)


def run_json(run: Run | Row[Any]) -> dict[str, Any]:
    return run_out(run).model_dump(mode="json")
