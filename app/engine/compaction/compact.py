"""A compaction: plan a safe cut, get the summary, and append the boundary, the summary,
re-attached files and verbatim copies of the kept messages (invariant 1)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from app import metrics
from app.context.blocks import is_clean_user_turn
from app.context.cut import Cut, find_cut
from app.context.summary_prompt import summary_message
from app.context.tokens import chars_to_tokens, estimate_content
from app.context.types import COLLAPSED, COMPACT_BOUNDARY, COMPACT_SUMMARY, Node
from app.conversation import store
from app.conversation.payloads import message_payload
from app.conversation.sessions import Limits
from app.conversation.views import ChainView, load_view
from app.engine.compaction.estimates import request_estimate, view_estimate
from app.engine.compaction.hooks import CompactionEvent, call_hooks
from app.engine.compaction.summary import CompactionFailed, summarise, text_node
from app.errors import Invalid
from app.models import AgentSession, File

if TYPE_CHECKING:
    from app.engine.loop import TurnRunner
    from app.engine.runtime import Runtime

log = logging.getLogger("parley.compaction")


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


@dataclass
class CompactionOutcome:
    boundary_uuid: uuid.UUID
    summary_uuid: uuid.UUID
    summary: str
    pre_tokens: int
    post_tokens: int
    messages_compacted: int
    trigger: str

    @property
    def tokens_saved(self) -> int:
        return max(self.pre_tokens - self.post_tokens, 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "boundary_uuid": str(self.boundary_uuid),
            "summary_uuid": str(self.summary_uuid),
            "summary": self.summary,
            "pre_tokens": self.pre_tokens,
            "post_tokens": self.post_tokens,
            "tokens_saved": self.tokens_saved,
            "messages_compacted": self.messages_compacted,
            "trigger": self.trigger,
        }


@dataclass
class CompactionPlan:
    view: ChainView
    nodes: list[Node]  # the projected view: what the model last saw
    cut: Cut
    kept_from: int  # index in view.nodes (raw) of the first kept row
    files: list[tuple[str, str]] = field(default_factory=list)


def budget(shares: tuple[float, float], threshold: int, view_tokens: int) -> int:
    return int(min(shares[0] * threshold, shares[1] * view_tokens))


def plan_compaction(session: AgentSession, view: ChainView, threshold: int) -> CompactionPlan:
    nodes = view.projected
    cut = find_cut(nodes, budget(KEEP_SHARE, threshold, view_estimate(session, nodes)))
    if cut is None:
        raise NothingToCompact(
            "Nothing can be compacted without splitting a tool call from its result"
        )
    raw_index = {node.uuid: i for i, node in enumerate(view.nodes)}
    if cut.index >= len(nodes):
        kept_from = len(view.nodes)
    else:
        first = nodes[cut.index]
        if first.subtype == COLLAPSED:
            span = next(s for s in view.collapses if str(s.id) == first.uuid)
            kept_from = raw_index[str(span.start_uuid)]
        else:
            kept_from = raw_index[first.uuid]
    return CompactionPlan(view=view, nodes=nodes, cut=cut, kept_from=kept_from)


async def precheck(db: AsyncSession, session: AgentSession, rt: Runtime) -> None:
    """422 before starting a manual compaction that could not do anything."""
    view = await load_view(db, session)
    try:
        plan_compaction(session, view, Limits(session, rt.settings).auto_compact_threshold)
    except NothingToCompact as exc:
        raise Invalid(str(exc)) from exc


async def compact(
    runner: TurnRunner,
    session: AgentSession,
    trigger: str,
    *,
    instructions: str | None = None,
    pre_tokens: int | None = None,
    threshold: int | None = None,
) -> CompactionOutcome:
    rt = runner.rt
    threshold = threshold or Limits(session, rt.settings).auto_compact_threshold
    async with rt.db.sessionmaker() as db:
        view = await load_view(db, session)
    plan = plan_compaction(session, view, threshold)
    pre = pre_tokens or request_estimate(session, view)
    await runner.emit("compaction.started", {"trigger": trigger, "pre_tokens": pre})
    await call_hooks(rt, "before", CompactionEvent(session.id, trigger, pre))
    try:
        summary = await summarise(runner, session, plan, instructions)
    except CompactionFailed:
        metrics.compactions.labels(trigger, "failed").inc()
        raise
    outcome = await store_compaction(
        runner,
        session,
        plan,
        summary,
        trigger=trigger,
        pre_tokens=pre,
        instructions=instructions,
        threshold=threshold,
    )
    await runner.emit(
        "compaction.completed",
        {
            "boundary_uuid": str(outcome.boundary_uuid),
            "summary_uuid": str(outcome.summary_uuid),
            "pre_tokens": outcome.pre_tokens,
            "post_tokens": outcome.post_tokens,
        },
    )
    metrics.compactions.labels(trigger, "ok").inc()
    await call_hooks(
        rt,
        "after",
        CompactionEvent(
            session.id, trigger, pre, outcome.post_tokens, outcome.summary, outcome.boundary_uuid
        ),
    )
    return outcome


def recent_user_messages(nodes: list[Node]) -> list[str]:
    """The newest user prompts of the compacted part, verbatim, within a budget."""
    picked: list[str] = []
    budget = RECENT_USER_TOKENS
    for node in reversed(nodes):
        if len(picked) >= RECENT_USER_MESSAGES:
            break
        if not is_clean_user_turn(node) or node.subtype:
            continue
        text = "\n".join(b.get("text", "") for b in node.content if b.get("type") == "text")
        cost = chars_to_tokens(len(text))
        if not text.strip() or cost > budget:
            continue
        budget -= cost
        picked.append(text)
    return list(reversed(picked))


def files_to_reattach(compacted: list[Node], kept: list[Node]) -> list[str]:
    """Up to MAX_FILES paths read most recently in the compacted part and not still
    visible in the kept part (newest first)."""
    visible = {path for path in _read_paths(kept)}
    paths: list[str] = []
    for path in reversed(_read_paths(compacted)):
        if path not in visible and path not in paths:
            paths.append(path)
        if len(paths) >= MAX_FILES:
            break
    return paths


def _read_paths(nodes: list[Node]) -> list[str]:
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


async def _attachments(
    db: AsyncSession, session_id: uuid.UUID, paths: list[str], budget_tokens: int
) -> list[list[dict[str, Any]]]:
    """The current content of each file, trimmed to FILE_TOKENS and to the budget."""
    out: list[list[dict[str, Any]]] = []
    for path in paths:
        row = await db.get(File, (session_id, path))
        if row is None:
            continue
        try:
            text = row.content.decode()
        except UnicodeDecodeError:
            continue
        limit_chars = int(min(FILE_TOKENS, budget_tokens) * 2.8)
        if limit_chars < 200:
            break
        if len(text) > limit_chars:
            text = text[:limit_chars] + f"\n[... file truncated; {len(row.content)} bytes in all]"
        content = [
            {
                "type": "text",
                "text": (
                    f"Contents of {path}, re-attached after the conversation was compacted "
                    f"(the file as it is now):\n\n{text}"
                ),
            }
        ]
        budget_tokens -= estimate_content(content)
        out.append(content)
    return out


async def store_compaction(
    runner: TurnRunner,
    session: AgentSession,
    plan: CompactionPlan,
    summary: str,
    *,
    trigger: str,
    pre_tokens: int,
    instructions: str | None,
    threshold: int,
) -> CompactionOutcome:
    """Append the boundary, the summary, re-attached files and copies of the kept rows
    (invariant 1: nothing rewritten, nothing re-parented)."""
    rt = runner.rt
    view = plan.view
    compacted = plan.nodes[: plan.cut.index]
    kept_rows = view.rows[plan.kept_from :]
    covered = view.rows[: plan.kept_from]
    last_covered = covered[-1].uuid if covered else None
    recent = recent_user_messages(compacted)
    text = summary_message(summary, recent, continue_work=trigger != "manual")
    async with rt.db.transaction() as db:
        current = await db.get(AgentSession, session.id)
        assert current is not None
        boundary_id, summary_id = uuid.uuid4(), uuid.uuid4()
        files = await _attachments(
            db,
            session.id,
            files_to_reattach(compacted, plan.nodes[plan.cut.index :]),
            budget(FILES_SHARE, threshold, view_estimate(session, plan.nodes)),
        )
        specs: list[dict[str, Any]] = [
            {
                "message_uuid": boundary_id,
                "parent_uuid": None,
                "type": "system",
                "subtype": COMPACT_BOUNDARY,
                "role": None,
                "content": [],
                "logical_parent_uuid": last_covered,
                "run_id": runner.run_id,
            },
            {
                "message_uuid": summary_id,
                "parent_uuid": boundary_id,
                "type": "user",
                "subtype": COMPACT_SUMMARY,
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "run_id": runner.run_id,
            },
        ]
        parent = summary_id
        for content in files:
            file_id = uuid.uuid4()
            specs.append(
                {
                    "message_uuid": file_id,
                    "parent_uuid": parent,
                    "type": "attachment",
                    "subtype": "file",
                    "role": "user",
                    "content": content,
                    "is_meta": True,
                    "run_id": runner.run_id,
                }
            )
            parent = file_id
        copies: dict[uuid.UUID, uuid.UUID] = {}
        for row in kept_rows:
            copy_id = uuid.uuid4()
            copies[row.uuid] = copy_id
            specs.append(
                {
                    "message_uuid": copy_id,
                    "parent_uuid": parent,
                    "type": row.type,
                    "subtype": row.subtype,
                    "role": row.role,
                    "content": row.content,
                    "model": row.model,
                    "stop_reason": row.stop_reason,
                    "usage": row.usage,
                    "is_meta": row.is_meta,
                    "copied_from": row.uuid,
                    "meta": row.metadata,
                    "run_id": row.run_id,
                    "token_estimate": row.token_estimate,
                }
            )
            parent = copy_id
        post = view_estimate(
            current,
            [
                text_node(text),
                *(text_node(c[0]["text"]) for c in files),
                *plan.nodes[plan.cut.index :],
            ],
        )
        specs[0]["meta"] = {
            "trigger": trigger,
            "pre_tokens": pre_tokens,
            "post_tokens": post,
            "covered": {
                "first_uuid": str(covered[0].uuid) if covered else None,
                "last_uuid": str(last_covered) if last_covered else None,
                "messages": len(covered),
            },
            "kept": len(kept_rows),
            "files": len(files),
            "model": rt.settings.compaction_model or session.model,
            "instructions": instructions,
            "clean_cut": plan.cut.clean,
        }
        rows = await store.append_many(db, session.id, specs)
        await store.copy_context_marks(db, session.id, session.id, copies)
        await db.execute(
            update(AgentSession).where(AgentSession.id == session.id).values(compact_failures=0)
        )
    runner.head = rows[-1]["uuid"]
    for row in rows[: 2 + len(files)]:
        await runner.emit("message.completed", message_payload(row))
    return CompactionOutcome(
        boundary_uuid=boundary_id,
        summary_uuid=summary_id,
        summary=summary,
        pre_tokens=pre_tokens,
        post_tokens=post,
        messages_compacted=len(covered),
        trigger=trigger,
    )
