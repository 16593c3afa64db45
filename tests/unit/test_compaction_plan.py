"""Property tests of compaction planning as the service does it (plan_compaction, with
its budgets): for every history the compacted view is a valid request, never splits a
tool pair, and what it keeps verbatim fits the budget, so the result fits under the
threshold."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from app.context.collapse import apply_collapses, plan_collapse_spans
from app.context.compaction import KEEP_SHARE, NothingToCompact, budget, plan_compaction
from app.context.cut import split_pairs
from app.context.estimates import view_estimate
from app.context.micro import apply_micro, plan_micro
from app.context.normalize import normalize_for_api, validate_api_messages
from app.context.session import CompactionConfig, SessionConfig
from app.context.tokens import estimate_messages
from app.context.tools import COMPACTABLE_BUILTINS
from app.context.types import COMPACT_SUMMARY, USER, Node
from app.engine.compaction.summary import SUMMARY_MAX_TOKENS
from tests.unit.strategies import agent_histories, histories, node, text


def session() -> SessionConfig:
    compaction = CompactionConfig(
        auto=True,
        threshold_tokens=None,
        context_window=None,
        keep_recent_tool_results=5,
        micro_batch_tokens=20_000,
        micro=True,
        collapse_at=0.9,
    )
    return SessionConfig(
        model="claude-haiku-4-5",
        system="be brief",
        tools=[],
        builtin_tools=[],
        max_tokens=None,
        thinking=None,
        compaction=compaction,
    )


def summary_node() -> Node:
    return node(
        "summary",
        USER,
        [text("summary of the earlier conversation")],
        subtype=COMPACT_SUMMARY,
        type=USER,
    )


def projected(history: list[Node], micro: bool, collapse: bool) -> list[Node]:
    """The view as the layers before auto-compaction leave it."""
    view = history
    if micro:
        plan = plan_micro(
            view,
            watermark=None,
            compactable=COMPACTABLE_BUILTINS,
            keep_recent=2,
            batch_tokens=0,
            cache_cold=False,
        )
        if plan is not None:
            view = apply_micro(view, plan.watermark, COMPACTABLE_BUILTINS)
    if collapse:
        spans = plan_collapse_spans(view, min_span_tokens=1)
        view = apply_collapses(view, [(s, e, "done", f"c{s}") for s, e in spans])
    return view


@settings(max_examples=300, deadline=None)
@given(
    history=st.one_of(agent_histories(), histories(min_size=1)),
    threshold=st.integers(min_value=1_000, max_value=200_000),
    micro=st.booleans(),
    collapse=st.booleans(),
)
def test_compacted_view_is_valid_and_fits(
    history: list[Node], threshold: int, micro: bool, collapse: bool
) -> None:
    nodes = projected(history, micro, collapse)
    try:
        plan = plan_compaction(session(), nodes, nodes, [], threshold)
    except NothingToCompact:
        event("nothing to compact")
        return
    event("compacted")
    index = plan.cut.index
    kept = nodes[index:]
    # Never inside a tool pair, never between the blocks of one response.
    assert not split_pairs(nodes)[index]
    compacted_view = [summary_node(), *kept]
    assert validate_api_messages(normalize_for_api(compacted_view)) == []
    keep_budget = budget(KEEP_SHARE, threshold, view_estimate(session(), nodes))
    if index < len(nodes):
        assert estimate_messages(kept) <= keep_budget
    # The kept tail, a summary of at most SUMMARY_MAX_TOKENS and the files budget stay
    # within the threshold whenever the threshold leaves room for a summary at all.
    if threshold >= 4 * SUMMARY_MAX_TOKENS:
        assert estimate_messages(kept) + SUMMARY_MAX_TOKENS + 0.08 * threshold <= threshold
