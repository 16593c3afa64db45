"""The model's view of a session as persisted: the chain from the head up to the nearest
compact boundary, with snips, the micro-compaction watermark and applied collapses
projected over it (`context.projection`; history itself unchanged)."""

from __future__ import annotations

import dataclasses
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from app.context.estimates import TokenMemo
from app.context.micro import ClearMemo, ScanMemo
from app.context.normalize import MergeMemo
from app.context.projection import CollapseSpan, project, span_indices
from app.context.types import COMPACT_BOUNDARY, Node
from app.conversation import marks, store
from app.conversation.records import MessageRecord

# Bytes a cached message costs beyond its content: the record, its Node, uuids, the
# timestamp and list slots (measured with tracemalloc on typical rows), and its share of
# the session's normalisation memo (its references in the merged groups).
RECORD_OVERHEAD = 1_500


def footprint(value: object) -> int:
    """Approximate bytes `value` (JSON-shaped content) holds in memory. Cheap enough to
    run once per message as it enters the cache; exact sizes do not matter, only that a
    large image or file read counts as large."""
    if isinstance(value, str):
        return 50 + len(value)
    if isinstance(value, dict):
        return 64 + sum(footprint(k) + footprint(v) for k, v in value.items())
    if isinstance(value, list):
        return 56 + sum(8 + footprint(item) for item in value)
    return 32


def record_bytes(record: MessageRecord) -> int:
    return RECORD_OVERHEAD + footprint(record.content) + footprint(record.metadata)


@dataclass
class ViewMemos:
    """What a session's next request carries over from the last one built from its
    view here: the rows micro-compaction cleared (any view of the session loaded here),
    and where normalising, summing and scanning for compactable results left off (the
    loop's requests only)."""

    clear: ClearMemo = field(default_factory=ClearMemo)
    merge: MergeMemo = field(default_factory=MergeMemo)
    tokens: TokenMemo = field(default_factory=TokenMemo)
    scan: ScanMemo = field(default_factory=ScanMemo)


@dataclass
class CachedChain:
    head: uuid.UUID
    records: list[MessageRecord]
    nodes: list[Node]
    size: int  # bytes, by `record_bytes`
    marks: marks.Marks | None = None  # the session's marks as read at `marks_version`
    marks_version: int | None = None


class ChainCache:
    """The model's views of recently used sessions, in memory, least recently used out
    first. A chain never changes (messages are immutable and never re-parented), so
    the view of a head that descends from a cached one is that view plus the few rows
    walked from the new head up to it: a turn loads what is new, not the history.
    Bounded in bytes (`record_bytes`), since one message may be a 5 MB image and
    another a word. One per process (`Runtime.views`)."""

    def __init__(self, max_bytes: int = 256 * 2**20) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[uuid.UUID, CachedChain] = OrderedDict()
        self.size = 0
        # The memos of each session kept here (`ViewMemos`: who uses which).
        self.memos: dict[uuid.UUID, ViewMemos] = {}

    async def view_records(
        self, db: AsyncSession, session_id: uuid.UUID, head: uuid.UUID | None, keep: bool = True
    ) -> tuple[list[MessageRecord], list[Node]]:
        """The view's records and nodes. `keep=False` (a listing that reads many
        sessions once) leaves the cache as it was unless it already holds the session."""
        if head is None:
            return [], []
        cached = self.entries.get(session_id)
        if cached is not None and cached.head == head:
            self.entries.move_to_end(session_id)
            return cached.records, cached.nodes
        stop = cached.head if cached is not None else None
        walked = [
            r
            for r in await store.chain(db, head, full=False, stop=stop)
            if r.subtype != COMPACT_BOUNDARY
        ]
        new_nodes = [record.to_node() for record in walked]
        walked_size = sum(record_bytes(record) for record in walked)
        if cached is not None and walked and walked[0].parent_uuid == cached.head:
            records, nodes = cached.records + walked, cached.nodes + new_nodes
            size = cached.size + walked_size
        else:  # another branch, an older node, or past a new compact boundary
            records, nodes, size = walked, new_nodes, walked_size
        if keep or cached is not None:
            chain = CachedChain(head, records, nodes, size)
            if cached is not None:
                chain.marks, chain.marks_version = cached.marks, cached.marks_version
            self._put(session_id, chain)
        return records, nodes

    def extend(self, session_id: uuid.UUID, records: list[MessageRecord]) -> None:
        """Records just stored in a chain below the cached head (a claimed turn, a step
        of a run): the view at the new head, kept without a walk. Anything else (another
        branch, a compact boundary) is left to the next walk."""
        cached = self.entries.get(session_id)
        if cached is None or not records:
            return
        parent = cached.head
        for record in records:
            if record.parent_uuid != parent or record.subtype == COMPACT_BOUNDARY:
                return
            parent = record.uuid
        chain = CachedChain(
            parent,
            cached.records + records,
            cached.nodes + [record.to_node() for record in records],
            cached.size + sum(record_bytes(record) for record in records),
            cached.marks,
            cached.marks_version,
        )
        self._put(session_id, chain)

    def forget(self, session_id: uuid.UUID) -> None:
        """Drop the session's view: a run extended it with a claim that was not stored."""
        old = self.entries.pop(session_id, None)
        if old is not None:
            self.size -= old.size
        self.memos.pop(session_id, None)

    def marks_at(self, session_id: uuid.UUID, version: int) -> marks.Marks | None:
        """The session's marks kept at `version`, if that is the version kept (no I/O)."""
        cached = self.entries.get(session_id)
        if cached is None or cached.marks_version != version:
            return None
        return cached.marks

    def forget_marks(self, session_id: uuid.UUID) -> None:
        """A run changed the marks after reading the session row it holds: read again."""
        cached = self.entries.get(session_id)
        if cached is not None:
            cached.marks, cached.marks_version = None, None

    def keep_marks(self, session_id: uuid.UUID, version: int, found: marks.Marks) -> None:
        """Keep marks read no earlier than the session row showing `version` (read in a
        committed state: marks are only ever added or applied, so newer is still true)."""
        cached = self.entries.get(session_id)
        if cached is not None:
            cached.marks, cached.marks_version = found, version

    def holds(self, session_id: uuid.UUID, head: uuid.UUID | None, marks_version: int) -> bool:
        """Whether the view at `head`, marks included, is served from memory (no I/O)."""
        cached = self.entries.get(session_id)
        return (
            cached is not None
            and cached.head == head
            and cached.marks is not None
            and cached.marks_version == marks_version
        )

    def memo(self, session_id: uuid.UUID) -> ViewMemos | None:
        """The session's memos, while its view is kept here."""
        if session_id not in self.entries:
            return None
        memos = self.memos.get(session_id)
        if memos is None:
            memos = self.memos[session_id] = ViewMemos()
        return memos

    def peek(self, session_id: uuid.UUID, head: uuid.UUID | None) -> list[MessageRecord] | None:
        """The cached records of that exact view, if any (no I/O)."""
        cached = self.entries.get(session_id)
        return cached.records if cached is not None and cached.head == head else None

    def _put(self, session_id: uuid.UUID, chain: CachedChain) -> None:
        old = self.entries.pop(session_id, None)
        if old is not None:
            self.size -= old.size
        if chain.size > self.max_bytes:  # a chain bigger than the whole cache: not kept
            self.memos.pop(session_id, None)
            return
        self.entries[session_id] = chain
        self.size += chain.size
        while self.size > self.max_bytes:
            evicted_id, evicted = self.entries.popitem(last=False)
            self.size -= evicted.size
            self.memos.pop(evicted_id, None)


