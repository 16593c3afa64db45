"""Collapse spans and their projection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.context.blocks import is_clean_user_turn, is_model_visible
from app.context.collapse import apply_collapses, collapsed_node, plan_collapse_spans
from app.context.normalize import normalize_for_api, validate_api_messages
from app.context.tokens import estimate_messages
from app.context.types import ASSISTANT, COLLAPSED, USER, Block, Node
from tests.unit.strategies import agent_histories, histories, node, text, tool_result, tool_use


def u(uuid: str, *blocks: Block) -> Node:
    return node(uuid, USER, list(blocks))


def a(uuid: str, *blocks: Block) -> Node:
    return node(uuid, ASSISTANT, list(blocks))


def turn(k: int, size: int = 6000) -> list[Node]:
    return [
        u(f"q{k}", text(f"task {k}")),
        a(f"a{k}", tool_use(f"t{k}", "Read")),
        u(f"r{k}", tool_result(f"t{k}", "x" * size)),
        a(f"d{k}", text(f"done {k}")),
    ]


def splits_pair(nodes: list[Node], index: int) -> bool:
    before = {
        b["id"]
        for n in nodes[:index]
        if n.role == ASSISTANT
        for b in n.content
        if b["type"] == "tool_use"
    }
    return any(
        b["tool_use_id"] in before
        for n in nodes[index:]
        if n.role == USER
        for b in n.content
        if b["type"] == "tool_result"
    )


# --- examples ---------------------------------------------------------------------


def test_completed_turns_become_spans_and_the_newest_stay() -> None:
    h = turn(0) + turn(1) + turn(2) + turn(3)
    assert plan_collapse_spans(h, keep_recent_turns=2) == [(0, 3), (4, 7)]
    assert plan_collapse_spans(h, keep_recent_turns=0) == [(0, 3), (4, 7), (8, 11)]
    assert plan_collapse_spans(h, keep_recent_turns=4) == []


def test_small_turns_merge_until_big_enough() -> None:
    h = turn(0, 30) + turn(1, 30) + turn(2) + turn(3, 30) + turn(4)
    small = estimate_messages(h[:4])
    spans = plan_collapse_spans(h, keep_recent_turns=1, min_span_tokens=2 * small + 1)
    assert spans == [(0, 11)]  # turn 3 alone is too small and stays


def test_skip_spans_and_collapsed_nodes_are_never_collapsed_again() -> None:
    h = turn(0) + turn(1) + turn(2) + turn(3)
    assert plan_collapse_spans(h, keep_recent_turns=1, skip=[(0, 3)]) == [(4, 7), (8, 11)]
    projected = apply_collapses(h, [(4, 7, "did 1", "c1")])
    assert projected[4].subtype == COLLAPSED
    assert plan_collapse_spans(projected, keep_recent_turns=1) == [(0, 3), (5, 8)]


def test_apply_collapses_exact_projection() -> None:
    h = turn(0) + turn(1) + turn(2)
    out = apply_collapses(h, [(4, 7, "read t1", "c1"), (0, 3, " read t0 ", "c0")])
    assert out[0] == collapsed_node("read t0", "c0")
    assert out[0].content == [{"type": "text", "text": "[Summary of earlier work: read t0]"}]
    assert out[0].role == USER
    assert out[0].uuid == "c0"
    assert out[1].uuid == "c1"
    assert out[2:] == h[8:]
    assert all(x is y for x, y in zip(out[2:], h[8:], strict=True))
    assert validate_api_messages(normalize_for_api(out)) == []


def test_a_collapsed_span_is_drawn_as_the_same_row_each_time() -> None:
    """Each projection of a view draws its collapsed span as the same object, so the
    rows after it keep being compared by identity by the next request's memos."""
    h = turn(0) + turn(1) + turn(2)
    first = apply_collapses(h, [(0, 3, "read t0", "c0")])
    again = apply_collapses([*h, *turn(3)], [(0, 3, "read t0", "c0")])
    assert all(x is y for x, y in zip(again, first, strict=False))


def test_apply_collapses_rejects_overlap_and_out_of_range() -> None:
    h = turn(0) + turn(1)
    with pytest.raises(ValueError, match="overlaps"):
        apply_collapses(h, [(0, 4, "x", "c0"), (4, 7, "y", "c1")])
    with pytest.raises(ValueError, match="out of range"):
        apply_collapses(h, [(4, 8, "x", "c0")])


# --- properties -------------------------------------------------------------------


@given(histories(), st.integers(0, 3), st.integers(0, 4000))
def test_spans_are_whole_turns_and_project_validly(
    h: list[Node], keep: int, min_tokens: int
) -> None:
    spans = plan_collapse_spans(h, keep_recent_turns=keep, min_span_tokens=min_tokens)
    previous_end = -1
    for start, end in spans:
        assert previous_end < start <= end < len(h)
        assert is_clean_user_turn(h[start])
        assert end + 1 < len(h)
        assert is_clean_user_turn(h[end + 1])
        assert not splits_pair(h, start)
        assert not splits_pair(h, end + 1)
        assert estimate_messages(h[start : end + 1]) >= min_tokens
        previous_end = end
    if spans:
        turns_after = sum(is_clean_user_turn(n) for n in h[spans[-1][1] + 1 :])
        assert turns_after >= max(keep, 1)
    out = apply_collapses(h, [(s, e, f"summary {s}", f"c{s}") for s, e in spans])
    assert len(out) == len(h) - sum(e - s for s, e in spans)
    messages = normalize_for_api(out)
    assert messages == [] or validate_api_messages(messages) == []
    if any(is_model_visible(n) for n in h) and spans:
        assert messages


@given(agent_histories(max_turns=8), st.data())
def test_planning_again_later_returns_the_same_older_spans(
    h: list[Node], data: st.DataObject
) -> None:
    end = data.draw(st.integers(0, len(h)))
    early = plan_collapse_spans(h[:end], keep_recent_turns=1, min_span_tokens=500)
    late = plan_collapse_spans(h, keep_recent_turns=1, min_span_tokens=500)
    assert late[: len(early)] == early
