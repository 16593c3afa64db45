"""The model's view of a session as persisted: the chain from the head up to the nearest
compact boundary, with snips, the micro-compaction watermark and applied collapses
projected over it (history itself unchanged)."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import DateTime, Integer, Text, Uuid, bindparam, literal, null, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from app.context.collapse import apply_collapses
from app.context.micro import apply_micro
from app.context.tools import compactable_tools
from app.context.types import COMPACT_BOUNDARY, Node
from app.conversation.store import chain_rows, to_node
from app.models import AgentSession, Collapse, MicroWatermark, Snip


@dataclass
class CachedChain:
    head: uuid.UUID
    rows: list[Any]
    nodes: list[Node]


class ChainCache:
    """The model's views of recently used sessions, in memory, least recently used out
    first. A chain never changes (messages are immutable and never re-parented), so
    the view of a head that descends from a cached one is that view plus the few rows
    walked from the new head up to it: a turn loads what is new, not the history."""

    def __init__(self, max_messages: int = 100_000) -> None:
        self.max_messages = max_messages
        self.entries: OrderedDict[uuid.UUID, CachedChain] = OrderedDict()
        self.size = 0

    async def view_rows(
        self, db: AsyncSession, session_id: uuid.UUID, head: uuid.UUID | None
    ) -> tuple[list[Any], list[Node]]:
        if head is None:
            return [], []
        cached = self.entries.get(session_id)
        if cached is not None and cached.head == head:
            self.entries.move_to_end(session_id)
            return cached.rows, cached.nodes
        stop = cached.head if cached is not None else None
        walked = [r for r in await chain_rows(db, head, full=False, stop=stop) if _visible(r)]
        new_nodes = [to_node(row) for row in walked]
        if cached is not None and walked and walked[0].parent_uuid == cached.head:
            rows, nodes = cached.rows + walked, cached.nodes + new_nodes
        else:  # another branch, an older node, or past a new compact boundary
            rows, nodes = walked, new_nodes
        self._put(session_id, CachedChain(head, rows, nodes))
        return rows, nodes

    def peek(self, session_id: uuid.UUID, head: uuid.UUID | None) -> list[Any] | None:
        """The cached rows of that exact view, if any (no I/O)."""
        cached = self.entries.get(session_id)
        return cached.rows if cached is not None and cached.head == head else None

    def _put(self, session_id: uuid.UUID, chain: CachedChain) -> None:
        old = self.entries.pop(session_id, None)
        if old is not None:
            self.size -= len(old.rows)
        if self.max_messages <= 0 or len(chain.rows) > self.max_messages:
            return
        self.entries[session_id] = chain
        self.size += len(chain.rows)
        while self.size > self.max_messages:
            _, evicted = self.entries.popitem(last=False)
            self.size -= len(evicted.rows)


def _visible(row: Any) -> bool:
    return bool(row.subtype != COMPACT_BOUNDARY)


VIEW_CACHE = ChainCache()


@dataclass
class ChainView:
    """The stored rows of the model's view (boundary excluded) and their projection."""

    rows: list[Any]
    nodes: list[Node]  # the chain as Nodes, before projection
    watermark: int | None  # index in `nodes` of the deepest micro watermark on the chain
    snipped: set[str] = field(default_factory=set)
    collapses: list[Collapse] = field(default_factory=list)  # those on this chain
    projected: list[Node] = field(default_factory=list)
    compactable: frozenset[str] = frozenset()

    def reproject(self) -> None:
        """Project again after a watermark moved or a collapse was applied (in memory:
        the rows themselves have not changed)."""
        self.projected = project(
            self.nodes,
            snipped=self.snipped,
            watermark=self.watermark,
            compactable=self.compactable,
            collapses=span_indices(self.nodes, self.collapses),
        )


