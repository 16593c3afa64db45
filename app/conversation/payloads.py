"""How stored rows are shown: to API clients and in run events. One place for each
shape, so a message or a run reads the same in a response, a stream and a replay."""

from __future__ import annotations

from typing import Any

from app.schemas import MessageOut, RunOut

EVENT_RESULT_CHARS = 2000  # tool results in `tool_result` events are shortened to this


def message_out(row: Any, content: list[Any] | None = None) -> MessageOut:
    return MessageOut(
        uuid=row.uuid,
        parent_uuid=row.parent_uuid,
        logical_parent_uuid=row.logical_parent_uuid,
        type=row.type,
        subtype=row.subtype,
        role=row.role,
        content=row.content if content is None else content,
        model=row.model,
        stop_reason=row.stop_reason,
        usage=row.usage,
        is_meta=row.is_meta,
        copied_from=row.copied_from,
        created_at=row.created_at,
        metadata=row.metadata,
    )


def message_payload(row: Any) -> dict[str, Any]:
    """A stored message (a row, or the column dict of one just inserted) as sent in
    `message.completed`."""
    data = dict(row) if isinstance(row, dict) else dict(row._mapping)
    return MessageOut.model_validate(data).model_dump(mode="json")


def result_events(row: dict[str, Any]) -> list[tuple[str, Any]]:
    """The events that report a stored tool_result message: one `tool_result` per
    result (content shortened), then `message.completed`."""
    key = str(row["uuid"])
    events: list[tuple[str, Any]] = []
    for block in row["content"]:
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
    events.append(("message.completed", message_payload(row)))
    return events


def run_out(run: Any) -> RunOut:
    """A Run (or a row of the runs table) as the API shows it."""
    return RunOut.model_validate(
        {
            "id": run.id,
            "session_id": run.session_id,
            "kind": run.kind,
            "status": run.status,
            "user_message_uuid": run.user_message_uuid,
            "required_action": run.required_action,
            "usage": run.usage or {},
            "error": run.error,
            "created_at": run.created_at,
            "finished_at": run.finished_at,
        }
    )


def run_json(run: Any) -> dict[str, Any]:
    return run_out(run).model_dump(mode="json")
