"""SQL for the message tree: chains, appends, the whole tree, forks.

A chain is walked from a node up to the root with one recursive query that follows
primary keys, so loading it costs O(chain length) whatever else the table holds:
- the model's view (`full=False`) follows `parent_uuid` only, and a compact boundary
  has no parent, so the walk stops there;
- the full view follows `logical_parent_uuid` where `parent_uuid` is NULL, crossing
  every boundary back to the first message.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Row, Table, Uuid, bindparam, func, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.context.tokens import estimate_content
from app.context.types import Node
from app.models import (
    AgentSession,
    Collapse,
    File,
    Message,
    MicroWatermark,
    Snip,
    utcnow,
)

messages_t = cast(Table, Message.__table__)
# Core tables on the hot path: ORM-enabled DML costs several times the CPU.
sessions_t = cast(Table, AgentSession.__table__)
MAX_CHAIN_DEPTH = 10_000_000  # a guard against a corrupted (cyclic) tree, never reached


@lru_cache(maxsize=16)
def _chain_query(full: bool, columns: tuple[str, ...] | None, stop: bool = False) -> Any:
    """Built once per shape (statement construction is a real share of a turn's CPU);
    the head (and `stop`, a node the walk does not climb past) are bound parameters.
    Rows come unordered with their depth: sorting them in Python is cheaper than
    Postgres sorting wide rows (which spills to disk on long chains)."""
    m = messages_t
    start = select(
        m.c.uuid, m.c.parent_uuid, m.c.logical_parent_uuid, literal(0).label("depth")
    ).where(m.c.uuid == bindparam("head", type_=Uuid))
    chain = start.cte("chain", recursive=True)
    parent = m.alias("parent")
    next_uuid = (
        func.coalesce(chain.c.parent_uuid, chain.c.logical_parent_uuid)
        if full
        else chain.c.parent_uuid
    )
    step = (
        select(
            parent.c.uuid,
            parent.c.parent_uuid,
            parent.c.logical_parent_uuid,
            (chain.c.depth + 1).label("depth"),
        )
        .select_from(parent)
        .join(chain, parent.c.uuid == next_uuid)
        .where(chain.c.depth < MAX_CHAIN_DEPTH)
    )
    if stop:
        step = step.where(parent.c.uuid != bindparam("stop", type_=Uuid))
    chain = chain.union_all(step)
    selected = [m.c[name] for name in columns] if columns else [m]
    return select(*selected, chain.c.depth.label("chain_depth")).join(
        chain, m.c.uuid == chain.c.uuid
    )


async def chain_rows(
    db: AsyncSession,
    head: uuid.UUID | None,
    *,
    full: bool,
    columns: Sequence[str] | None = None,
    stop: uuid.UUID | None = None,
) -> list[Any]:
    """Rows from the root (or the nearest boundary) down to `head`, oldest first (only
    `columns` of them when given). With `stop`, the walk ends below that node when it
    meets it: the first row's parent is then `stop`."""
    if head is None:
        return []
    query = _chain_query(full, tuple(columns) if columns else None, stop is not None)
    params = {"head": head} if stop is None else {"head": head, "stop": stop}
    rows = list(await db.execute(query, params))
    rows.sort(key=lambda row: row.chain_depth, reverse=True)
    return rows


def to_node(row: Any) -> Node:
    return Node(
        uuid=str(row.uuid),
        type=row.type,
        role=row.role,
        content=row.content,
        subtype=row.subtype,
        is_meta=row.is_meta,
        token_estimate=row.token_estimate,
        stop_reason=row.stop_reason,
        usage=row.usage,
        model=row.model,
        meta=row.metadata,
    )


async def get_message(
    db: AsyncSession, session_id: uuid.UUID, message_uuid: uuid.UUID
) -> Row[Any] | None:
    result = await db.execute(
        select(messages_t).where(
            messages_t.c.uuid == message_uuid, messages_t.c.session_id == session_id
        )
    )
    return result.first()


async def allocate_seq(
    db: AsyncSession, session_id: uuid.UUID, count: int = 1, **session_values: Any
) -> int:
    """Reserve `count` sequence numbers (returns the first), setting `session_values` on
    the session row in the same statement. Locks the session row until commit."""
    result = await db.execute(
        update(sessions_t)
        .where(sessions_t.c.id == session_id)
        .values(message_seq=sessions_t.c.message_seq + count, **session_values)
        .returning(sessions_t.c.message_seq)
    )
    last = int(result.scalar_one())
    return last - count + 1


def new_row(
    *,
    session_id: uuid.UUID,
    seq: int,
    parent_uuid: uuid.UUID | None,
    type: str,
    role: str | None,
    content: list[Any],
    subtype: str | None = None,
    logical_parent_uuid: uuid.UUID | None = None,
    model: str | None = None,
    stop_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    is_meta: bool = False,
    copied_from: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
    meta: dict[str, Any] | None = None,
    message_uuid: uuid.UUID | None = None,
    token_estimate: int | None = None,
) -> dict[str, Any]:
    """The column values of a new message (estimate computed once, here, at insert)."""
    return {
        "uuid": message_uuid or uuid.uuid4(),
        "session_id": session_id,
        "seq": seq,
        "parent_uuid": parent_uuid,
        "logical_parent_uuid": logical_parent_uuid,
        "type": type,
        "subtype": subtype,
        "role": role,
        "content": content,
        "model": model,
        "stop_reason": stop_reason,
        "usage": usage,
        "is_meta": is_meta,
        "token_estimate": estimate_content(content) if token_estimate is None else token_estimate,
        "copied_from": copied_from,
        "run_id": run_id,
        "metadata": meta,
        "created_at": utcnow(),
    }


async def append(
    db: AsyncSession,
    session_id: uuid.UUID,
    *,
    parent_uuid: uuid.UUID | None,
    move_head: bool = True,
    session_values: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Insert one message under `parent_uuid` and (by default) make it the head."""
    [row] = await append_many(
        db,
        session_id,
        [{"parent_uuid": parent_uuid, **fields}],
        move_head=move_head,
        session_values=session_values,
    )
    return row


async def append_many(
    db: AsyncSession,
    session_id: uuid.UUID,
    specs: list[dict[str, Any]],
    *,
    move_head: bool = True,
    session_values: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Insert messages in order, each spec holding `new_row` fields (its own parent).
    One UPDATE of the session row reserves their seqs, moves the head and applies
    `session_values` (usage counters, say)."""
    if not specs:
        return []
    specs = [{**spec, "message_uuid": spec.get("message_uuid") or uuid.uuid4()} for spec in specs]
    values = dict(session_values or {})
    if move_head:
        values.update(head_uuid=specs[-1]["message_uuid"], updated_at=utcnow())
    first = await allocate_seq(db, session_id, len(specs), **values)
    rows = [new_row(session_id=session_id, seq=first + i, **spec) for i, spec in enumerate(specs)]
    await db.execute(insert(messages_t), rows)
    return rows


async def set_head(db: AsyncSession, session_id: uuid.UUID, head: uuid.UUID | None) -> None:
    await db.execute(
        update(sessions_t)
        .where(sessions_t.c.id == session_id)
        .values(head_uuid=head, updated_at=utcnow())
    )


async def tree_page(
    db: AsyncSession, session_id: uuid.UUID, *, after_seq: int, limit: int
) -> list[Any]:
    m = messages_t
    result = await db.execute(
        select(
            m.c.uuid,
            m.c.seq,
            m.c.parent_uuid,
            m.c.logical_parent_uuid,
            m.c.type,
            m.c.subtype,
            m.c.role,
            m.c.content,
            m.c.created_at,
        )
        .where(m.c.session_id == session_id, m.c.seq > after_seq)
        .order_by(m.c.seq)
        .limit(limit)
    )
    return list(result)


async def fork(
    db: AsyncSession, source: AgentSession, at_uuid: uuid.UUID | None, *, tenant: str
) -> AgentSession:
    """A new session holding its own copy of the full chain up to `at_uuid`, with the
    snips, micro watermarks and collapses anchored on it, and the workspace files."""
    rows = await chain_rows(db, at_uuid, full=True)
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
        message_seq=len(rows),
    )
    db.add(target)
    await db.flush()

    new_ids = {row.uuid: uuid.uuid4() for row in rows}
    copies = [
        {
            **new_row(
                session_id=target.id,
                seq=i + 1,
                parent_uuid=new_ids.get(row.parent_uuid) if row.parent_uuid else None,
                logical_parent_uuid=(
                    new_ids.get(row.logical_parent_uuid) if row.logical_parent_uuid else None
                ),
                type=row.type,
                subtype=row.subtype,
                role=row.role,
                content=row.content,
                model=row.model,
                stop_reason=row.stop_reason,
                usage=row.usage,
                is_meta=row.is_meta,
                copied_from=row.uuid,
                meta=row.metadata,
                message_uuid=new_ids[row.uuid],
                token_estimate=row.token_estimate,
            ),
            "created_at": row.created_at,
        }
        for i, row in enumerate(rows)
    ]
    if copies:
        await db.execute(insert(messages_t), copies)
        target.head_uuid = new_ids[rows[-1].uuid]
    await copy_context_marks(db, source.id, target.id, new_ids)
    await _copy_files(db, source.id, target.id)
    await db.flush()
    return target


async def copy_context_marks(
    db: AsyncSession,
    source_id: uuid.UUID,
    target_id: uuid.UUID,
    new_ids: dict[uuid.UUID, uuid.UUID],
) -> None:
    """Snips, micro watermarks and collapses anchored on copied messages follow them to
    their copies (`new_ids`: original uuid -> copy), so a fork or a compaction's
    verbatim copies show the model the same projection."""
    snips = await db.scalars(select(Snip).where(Snip.session_id == source_id))
    for snip in snips:
        if snip.message_uuid in new_ids:
            db.add(Snip(session_id=target_id, message_uuid=new_ids[snip.message_uuid]))
    marks = await db.scalars(select(MicroWatermark).where(MicroWatermark.session_id == source_id))
    for mark in marks:
        if mark.anchor_uuid in new_ids:
            db.add(
                MicroWatermark(
                    session_id=target_id,
                    anchor_uuid=new_ids[mark.anchor_uuid],
                    tokens_freed=mark.tokens_freed,
                    created_at=mark.created_at,
                )
            )
    spans = await db.scalars(select(Collapse).where(Collapse.session_id == source_id))
    for span in spans:
        if span.start_uuid in new_ids and span.end_uuid in new_ids:
            db.add(
                Collapse(
                    session_id=target_id,
                    start_uuid=new_ids[span.start_uuid],
                    end_uuid=new_ids[span.end_uuid],
                    summary=span.summary,
                    tokens_saved=span.tokens_saved,
                    model=span.model,
                    applied_at=span.applied_at,
                    created_at=span.created_at,
                )
            )


async def _copy_files(db: AsyncSession, source_id: uuid.UUID, target_id: uuid.UUID) -> None:
    files = await db.scalars(select(File).where(File.session_id == source_id))
    for f in files:
        db.add(
            File(
                session_id=target_id,
                path=f.path,
                content=f.content,
                size=f.size,
                sha256=f.sha256,
                created_at=f.created_at,
                updated_at=f.updated_at,
            )
        )
