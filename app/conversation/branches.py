"""Moving through the tree: rewinding or switching the head, clearing, forking."""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from app.conversation import files, marks, store
from app.conversation.history import message
from app.conversation.records import MessageRecord
from app.conversation.sessions import require_idle
from app.models import AgentSession


async def move_head(db: AsyncSession, session: AgentSession, head: uuid.UUID | None) -> None:
    """Make `head` (a message of the session, or None: a fresh conversation) the head."""
    if head is not None:
        await message(db, session.id, head)
    await require_idle(db, session)
    await store.set_head(db, session.id, head)
    await db.refresh(session)


async def fork(
    db: AsyncSession, source: AgentSession, at_uuid: uuid.UUID | None, *, tenant: str
) -> AgentSession:
    """A new session holding its own copy of the full chain up to `at_uuid` (default: the
    head), with the snips, micro watermarks and collapses anchored on it, the settings
    and the workspace files."""
    if at_uuid is not None:
        await message(db, source.id, at_uuid)
    records = await store.chain(db, at_uuid or source.head_uuid, full=True)
    target = AgentSession(
        id=uuid.uuid4(),
        tenant=tenant,
        title=source.title,
        model=source.model,
        system=source.system,
        tools=source.tools,
        builtin_tools=source.builtin_tools,
        max_tokens=source.max_tokens,
        thinking=source.thinking,
        meta=dict(source.meta or {}),
        compaction=dict(source.compaction or {}),
        # Same prefix, same prompt cache (it is keyed by content): as warm as the source's.
        last_request_at=source.last_request_at,
    )
    db.add(target)
    await db.flush()
    new_ids = {record.uuid: uuid.uuid4() for record in records}
    if records:
        await store.append_many(db, [_copy(record, target.id, new_ids) for record in records])
        await db.refresh(target)
    await marks.copy_marks(db, source.id, target.id, new_ids)
    await files.copy_files(db, source.id, target.id)
    await db.flush()
    return target


def _copy(
    record: MessageRecord, session_id: uuid.UUID, new_ids: dict[uuid.UUID, uuid.UUID]
) -> MessageRecord:
    return record.with_(
        uuid=new_ids[record.uuid],
        session_id=session_id,
        parent_uuid=new_ids.get(record.parent_uuid) if record.parent_uuid else None,
        logical_parent_uuid=(
            new_ids.get(record.logical_parent_uuid) if record.logical_parent_uuid else None
        ),
        copied_from=record.uuid,
        run_id=None,
    )