def span_indices(nodes: list[Node], collapses: list[Collapse]) -> list[tuple[int, int, Collapse]]:
    index = {node.uuid: i for i, node in enumerate(nodes)}
    spans = []
    for span in collapses:
        start, end = index.get(str(span.start_uuid)), index.get(str(span.end_uuid))
        if start is not None and end is not None and start <= end:
            spans.append((start, end, span))
    spans.sort(key=lambda item: item[0])
    # Overlapping spans cannot both apply; keep the earlier-starting one.
    kept: list[tuple[int, int, Collapse]] = []
    for item in spans:
        if not kept or item[0] > kept[-1][1]:
            kept.append(item)
    return kept


def project(
    nodes: list[Node],
    *,
    snipped: set[str],
    watermark: int | None,
    compactable: frozenset[str],
    collapses: list[tuple[int, int, Collapse]],
) -> list[Node]:
    """snip -> micro -> collapse, each a projection over the same chain."""
    projected = apply_micro(nodes, watermark, compactable)
    applied = [
        (start, end, span.summary, str(span.id))
        for start, end, span in collapses
        if span.applied_at is not None
    ]
    if applied:
        projected = apply_collapses(projected, applied)
    if snipped:
        projected = [node for node in projected if node.uuid not in snipped]
    return projected


def _marks_query() -> Any:
    """Snips, micro watermarks and collapses of a session in one round trip (built once)."""
    sid = bindparam("sid", type_=Uuid)
    no_uuid, no_time = null().cast(Uuid), null().cast(DateTime(timezone=True))
    no_text, no_int = null().cast(Text), null().cast(Integer)
    c = Collapse.__table__.c
    return union_all(
        select(
            literal("snip").label("kind"),
            Snip.message_uuid.label("a"),
            no_uuid.label("b"),
            no_uuid.label("id"),
            no_time.label("applied_at"),
            no_time.label("created_at"),
            no_text.label("summary"),
            no_int.label("tokens_saved"),
            no_text.label("model"),
        ).where(Snip.session_id == sid),
        select(
            literal("micro"),
            MicroWatermark.anchor_uuid,
            no_uuid,
            no_uuid,
            no_time,
            no_time,
            no_text,
            no_int,
            no_text,
        ).where(MicroWatermark.session_id == sid),
        select(
            literal("collapse"),
            c.start_uuid,
            c.end_uuid,
            c.id,
            c.applied_at,
            c.created_at,
            c.summary,
            c.tokens_saved,
            c.model,
        ).where(c.session_id == sid),
    )


MARKS_QUERY = _marks_query()


async def load_view(
    db: AsyncSession, session: AgentSession, head: uuid.UUID | None = None
) -> ChainView:
    rows, nodes = await VIEW_CACHE.view_rows(db, session.id, head or session.head_uuid)
    snipped: set[str] = set()
    anchors: list[str] = []
    collapses: list[Collapse] = []
    for mark in await db.execute(MARKS_QUERY, {"sid": session.id}):
        if mark.kind == "snip":
            snipped.add(str(mark.a))
        elif mark.kind == "micro":
            anchors.append(str(mark.a))
        else:  # detached rows: the view may mark them applied in memory
            collapses.append(
                Collapse(
                    id=mark.id,
                    session_id=session.id,
                    start_uuid=mark.a,
                    end_uuid=mark.b,
                    summary=mark.summary,
                    tokens_saved=mark.tokens_saved,
                    model=mark.model,
                    applied_at=mark.applied_at,
                    created_at=mark.created_at,
                )
            )
    index = {node.uuid: i for i, node in enumerate(nodes)} if anchors or collapses else {}
    positions = [index[anchor] for anchor in anchors if anchor in index]
    view = ChainView(
        rows=rows,
        nodes=nodes,
        watermark=max(positions) if positions else None,
        snipped=snipped & {node.uuid for node in nodes} if snipped else set(),
        collapses=[span for _, _, span in span_indices(nodes, collapses)],
        compactable=compactable_tools(session.tools or []),
    )
    view.reproject()
    return view
