"""Session rows as this process last read or wrote them, each with its version
(Postgres `xmin`: it changes with every write of the row), so a turn posted to a
session served here starts without reading the row.

A kept row is always an exact pair: values and the version they were read with, or the
values a write guarded on the version before it left the row in (`runs.claim_at_once`,
`finishing.finish_turn`). Those writes only hold while the row still has the version
the request started from, so a row changed anywhere else (another replica's PATCH, a
delete, any write that does not keep its row here) fails the guard, writes nothing,
and the turn takes the careful path, which reads the row. Per process, least recently
used out first, bounded in bytes.

A turn's model request may be sent while its claim is stored, and a claim whose guard
fails then wastes that request, so the kept row also says what it proves about runs: a
row the end of a run left (`idle`) shows the session with no active run at that
version; a row read, or left by a claim, shows nothing of the kind. And the process
remembers the sessions whose guard failed after such a start (`shared`): another writer
(a replica, a concurrent post) works on them, so their turns are claimed first. Work of
this process that may write the row outside any run (a request that may change the
session, a background collapse) is marked (`writing`) while under way: no turn of that
session starts early meanwhile.
"""

from __future__ import annotations

import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import String, Table, literal_column, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import make_transient_to_detached
from sqlalchemy.orm.attributes import instance_dict

from app.conversation import sessions
from app.conversation.views import footprint
from app.models import AgentSession

sessions_t = cast(Table, AgentSession.__table__)
# The mapped attributes of a session row (`meta` is the `metadata` column).
ATTRIBUTES = tuple(column.key for column in AgentSession.__mapper__.column_attrs)
LARGE = ("system", "tools", "meta", "compaction")  # what may make a row weigh much
_READ = select(AgentSession, literal_column("agent_sessions.xmin::text", String))


@dataclass(frozen=True, slots=True)
class KeptRow:
    values: dict[str, Any]  # by attribute; JSON values are replaced whole, never mutated
    version: str
    size: int  # bytes, roughly (`footprint` of the `LARGE` values)
    large: list[Any]
    idle: bool  # left by the end of a run: no run was active at `version`


@dataclass(frozen=True, slots=True)
class TurnSession:
    """The session a turn is posted to and the version it was read at (None: not known,
    SQLite)."""

    row: AgentSession
    version: str | None


class SessionRows:
    def __init__(self, max_bytes: int = 32 * 2**20, max_shared: int = 10_000) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[uuid.UUID, KeptRow] = OrderedDict()
        self.size = 0
        self.max_shared = max_shared
        self._shared: OrderedDict[uuid.UUID, None] = OrderedDict()
        self._writing: Counter[uuid.UUID] = Counter()

    def get(self, session_id: uuid.UUID) -> KeptRow | None:
        kept = self.entries.get(session_id)
        if kept is not None:
            self.entries.move_to_end(session_id)
        return kept

    def keep(
        self, session: AgentSession, version: str, *, idle: bool = False, **changes: Any
    ) -> None:
        """Keep `session`'s values with `changes` applied, as of row version `version`;
        `idle`: left by the end of a run (the session had no active run then)."""
        values = {name: getattr(session, name) for name in ATTRIBUTES}
        values.update(changes)
        large = [values[name] for name in LARGE]
        old = self.entries.get(session.id)
        if old is not None and all(a is b for a, b in zip(large, old.large, strict=True)):
            size = old.size  # the same objects (a copy made from the kept row): not walked
        else:
            size = 1_000 + footprint(large)
        self.forget(session.id)
        if size > self.max_bytes:
            return
        self.entries[session.id] = KeptRow(values, version, size, large, idle)
        self.size += size
        while self.size > self.max_bytes:
            _, evicted = self.entries.popitem(last=False)
            self.size -= evicted.size

    def forget(self, session_id: uuid.UUID) -> None:
        old = self.entries.pop(session_id, None)
        if old is not None:
            self.size -= old.size

    def idle(self, session_id: uuid.UUID, version: str | None) -> bool:
        """Whether the row kept at `version` was left by the end of a run, no write of
        it here is under way (`writing`) and no guard of this session failed unforeseen
        here (`changed_elsewhere`): a claim from it is all but sure to be stored."""
        kept = self.entries.get(session_id)
        return (
            kept is not None
            and kept.idle
            and kept.version == version
            and session_id not in self._writing
            and session_id not in self._shared
        )

    def begin_writing(self, session_id: uuid.UUID) -> None:
        """This process may now write the session row outside any run (a request that
        may change the session, a background collapse), and each such write forgets the
        kept row: a claim from it could fail on one, so until `end_writing` no turn of
        the session starts its model request before its claim is stored."""
        self._writing[session_id] += 1

    def end_writing(self, session_id: uuid.UUID) -> None:
        self._writing[session_id] -= 1
        if self._writing[session_id] <= 0:
            del self._writing[session_id]

    @contextmanager
    def writing(self, session_id: uuid.UUID) -> Iterator[None]:
        """`begin_writing` .. `end_writing` around a block."""
        self.begin_writing(session_id)
        try:
            yield
        finally:
            self.end_writing(session_id)

    def changed_elsewhere(self, session_id: uuid.UUID) -> None:
        """A guard that the kept row said would hold failed: forget the row, and
        remember the session as shared (the `max_shared` most recent ones)."""
        self.forget(session_id)
        self._shared[session_id] = None
        self._shared.move_to_end(session_id)
        if len(self._shared) > self.max_shared:
            self._shared.popitem(last=False)

    def shared(self, session_id: uuid.UUID) -> bool:
        return session_id in self._shared


def _detached(values: dict[str, Any]) -> AgentSession:
    """A detached row holding `values`, as if loaded (nothing to flush): filled the way
    the ORM fills a row it reads, not attribute by attribute (a turn's hot path). Only
    the one-statement claim uses it; any other path reads the row into its session."""
    row = cast(AgentSession, AgentSession.__mapper__.class_manager.new_instance())
    instance_dict(row).update(values)
    make_transient_to_detached(row)
    return row


async def for_turn(
    db: AsyncSession, rows: SessionRows, tenant: str, session_id: uuid.UUID
) -> TurnSession:
    """The tenant's session for a posted turn: its kept row when there is one (no read),
    or the row read with its version (kept for the next turn). A kept row that sets a
    token budget is read again: a stale budget must never refuse a turn."""
    if db.get_bind().dialect.name != "postgresql":
        return TurnSession(await sessions.get(db, tenant, session_id), None)
    kept = rows.get(session_id)
    if kept is not None and kept.values["token_budget"] is None:
        # Its tenant is checked on the kept row: a session's tenant never changes.
        return TurnSession(sessions.owned(_detached(kept.values), tenant, session_id), kept.version)
    found = (await db.execute(_READ.where(sessions_t.c.id == session_id))).first()
    read, version = found if found is not None else (None, "")
    session = sessions.owned(read, tenant, session_id)
    rows.keep(session, version)
    return TurnSession(session, version)