@dataclass
class ChainView:
    """The stored records of the model's view (boundary excluded) and their projection."""

    records: list[MessageRecord]
    nodes: list[Node]  # the chain as Nodes, before projection
    watermark: int | None  # index in `nodes` of the deepest micro watermark on the chain
    compactable: frozenset[str]
    snipped: set[str] = field(default_factory=set)
    collapses: list[CollapseSpan] = field(default_factory=list)  # those on this chain
    projected: list[Node] = field(default_factory=list)
    clear: ClearMemo | None = None  # the session's, while its view is kept here

    def reproject(self) -> None:
        """Project again after a watermark moved or a collapse was applied (in memory:
        the rows themselves have not changed)."""
        self.projected = project(
            self.nodes,
            snipped=self.snipped,
            watermark=self.watermark,
            compactable=self.compactable,
            collapses=span_indices(self.nodes, self.collapses),
            memo=self.clear,
        )

    def record_of(self, node: Node) -> MessageRecord | None:
        """The stored record a projected node shows (None for a collapsed span)."""
        return self._by_uuid().get(node.uuid)

    def _by_uuid(self) -> dict[str, MessageRecord]:
        return {str(record.uuid): record for record in self.records}


async def load_view(
    db: AsyncSession,
    cache: ChainCache,
    session_id: uuid.UUID,
    head: uuid.UUID | None,
    compactable: frozenset[str],
    *,
    keep: bool = True,
    marks_version: int | None = None,
) -> ChainView:
    """The view at `head`. `marks_version`, from a committed read of the session row
    (never one this transaction changed), lets the cached marks stand in for the
    query when they were read at that version."""
    records, nodes = await cache.view_records(db, session_id, head, keep)
    found = cache.marks_at(session_id, marks_version) if marks_version is not None else None
    if found is None:
        found = await marks.load(db, session_id)
        if marks_version is not None:
            cache.keep_marks(session_id, marks_version, found)
    anchors = found.watermark_anchors
    index = {node.uuid: i for i, node in enumerate(nodes)} if anchors or found.collapses else {}
    positions = [index[anchor] for anchor in anchors if anchor in index]
    memos = cache.memo(session_id)
    view = ChainView(
        records=records,
        nodes=nodes,
        watermark=max(positions) if positions else None,
        compactable=compactable,
        snipped=found.snipped & {node.uuid for node in nodes} if found.snipped else set(),
        # Copies: a view marks its spans applied in memory; the cached marks stay as read.
        collapses=[
            dataclasses.replace(span) for _, _, span in span_indices(nodes, found.collapses)
        ],
        clear=memos.clear if memos is not None else None,
    )
    view.reproject()
    return view
