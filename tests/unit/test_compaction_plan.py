"""Property tests of compaction planning as the service does it (plan_compaction, with
its budgets): for every history the compacted view is a valid request, never splits a
tool pair, and what it keeps verbatim fits the budget (the newest round excepted, kept
with its tool results shrunk), so the result fits under the threshold; no accepted
compaction grows the view; the user's newest prompt survives any number of them."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from app.context.collapse import apply_collapses, plan_collapse_spans
from app.context.compaction import (
    KEEP_SHARE,
    MIN_SUMMARY_TOKENS,
    NothingToCompact,
    budget,
    compacted_view,
    gains,
    human_prompts,
    plan_compaction,
    post_floor,
    quoted_prompts,
)
from app.context.cut import newest_round_cut, split_pairs
from app.context.estimates import view_estimate
from app.context.micro import apply_micro, plan_micro
from app.context.normalize import normalize_for_api, validate_api_messages
from app.context.session import CompactionConfig, SessionConfig
from app.context.summary_prompt import summary_message
from app.context.tokens import estimate_messages, node_tokens
from app.context.tools import COMPACTABLE_BUILTINS
from app.context.types import ASSISTANT, COMPACT_SUMMARY, USER, Node
from app.engine.compaction.summary import SUMMARY_MAX_TOKENS
from tests.unit.strategies import (
    agent_histories,
    histories,
    node,
    text,
    tool_result,
    tool_use,
)


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
    except NothingToCompact as exc:
        event("nothing to compact")
        reason = str(exc)
        assert reason.startswith(("Nothing to compact", "Nothing can be compacted"))
        return
    event("compacted, round shrunk" if plan.shrunk else "compacted")
    index = plan.cut.index
    kept = plan.kept
    # Never inside a tool pair, never between the blocks of one response.
    assert not split_pairs(nodes)[index]
    # The kept part is the view's tail; only tool results of the newest round may change.
    assert [n.uuid for n in kept] == [n.uuid for n in nodes[index:]]
    for new, old in zip(kept, nodes[index:], strict=True):
        if new.uuid in plan.shrunk:
            assert [b.get("type") for b in new.content] == [b.get("type") for b in old.content]
            assert node_tokens(new) < node_tokens(old)
        else:
            assert new is old
    compacted_view = [summary_node(), *kept]
    assert validate_api_messages(normalize_for_api(compacted_view)) == []
    keep_budget = budget(KEEP_SHARE, threshold, view_estimate(session(), nodes))
    if estimate_messages(kept) > keep_budget:
        # Only the newest round may stay over the budget: it is what the model needs next.
        newest = newest_round_cut(nodes)
        assert newest is not None
        assert newest.index == index
    # The kept tail, a summary of at most SUMMARY_MAX_TOKENS and the files budget stay
    # within the threshold whenever the threshold leaves room for a summary at all.
    if threshold >= 4 * SUMMARY_MAX_TOKENS and not plan.shrunk:
        assert estimate_messages(kept) + SUMMARY_MAX_TOKENS + 0.08 * threshold <= threshold


def big_round(history: list[Node], size: int) -> list[Node]:
    """The history, then a prompt answered by one Read whose result is `size` chars."""
    return [
        *history,
        node("big-prompt", USER, [text("read the big file")], type=USER),
        node("big-call", ASSISTANT, [tool_use("toolu_big", "Read", file_path="big.txt")]),
        node("big-result", USER, [tool_result("toolu_big", "line of the file\n" * size)]),
    ]


@settings(max_examples=150, deadline=None)
@given(
    history=agent_histories(max_turns=3),
    size=st.integers(2_000, 40_000),
    threshold=st.integers(5_000, 60_000),
)
def test_a_final_round_over_the_budget_is_kept_shrunk(
    history: list[Node], size: int, threshold: int
) -> None:
    """The newest round alone over the kept budget: kept, its result cut to head and tail
    around the marker, the call and its answer still paired (a valid request)."""
    nodes = big_round(history, size)
    keep = budget(KEEP_SHARE, threshold, view_estimate(session(), nodes))
    if node_tokens(nodes[-1]) <= keep:
        return
    plan = plan_compaction(session(), nodes, nodes, [], threshold)
    assert plan.kept[-1].uuid == "big-result"
    assert "big-call" in [n.uuid for n in plan.kept]
    result = plan.kept[-1].content[0]
    assert result["tool_use_id"] == "toolu_big"
    assert "characters of this tool result were left out" in result["content"]
    assert result["content"].startswith("line of the file")
    assert validate_api_messages(normalize_for_api([summary_node(), *plan.kept])) == []
    assert estimate_messages(plan.kept) <= max(keep, 1_000)


def test_a_final_round_without_results_is_summarised() -> None:
    """A long text answer is not kept whole past the budget: it is summarised."""
    nodes = [
        node("u1", USER, [text("first")], type=USER),
        node("a1", ASSISTANT, [text("short")]),
        node("u2", USER, [text("write an essay")], type=USER),
        node("a2", ASSISTANT, [text("word " * 20_000)]),
    ]
    plan = plan_compaction(session(), nodes, nodes, [], 10_000)
    assert plan.cut.index == len(nodes)
    assert plan.kept == []


def test_nothing_to_compact_says_why() -> None:
    only_summary = [summary_node()]
    with pytest.raises(NothingToCompact) as raised:
        plan_compaction(session(), only_summary, only_summary, [], 10_000)
    assert "since the last compaction holds only 1 message" in str(raised.value)
    assert "tool call" not in str(raised.value)
    one_turn = [node("u1", USER, [text("hi")], type=USER)]
    with pytest.raises(NothingToCompact) as raised:
        plan_compaction(session(), one_turn, one_turn, [], 10_000)
    assert str(raised.value) == "Nothing to compact: the conversation holds only 1 message"


def test_gains_needs_the_minimum_share() -> None:
    assert gains(1_000, 799, 0.2)
    assert gains(1_000, 800, 0.2)
    assert not gains(1_000, 801, 0.2)
    assert not gains(53, 172, 0.2)  # a compaction that grows the context
    assert not gains(100, 100, 0.0)  # nor one that keeps it the same
    assert gains(100, 99, 0.0)


@settings(max_examples=200, deadline=None)
@given(
    history=st.one_of(agent_histories(), histories(min_size=1)),
    threshold=st.integers(min_value=1_000, max_value=200_000),
    summary_tokens=st.integers(min_value=MIN_SUMMARY_TOKENS, max_value=5_000),
    min_saving=st.sampled_from([0.0, 0.2, 0.5]),
)
def test_no_accepted_compaction_grows_the_view(
    history: list[Node], threshold: int, summary_tokens: int, min_saving: float
) -> None:
    """The figure checked before the summary request never exceeds the one after it (so
    the early refusal only refuses what the summary could not rescue), and whatever
    passes the check after it leaves a smaller view by the minimum share."""
    cfg = session()
    pre = view_estimate(cfg, history)
    try:
        plan = plan_compaction(cfg, history, history, [], threshold, pre)
    except NothingToCompact:
        return
    _, quoted = quoted_prompts(history, plan)
    floor = post_floor(cfg, plan.kept, quoted, [], continue_work=True)
    summary = "s" * int(summary_tokens * 2.8)
    text_ = summary_message(summary, quoted, continue_work=True)
    post = view_estimate(cfg, compacted_view(text_, [], plan.kept))
    assert floor <= post
    if gains(pre, post, min_saving):
        event("gains")
        assert post < pre
        assert post <= pre * (1 - min_saving)
    else:
        event("refused")


def test_small_sessions_shrink_too() -> None:
    """Four turns of chat without tools: quoted prompts scale with what is compacted, so
    a short summary leaves a smaller request (the 2,506 -> 2,839 case)."""
    cfg = session()
    nodes: list[Node] = []
    for i in range(4):
        nodes.append(node(f"u{i}", USER, [text(f"question {i}: " + "why " * 200)], type=USER))
        nodes.append(node(f"a{i}", ASSISTANT, [text("because " * 300)]))
    pre = view_estimate(cfg, nodes)
    plan = plan_compaction(cfg, nodes, nodes, [], 167_000, pre)
    _, quoted = quoted_prompts(nodes, plan)
    assert len(quoted) == 1  # the newest prompt of the compacted part, whatever the budget
    post = view_estimate(cfg, compacted_view(summary_message("s" * 1_400, quoted), [], plan.kept))
    assert gains(pre, post, 0.2)


def compact_once(view: list[Node], n: int) -> list[Node]:
    """A compaction as the engine does it, purely: the summary quotes the newest prompts,
    the kept part follows."""
    plan = plan_compaction(session(), view, view, [], 1_000_000, None)
    _, quoted = quoted_prompts(view, plan)
    summary = node(
        f"summary{n}",
        USER,
        [text(summary_message(f"summary number {n}", quoted))],
        subtype=COMPACT_SUMMARY,
        type=USER,
    )
    return [summary, *plan.kept]


def tool_rounds(n: int, count: int) -> list[Node]:
    out: list[Node] = []
    for k in range(count):
        use = f"toolu_{n}_{k}"
        out.append(node(f"a{n}.{k}", ASSISTANT, [tool_use(use, "Read", file_path=f"f{k}")]))
        out.append(node(f"r{n}.{k}", USER, [tool_result(use, "content " * 400)]))
    return out


@settings(max_examples=60, deadline=None)
@given(history=agent_histories(max_turns=4), compactions=st.integers(1, 6))
def test_the_newest_prompt_survives_any_number_of_compactions(
    history: list[Node], compactions: int
) -> None:
    """compact -> more tool rounds -> compact ...: the user's newest prompt stays in the
    view verbatim (quoted by the summary, or kept), and each summary request's input
    (the prompts of the compacted part) holds the prompts the previous summary quoted."""
    prompts = human_prompts(history)
    if not prompts or len(prompts[-1]) > 2_000:
        return
    newest = prompts[-1]
    view = [*history, *tool_rounds(0, 3)]
    for n in range(1, compactions + 1):
        try:
            plan = plan_compaction(session(), view, view, [], 1_000_000, None)
        except NothingToCompact:
            return
        carried, _ = quoted_prompts(view, plan)
        earlier = [q for node_ in view[:1] for q in human_prompts([node_])]
        if plan.kept_from > 0:
            assert all(q in carried for q in earlier)
        view = [*compact_once(view, n), *tool_rounds(n, 3)]
        assert newest in human_prompts(view)
