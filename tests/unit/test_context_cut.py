"""Cut points: examples, then properties checked against a brute-force oracle."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.context.blocks import is_clean_user_turn, is_model_visible
from app.context.cut import Cut, api_rounds, cut_kinds, find_cut, is_valid_cut
from app.context.normalize import normalize_for_api, validate_api_messages
from app.context.tokens import estimate_messages
from app.context.types import ASSISTANT, COMPACT_BOUNDARY, COMPACT_SUMMARY, SYSTEM, USER, Node
from tests.unit.strategies import agent_histories, histories, node, text, tool_result, tool_use

SUMMARY = node("summary", USER, [text("summary of the compacted part")], subtype=COMPACT_SUMMARY)


def u(uuid: str, *blocks: dict[str, object], **kw: object) -> Node:
    return node(uuid, USER, list(blocks), **kw)


def a(uuid: str, *blocks: dict[str, object], **kw: object) -> Node:
    return node(uuid, ASSISTANT, list(blocks), **kw)


def splits_pair(nodes: list[Node], index: int) -> bool:
    """Oracle: some tool_use before index has a tool_result at or after it."""
    before = {
        b["id"]
        for n in nodes[:index]
        if n.role == ASSISTANT and is_model_visible(n)
        for b in n.content
        if b["type"] == "tool_use"
    }
    return any(
        b["tool_use_id"] in before
        for n in nodes[index:]
        if n.role == USER and is_model_visible(n)
        for b in n.content
        if b["type"] == "tool_result"
    )


def tool_loop(prefix: str, rounds: int, size: int = 300) -> list[Node]:
    """One assistant call and its result per round."""
    out: list[Node] = []
    for r in range(rounds):
        use = f"{prefix}t{r}"
        out.append(a(f"{prefix}a{r}", tool_use(use, "Read", file_path="x")))
        out.append(u(f"{prefix}r{r}", tool_result(use, "x" * size)))
    return out


# --- examples ---------------------------------------------------------------------


def test_long_tool_loop_falls_back_to_an_api_round_boundary() -> None:
    h = [u("q", text("fix the bug")), *tool_loop("", 10)]
    per_round = h[1].token_estimate + h[2].token_estimate
    cut = find_cut(h, keep_tokens=3 * per_round)
    assert cut == Cut(index=len(h) - 6, clean=False)
    assert h[cut.index].role == ASSISTANT


def test_clean_turn_preferred_when_it_keeps_enough() -> None:
    h = [u("q1", text("first")), *tool_loop("a", 6), u("q2", text("second")), *tool_loop("b", 2)]
    q2 = 13
    assert h[q2].uuid == "q2"
    kept = estimate_messages(h[q2:])
    assert find_cut(h, keep_tokens=kept) == Cut(index=q2, clean=True)
    # With room for one more round the round cut keeps more, but the clean turn still
    # keeps more than half of it: clean wins.
    assert find_cut(h, keep_tokens=kept + estimate_messages(h[q2 - 2 : q2])) == Cut(q2, True)


def test_clean_turn_that_keeps_too_little_loses_to_a_round_cut() -> None:
    h = [u("q1", text("first")), *tool_loop("a", 10), u("q2", text("latest"))]
    keep = estimate_messages(h[-7:])
    assert find_cut(h, keep) == Cut(index=len(h) - 7, clean=False)
    assert find_cut(h, keep, min_clean_share=0) == Cut(index=len(h) - 1, clean=True)


def test_cut_never_between_parallel_calls_and_their_results() -> None:
    h = [
        u("q", text("go")),
        a("a1", tool_use("t1", "Read"), tool_use("t2", "Read")),
        u("r1", tool_result("t1", "x" * 3000)),
        u("typed", text("and also this")),
        u("r2", tool_result("t2", "y" * 3000)),
        a("a2", text("done")),
    ]
    for i in (2, 3, 4):
        assert not is_valid_cut(h, i)
    assert find_cut(h, keep_tokens=estimate_messages(h[3:])) == Cut(index=5, clean=False)


def test_total_cut_when_complete_and_none_when_open() -> None:
    h = [u("q", text("go")), a("a1", text("done"))]
    assert find_cut(h, keep_tokens=0) == Cut(index=2, clean=False)
    open_end = [u("q", text("go")), a("a1", tool_use("t1", "Read"))]
    assert not is_valid_cut(open_end, 2)
    assert find_cut(open_end, keep_tokens=0) is None


def test_open_tool_call_at_the_end_is_kept_by_a_round_cut() -> None:
    h = [u("q", text("go")), *tool_loop("", 3), a("last", tool_use("tz", "lookup_order"))]
    assert find_cut(h, keep_tokens=h[-1].token_estimate) == Cut(index=len(h) - 1, clean=False)


def test_nothing_to_compact_gives_none() -> None:
    assert find_cut([u("q", text("only"))], keep_tokens=0) is None
    assert find_cut([], keep_tokens=100) is None


def test_internal_rows_do_not_count_and_are_not_cut_targets() -> None:
    h = [
        u("q", text("go")),
        a("a1", text("ok")),
        node("b", None, [], type=SYSTEM, subtype=COMPACT_BOUNDARY),
        a("err", text("API Error"), subtype="api_error"),
        a("a2", text("more")),
    ]
    assert not is_valid_cut(h, 2)
    assert not is_valid_cut(h, 3)
    assert not is_valid_cut(h, 4)  # merges with a1 into one message
    assert [is_valid_cut(h, i) for i in range(len(h) + 1)] == [
        True,
        True,
        False,
        False,
        False,
        True,
    ]


def test_api_rounds_example() -> None:
    h = [
        u("q", text("go")),
        a("a1", tool_use("t1", "Read")),
        u("r1", tool_result("t1")),
        a("a2", tool_use("t2", "Read")),
        u("r2", tool_result("t2")),
        node("b", None, [], type=SYSTEM, subtype=COMPACT_BOUNDARY),
        a("a3", text("done")),
        u("q2", text("next")),
        a("a4", text("ok")),
    ]
    assert api_rounds(h) == [(0, 2), (3, 5), (6, 6), (7, 8)]


# --- properties -------------------------------------------------------------------


@given(histories())
def test_is_valid_cut_matches_cut_kinds_and_oracle(h: list[Node]) -> None:
    kinds = cut_kinds(h)
    for i in range(len(h) + 1):
        valid = is_valid_cut(h, i)
        assert valid == (kinds[i] is not None)
        if valid:
            assert not splits_pair(h, i)
            if i < len(h):
                assert kinds[i] == is_clean_user_turn(h[i])
                assert is_clean_user_turn(h[i]) or h[i].role == ASSISTANT


@given(histories(), st.integers(0, 20_000))
def test_find_cut_is_valid_within_budget_and_sendable(h: list[Node], keep: int) -> None:
    cut = find_cut(h, keep)
    if cut is None:
        return
    i = cut.index
    assert is_valid_cut(h, i)
    assert not splits_pair(h, i)
    assert sum(is_model_visible(n) for n in h[:i]) >= 2
    if i < len(h):
        assert estimate_messages(h[i:]) <= keep
        assert cut.clean == is_clean_user_turn(h[i])
    else:
        assert not cut.clean
    kept = normalize_for_api([SUMMARY, *h[i:]])
    assert validate_api_messages(kept) == []
    compacted = normalize_for_api(h[:i])
    assert compacted == [] or validate_api_messages(compacted) == []


@given(histories(), st.integers(0, 20_000))
def test_find_cut_keeps_as_much_as_its_kind_allows(h: list[Node], keep: int) -> None:
    """With min_clean_share=0: the earliest fitting clean cut, else the earliest fitting
    round cut (the total cut last)."""
    cut = find_cut(h, keep, min_clean_share=0)
    fitting = [
        i
        for i in range(len(h) + 1)
        if is_valid_cut(h, i)
        and sum(is_model_visible(n) for n in h[:i]) >= 2
        and estimate_messages(h[i:]) <= keep
    ]
    clean = [i for i in fitting if i < len(h) and is_clean_user_turn(h[i])]
    rounds = [i for i in fitting if i not in clean]
    if clean:
        assert cut == Cut(clean[0], True)
    elif rounds:
        assert cut == Cut(rounds[0], False)
    else:
        assert cut is None


@given(histories())
def test_api_rounds_partition_at_valid_cuts(h: list[Node]) -> None:
    rounds = api_rounds(h)
    assert [i for s, e in rounds for i in range(s, e + 1)] == list(range(len(h)))
    for start, _ in rounds[1:]:
        assert is_valid_cut(h, start)
        dropped = normalize_for_api(h[start:])
        assert dropped == [] or validate_api_messages(dropped) == []


@given(agent_histories())
def test_each_round_of_a_healthy_session_holds_one_response(h: list[Node]) -> None:
    for start, end in api_rounds(h):
        responses = [n for n in h[start : end + 1] if n.role == ASSISTANT]
        assert len(responses) == 1
