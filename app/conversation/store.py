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

from sqlalchemy import (
    Integer,
    Row,
    Select,
    Table,
    Update,
    Uuid,
    bindparam,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from app.conversation.records import COLUMNS, MessageRecord
from app.models import AgentSession, Message, utcnow

messages_t = cast(Table, Message.__table__)
# Core tables on the hot path: ORM-enabled DML costs several times the CPU.
sessions_t = cast(Table, AgentSession.__table__)
RECORD_COLUMNS = tuple(messages_t.c[name] for name in COLUMNS)
INSERT_MESSAGES = insert(messages_t)  # built once (construction costs more than a run)
MAX_CHAIN_DEPTH = 10_000_000  # a guard against a corrupted (cyclic) tree, never reached


@lru_cache(maxsize=16)
def _chain_query(full: bool, stop: bool) -> Select[Any]:
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
    return select(*RECORD_COLUMNS, chain.c.depth.label("chain_depth")).join(
        chain, m.c.uuid == chain.c.uuid
    )


async def _walk(
    db: AsyncSession, head: uuid.UUID, full: bool, stop: uuid.UUID | None
) -> list[Row[*tuple[Any, ...]]]:
    query = _chain_query(full, stop is not None)
    params = {"head": head} if stop is None else {"head": head, "stop": stop}
    rows = list(await db.execute(query, params))
    rows.sort(key=lambda row: row.chain_depth, reverse=True)
    return rows


async def chain(
    db: AsyncSession, head: uuid.UUID | None, *, full: bool, stop: uuid.UUID | None = None
) -> list[MessageRecord]:
    """Messages from the root (or the nearest boundary) down to `head`, oldest first.
    With `stop`, the walk ends below that node when it meets it: the first record's
    parent is then `stop`."""
    if head is None:
        return []
    return [MessageRecord.from_row(row) for row in await _walk(db, head, full, stop)]


async def get_message(
    db: AsyncSession, session_id: uuid.UUID, message_uuid: uuid.UUID
) -> MessageRecord | None:
    result = await db.execute(
        select(*RECORD_COLUMNS).where(
            messages_t.c.uuid == message_uuid, messages_t.c.session_id == session_id
        )
    )
    row = result.first()
    return MessageRecord.from_row(row) if row is not None else None


async def mark(
    db: AsyncSession, session_id: uuid.UUID, message_uuid: uuid.UUID, subtype: str
) -> tuple[bool, uuid.UUID | None]:
    """Set a message's subtype: whether it exists, and its parent."""
    result = await db.execute(
        update(messages_t)
        .where(messages_t.c.uuid == message_uuid, messages_t.c.session_id == session_id)
        .values(subtype=subtype)
        .returning(messages_t.c.parent_uuid)
    )
    row = result.first()
    return row is not None, (row[0] if row is not None else None)


async def allocate_seq(
    db: AsyncSession,
    session_id: uuid.UUID,
    count: int = 1,
    *,
    add: dict[str, int] | None = None,
    **session_values: Any,
) -> int:
    """Reserve `count` sequence numbers (returns the first), adding `add` to counters of
    the session row and setting `session_values` on it in the same statement. Locks the
    session row until commit."""
    add = add or {}
    statement = _allocation(tuple(sorted(add)), tuple(sorted(session_values)))
    params = {
        "session_id": session_id,
        "count": count,
        **{f"add_{name}": value for name, value in add.items()},
        **{f"set_{name}": value for name, value in session_values.items()},
    }
    last = int((await db.execute(statement, params)).scalar_one())
    return last - count + 1


@lru_cache(maxsize=16)
def _allocation(added: tuple[str, ...], set_: tuple[str, ...]) -> Update:
    """`allocate_seq`'s statement for these counters and columns, built once (it runs
    with every stored message; building a statement costs more than running it)."""
    c = sessions_t.c
    values: dict[str, Any] = {"message_seq": c.message_seq + bindparam("count", type_=Integer)}
    values.update({name: c[name] + bindparam(f"add_{name}", type_=c[name].type) for name in added})
    values.update({name: bindparam(f"set_{name}", type_=c[name].type) for name in set_})
    return (
        update(sessions_t)
        .where(c.id == bindparam("session_id", type_=Uuid))
        .values(values)
        .returning(c.message_seq)
    )


async def append(
    db: AsyncSession,
    message: MessageRecord,
    *,
    move_head: bool = True,
    add: dict[str, int] | None = None,
    session_values: dict[str, Any] | None = None,
) -> MessageRecord:
    """Insert one message and (by default) make it the head."""
    [record] = await append_many(
        db, [message], move_head=move_head, add=add, session_values=session_values
    )
    return record


async def append_many(
    db: AsyncSession,
    messages: Sequence[MessageRecord],
    *,
    move_head: bool = True,
    add: dict[str, int] | None = None,
    session_values: dict[str, Any] | None = None,
) -> list[MessageRecord]:
    """Insert messages of one session in order (each names its own parent). One UPDATE
    of the session row reserves their seqs, moves the head to the last one, adds `add`
    to its counters (usage) and applies `session_values`."""
    if not messages:
        return []
    session_id = messages[0].session_id
    values = dict(session_values or {})
    if move_head:
        values.update(head_uuid=messages[-1].uuid, updated_at=utcnow())
    first = await allocate_seq(db, session_id, len(messages), add=add, **values)
    records = [message.with_(seq=first + i) for i, message in enumerate(messages)]
    await db.execute(INSERT_MESSAGES, [record.values() for record in records])
    return records


async def set_head(db: AsyncSession, session_id: uuid.UUID, head: uuid.UUID | None) -> None:
    await db.execute(
        update(sessions_t)
        .where(sessions_t.c.id == session_id)
        .values(head_uuid=head, updated_at=utcnow())
    )


async def tree_page(
    db: AsyncSession, session_id: uuid.UUID, *, after_seq: int, limit: int
) -> list[MessageRecord]:
    """Every message of the session in insertion order, a page at a time."""
    result = await db.execute(
        select(*RECORD_COLUMNS)
        .where(messages_t.c.session_id == session_id, messages_t.c.seq > after_seq)
        .order_by(messages_t.c.seq)
        .limit(limit)
    )
    return [MessageRecord.from_row(row) for row in result]


async def messages_of_run(
    db: AsyncSession, run_id: uuid.UUID, *, from_seq: int = 0
) -> list[MessageRecord]:
    """The messages a run stored (from a seq on), in order."""
    result = await db.execute(
        select(*RECORD_COLUMNS)
        .where(messages_t.c.run_id == run_id, messages_t.c.seq >= from_seq)
        .order_by(messages_t.c.seq)
    )
    return [MessageRecord.from_row(row) for row in result]
