"""Planning a compaction: where to cut, what to keep verbatim, what to re-attach.

Pure: the engine loads the view, asks for the summary and writes the rows; everything
decided about the conversation itself is decided here (and property-tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.context.blocks import is_clean_user_turn
from app.context.cut import Cut, find_cut
from app.context.estimates import view_estimate
from app.context.projection import CollapseSpan
from app.context.session import SessionConfig
from app.context.tokens import chars_to_tokens
from app.context.types import COLLAPSED, Node

# Budgets after a compaction, as shares of the threshold and of the view being compacted
# (whichever is smaller, so compacting a short conversation early still shrinks it):
KEEP_SHARE = (0.10, 0.30)  # the newest messages, kept verbatim
FILES_SHARE = (0.08, 0.20)  # re-attached files
MAX_FILES = 5
FILE_TOKENS = 5_000
RECENT_USER_TOKENS = 2_000
RECENT_USER_MESSAGES = 3


class NothingToCompact(Exception):
    """No cut point can compact anything without splitting a tool pair."""


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    projected: list[Node]  # the view as the model last saw it
    cut: Cut
    kept_from: int  # index in the stored chain of the first message kept verbatim

    @property
    def compacted(self) -> list[Node]:
        return self.projected[: self.cut.index]

    @property
    def kept(self) -> list[Node]:
        return self.projected[self.cut.index :]


def budget(shares: tuple[float, float], threshold: int, view_tokens: int) -> int:
    return int(min(shares[0] * threshold, shares[1] * view_tokens))


def plan_compaction(
    config: SessionConfig,
    projected: list[Node],
    stored: Sequence[Node],
    collapses: Sequence[CollapseSpan],
    threshold: int,
) -> CompactionPlan:
    """Cut `projected` (the view as projected over the `stored` chain) where the kept
    newest messages fit their budget; raises NothingToCompact."""
    cut = find_cut(projected, budget(KEEP_SHARE, threshold, view_estimate(config, projected)))
    if cut is None:
        raise NothingToCompact(
            "Nothing can be compacted without splitting a tool call from its result"
        )
    index = {node.uuid: i for i, node in enumerate(stored)}
    if cut.index >= len(projected):
        kept_from = len(stored)
    else:
        first = projected[cut.index]
        if first.subtype == COLLAPSED:  # a collapsed span stands for its first message on
            span = next(s for s in collapses if str(s.id) == first.uuid)
            kept_from = index[str(span.start_uuid)]
        else:
            kept_from = index[first.uuid]
    return CompactionPlan(projected=projected, cut=cut, kept_from=kept_from)


def recent_user_messages(nodes: Sequence[Node]) -> list[str]:
    """The newest user prompts of the compacted part, verbatim, within a budget."""
    picked: list[str] = []
    remaining = RECENT_USER_TOKENS
    for node in reversed(nodes):
        if len(picked) >= RECENT_USER_MESSAGES:
            break
        if not is_clean_user_turn(node) or node.subtype:
            continue
        text = "\n".join(b.get("text", "") for b in node.content if b.get("type") == "text")
        cost = chars_to_tokens(len(text))
        if not text.strip() or cost > remaining:
            continue
        remaining -= cost
        picked.append(text)
    return list(reversed(picked))


def files_to_reattach(compacted: Sequence[Node], kept: Sequence[Node]) -> list[str]:
    """Up to MAX_FILES paths read most recently in the compacted part and not still
    visible in the kept part (newest first)."""
    visible = set(_read_paths(kept))
    paths: list[str] = []
    for path in reversed(_read_paths(compacted)):
        if path not in visible and path not in paths:
            paths.append(path)
        if len(paths) >= MAX_FILES:
            break
    return paths


def _read_paths(nodes: Sequence[Node]) -> list[str]:
    paths = []
    for node in nodes:
        if node.role != "assistant":
            continue
        for block in node.content:
            if block.get("type") == "tool_use" and block.get("name") == "Read":
                path = (block.get("input") or {}).get("file_path")
                if isinstance(path, str):
                    paths.append(path.lstrip("/"))
    return paths
