"""Micro-compaction: the projection and the watermark plan."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from app.context.blocks import is_model_visible
from app.context.micro import ClearMemo, MicroPlan, ScanMemo, apply_micro, plan_micro
from app.context.normalize import normalize_for_api, validate_api_messages
from app.context.tokens import estimate_messages
from app.context.tools import COMPACTABLE_BUILTINS
from app.context.types import ASSISTANT, CLEARED_TOOL_RESULT, USER, Block, Node
from tests.unit.strategies import agent_histories, histories, node, text, tool_result, tool_use

C = COMPACTABLE_BUILTINS


def u(uuid: str, *blocks: Block) -> Node:
    return node(uuid, USER, list(blocks))


def a(uuid: str, *blocks: Block) -> Node:
    return node(uuid, ASSISTANT, list(blocks))


def cleared(use_id: str, *, is_error: bool = False) -> Block:
    return tool_result(use_id, CLEARED_TOOL_RESULT, is_error=is_error)


def session() -> list[Node]:
    return [
        u("q", text("go")),
        a("a1", tool_use("t1", "Read"), tool_use("t2", "Bash")),
        u("r1", tool_result("t1", "r" * 3000, is_error=True), tool_result("t2", "b" * 3000)),
        a("a2", tool_use("t3", "Grep")),
        u("r2", tool_result("t3", "g" * 3000)),
        a("a3", tool_use("t4", "Read")),
        u("r3", tool_result("t4", "n" * 3000)),
    ]


def names(nodes: list[Node]) -> dict[str, str]:
    return {
        b["id"]: b["name"]
        for n in nodes
        if n.role == ASSISTANT
        for b in n.content
        if b["type"] == "tool_use"
    }


def newest_uses(nodes: list[Node]) -> set[str]:
    for n in reversed(nodes):
        if n.role == ASSISTANT and is_model_visible(n):
            return {b["id"] for b in n.content if b["type"] == "tool_use"}
    return set()


# --- examples ---------------------------------------------------------------------


def test_apply_clears_compactable_results_up_to_the_watermark() -> None:
    h = session()
    out = apply_micro(h, 4, C)
    assert out[2].content == [cleared("t1", is_error=True), tool_result("t2", "b" * 3000)]
    assert out[4].content == [cleared("t3")]
    assert out[6] is h[6]
    assert [out[i] is h[i] for i in (0, 1, 3, 5)] == [True] * 4
    assert out[2].token_estimate < h[2].token_estimate
    assert h[2].content[0]["content"] == "r" * 3000  # input untouched


def test_apply_never_clears_the_newest_assistant_messages_results() -> None:
    h = session()
    assert apply_micro(h, 6, C)[6] is h[6]


def test_apply_without_watermark_is_identity() -> None:
    h = session()
    out = apply_micro(h, None, C)
    assert all(x is y for x, y in zip(out, h, strict=True))


def test_plan_keeps_recent_and_moves_only_for_a_big_enough_batch() -> None:
    h = session()
    plan = plan_micro(
        h, watermark=None, compactable=C, keep_recent=1, batch_tokens=1, cache_cold=False
    )
    assert plan is not None
    assert plan.watermark == 4
    assert plan.results_cleared == 2
    assert plan.tokens_freed == estimate_messages(h) - estimate_messages(apply_micro(h, 4, C))
    assert plan_micro(
        h, watermark=None, compactable=C, keep_recent=2, batch_tokens=1, cache_cold=False
    ) == MicroPlan(watermark=2, tokens_freed=plan.tokens_freed // 2, results_cleared=1)
    big = plan.tokens_freed + 1
    assert (
        plan_micro(
            h, watermark=None, compactable=C, keep_recent=1, batch_tokens=big, cache_cold=False
        )
        is None
    )
    assert (
        plan_micro(
            h, watermark=None, compactable=C, keep_recent=1, batch_tokens=big, cache_cold=True
        )
        == plan
    )
    assert (
        plan_micro(h, watermark=4, compactable=C, keep_recent=0, batch_tokens=1, cache_cold=True)
        is None
    )


def test_plan_keeps_an_answer_to_the_newest_call_behind_newer_results() -> None:
    """A result answering the newest assistant message stays even when newer results
    (here a repeated one) already make up `keep_recent`: the watermark stays below it."""
    h = [
        u("q", text("go")),
        a("a1", tool_use("t1", "Read")),
        u("r1", tool_result("t1", "x" * 3000)),
        a("a2", tool_use("t2", "Read")),
        u("r2", tool_result("t2", "y" * 3000)),
        u("r3", tool_result("t1", "x" * 3000)),
    ]
    plan = plan_micro(
        h, watermark=None, compactable=C, keep_recent=1, batch_tokens=1, cache_cold=False
    )
    assert plan is not None
    assert plan.watermark == 2, "r1 only: r2 answers the newest call"


def test_plan_counts_client_tools_marked_compactable() -> None:
    h = [
        u("q", text("go")),
        a("a1", tool_use("t1", "lookup_order")),
        u("r1", tool_result("t1", "o" * 900)),
        a("a2", text("done")),
    ]
    assert (
        plan_micro(
            h, watermark=None, compactable=C, keep_recent=0, batch_tokens=1, cache_cold=False
        )
        is None
    )
    plan = plan_micro(
        h,
        watermark=None,
        compactable=C | {"lookup_order"},
        keep_recent=0,
        batch_tokens=1,
        cache_cold=False,
    )
    assert plan is not None
    assert plan.watermark == 2


def test_cleared_prefix_is_byte_stable_as_the_session_grows() -> None:
    h = session()
    more = [a("a4", text("all done")), u("q2", text("thanks"))]
    before = normalize_for_api(apply_micro(h, 4, C))
    after = normalize_for_api(apply_micro(h + more, 4, C))
    assert after[: len(before)] == before


# --- properties -------------------------------------------------------------------


@given(histories(), st.data())
def test_apply_clears_exactly_the_compactable_old_results(
    h: list[Node], data: st.DataObject
) -> None:
    watermark = data.draw(st.none() | st.integers(-1, len(h)))
    compactable = data.draw(st.sampled_from([C, C | {"Bash"}, frozenset({"Read"})]))
    before = copy.deepcopy(h)
    out = apply_micro(h, watermark, compactable)
    assert h == before
    assert len(out) == len(h)
    protected = newest_uses(h)
    seen: dict[str, str] = {}
    for i, (old, new) in enumerate(zip(h, out, strict=True)):
        if old.role == ASSISTANT:
            for b in old.content:
                if b["type"] == "tool_use":
                    seen.setdefault(b["id"], b["name"])  # the first use of an id counts
        should = [
            b["type"] == "tool_result"
            and watermark is not None
            and i <= watermark
            and seen.get(b["tool_use_id"]) in compactable
            and b["tool_use_id"] not in protected
            for b in old.content
        ]
        if not any(should):
            assert new is old
            continue
        for b_old, b_new, clear in zip(old.content, new.content, should, strict=True):
            if clear:
                assert b_new == {**b_old, "content": CLEARED_TOOL_RESULT}
            else:
                assert b_new is b_old
    messages = normalize_for_api(out)
    assert messages == [] or validate_api_messages(messages) == []


@given(histories(), st.integers(0, 4), st.integers(0, 3000), st.booleans())
def test_plan_is_monotone_as_a_session_grows(
    h: list[Node], keep: int, batch: int, cold: bool
) -> None:
    watermark: int | None = None
    for end in range(1, len(h) + 1):
        view = h[:end]
        plan = plan_micro(
            view,
            watermark=watermark,
            compactable=C,
            keep_recent=keep,
            batch_tokens=batch,
            cache_cold=cold,
        )
        if plan is None:
            continue
        assert plan.watermark > (-1 if watermark is None else watermark)
        assert plan.watermark < end
        assert plan.tokens_freed >= batch or (cold and plan.tokens_freed > 0)
        watermark = plan.watermark


@given(agent_histories(), st.integers(0, 4), st.data())
def test_plan_respects_keep_recent_and_frees_what_it_says(
    h: list[Node], keep: int, data: st.DataObject
) -> None:
    old = data.draw(st.none() | st.integers(0, len(h) - 1))
    plan = plan_micro(
        h, watermark=old, compactable=C, keep_recent=keep, batch_tokens=0, cache_cold=False
    )
    if plan is None:
        return
    by_id = names(h)
    after = [
        b
        for n in h[plan.watermark + 1 :]
        for b in n.content
        if b["type"] == "tool_result" and by_id.get(b["tool_use_id"]) in C
    ]
    assert len(after) >= keep
    protected = newest_uses(h)
    assert all(
        b["tool_use_id"] not in protected
        for n in h[: plan.watermark + 1]
        for b in n.content
        if b["type"] == "tool_result"
    )
    freed = estimate_messages(apply_micro(h, old, C)) - estimate_messages(
        apply_micro(h, plan.watermark, C)
    )
    assert plan.tokens_freed == freed > 0
    assert any(b["type"] == "tool_result" for b in h[plan.watermark].content)


def growing_views(
    h: list[Node], other: list[Node], data: st.DataObject
) -> list[tuple[list[Node], frozenset[str]]]:
    """A session's views as turns add one to three rows, the same view twice, a branch
    sharing only a prefix, another set of compactable tools, then the first view again
    (each with the compactable tools it is planned or drawn with)."""
    views: list[tuple[list[Node], frozenset[str]]] = []
    cut = 0
    while cut < len(h):
        cut = min(len(h), cut + data.draw(st.integers(1, 3)))
        views.append((h[:cut], C))
    branch_at = data.draw(st.integers(0, len(h)))
    return [*views, (h, C), (h[:branch_at] + other, C), (h, frozenset({"Bash"})), (h, C)]


@given(agent_histories(), histories(), st.integers(0, 4), st.integers(0, 3000), st.data())
def test_a_memo_changes_no_plan(
    h: list[Node], other: list[Node], keep: int, batch: int, data: st.DataObject
) -> None:
    """A session's views as turns add rows (with the watermark each plan moves), the
    same view twice, a branch sharing only a prefix, another set of compactable tools,
    then the first view again: with one memo throughout, every plan equals the one
    made without."""
    views = growing_views(h, other, data)
    memo = ScanMemo()
    watermark: int | None = None
    for view, compactable in views:
        cold = data.draw(st.booleans())
        if watermark is not None and watermark >= len(view):
            watermark = None
        plans = [
            plan_micro(
                view,
                watermark=watermark,
                compactable=compactable,
                keep_recent=keep,
                batch_tokens=batch,
                cache_cold=cold,
                memo=each,
            )
            for each in (memo, None)
        ]
        plan = plans[0]
        assert plan == plans[1]
        if plan is not None and data.draw(st.booleans()):
            watermark = plan.watermark


@given(agent_histories(), histories(), st.data())
def test_a_projection_memo_changes_nothing(
    h: list[Node], other: list[Node], data: st.DataObject
) -> None:
    """Growing views with a watermark that moves now and then, a branch, other
    compactable tools and back: with one memo every projection equals the one drawn
    without."""
    views = growing_views(h, other, data)
    memo = ClearMemo()
    watermark: int | None = None
    for view, compactable in views:
        if data.draw(st.booleans()) or (watermark is not None and watermark >= len(view)):
            watermark = data.draw(st.none() | st.integers(0, max(len(view) - 1, 0)))
        drawn = apply_micro(view, watermark, compactable, memo)
        assert drawn == apply_micro(view, watermark, compactable)


def test_a_projection_memo_draws_the_cleared_rows_again() -> None:
    """The next turn's view (rows added after the watermark) gets the very objects the
    last projection cleared, which the memos after it compare by identity; an answer to
    the newest call found before the watermark makes it draw them afresh."""
    h = session()
    memo = ClearMemo()
    first = apply_micro(h, 4, C, memo)
    longer = [*h, a("a4", tool_use("t5", "Read")), u("r4", tool_result("t5", "m" * 3000))]
    again = apply_micro(longer, 4, C, memo)
    assert again[:5] == first[:5]
    assert all(x is y for x, y in zip(again[:5], first[:5], strict=True))
    assert again[2] is not h[2], "r1 is drawn cleared"
    reused = [*longer, a("a5", tool_use("t3", "Grep"))]  # the newest call reuses t3 (in r2)
    fresh = apply_micro(reused, 4, C, memo)
    assert fresh == apply_micro(reused, 4, C)
    assert fresh[4] is reused[4], "r2 answers the newest call now: left as stored"
