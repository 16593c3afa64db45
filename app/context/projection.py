"""The model's view as a projection over the stored chain: snip, then micro-compaction,
then applied collapses. Stored rows never change; the marks (snipped uuids, the micro
watermark, collapse spans) decide what each request shows."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from app.context.collapse import apply_collapses
from app.context.micro import ClearMemo, apply_micro
from app.context.types import Node


@dataclass(slots=True)
class CollapseSpan:
    """A summarised span of the chain (a `collapses` row as a value). `applied_at` is set
    the first time a request shows it collapsed; it stays collapsed from then on."""

    id: uuid.UUID
    start_uuid: uuid.UUID
    end_uuid: uuid.UUID
    summary: str
    tokens_saved: int
    model: str | None
    applied_at: datetime | None
    created_at: datetime


def span_indices(
    nodes: Sequence[Node], spans: Sequence[CollapseSpan]
) -> list[tuple[int, int, CollapseSpan]]:
    """Each span that lies on `nodes`, as (start index, end index, span), in order.
    Overlapping spans cannot both apply: the earlier-starting one is kept."""
    if not spans:
        return []  # the common case, without indexing the whole view
    index = {node.uuid: i for i, node in enumerate(nodes)}
    found = []
    for span in spans:
        start, end = index.get(str(span.start_uuid)), index.get(str(span.end_uuid))
        if start is not None and end is not None and start <= end:
            found.append((start, end, span))
    found.sort(key=lambda item: item[0])
    kept: list[tuple[int, int, CollapseSpan]] = []
    for item in found:
        if not kept or item[0] > kept[-1][1]:
            kept.append(item)
    return kept


def project(
    nodes: list[Node],
    *,
    snipped: set[str],
    watermark: int | None,
    compactable: frozenset[str],
    collapses: Sequence[tuple[int, int, CollapseSpan]],
    memo: ClearMemo | None = None,
) -> list[Node]:
    """snip -> micro -> collapse, each a projection over the same chain. `memo`: see
    `apply_micro` (the result is the same without one)."""
    projected = apply_micro(nodes, watermark, compactable, memo)
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
