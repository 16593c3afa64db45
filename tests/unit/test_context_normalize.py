"""normalize_for_api and validate_api_messages: exact outputs for the cases that break
real sessions, then properties over generated histories."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from app.context.blocks import is_model_visible
from app.context.normalize import (
    EMPTY_TOOL_RESULT,
    MergeMemo,
    missing_result,
    normalize_for_api,
    normalize_with_uuids,
    validate_api_messages,
)
from app.context.types import (
    API_ERROR,
    ASSISTANT,
    COMPACT_BOUNDARY,
    EARLIER_CONVERSATION_OMITTED,
    SYSTEM,
    USER,
    ApiMessage,
    Node,
)
from tests.unit.strategies import (
    agent_histories,
    histories,
    node,
    text,
    thinking,
    tool_result,
    tool_use,
)

OMITTED = {"role": USER, "content": [text(EARLIER_CONVERSATION_OMITTED)]}


def as_nodes(messages: Sequence[ApiMessage]) -> list[Node]:
    return [node(f"m{i}", m["role"], m["content"]) for i, m in enumerate(messages)]


def u(uuid: str, *blocks: dict[str, object], **kw: object) -> Node:
    return node(uuid, USER, list(blocks), **kw)


def a(uuid: str, *blocks: dict[str, object], **kw: object) -> Node:
    return node(uuid, ASSISTANT, list(blocks), **kw)


# --- examples ---------------------------------------------------------------------


def test_parallel_tool_calls_answered_across_rows_keep_stored_order() -> None:
    h = [
        u("u1", text("look")),
        a(
            "a1",
            text("reading"),
            tool_use("t1", "Read"),
            tool_use("t2", "Grep"),
            tool_use("t3", "Glob"),
        ),
        u("r1", tool_result("t2", "grep out")),
        u("r2", tool_result("t1", "file"), tool_result("t3", "globbed")),
    ]
    assert normalize_for_api(h) == [
        {"role": USER, "content": [text("look")]},
        {"role": ASSISTANT, "content": h[1].content},
        {
            "role": USER,
            "content": [
                tool_result("t2", "grep out"),
                tool_result("t1", "file"),
                tool_result("t3", "globbed"),
            ],
        },
    ]


def test_interrupted_run_gets_placeholders_before_the_users_text() -> None:
    h = [
        u("u1", text("go")),
        a("a1", tool_use("t1", "Bash"), tool_use("t2", "Read")),
        u("u2", text("stop, do something else")),
    ]
    assert normalize_for_api(h)[2] == {
        "role": USER,
        "content": [missing_result("t1"), missing_result("t2"), text("stop, do something else")],
    }


def test_partial_answer_keeps_stored_result_and_fills_the_gap() -> None:
    h = [
        u("u1", text("go")),
        a("a1", tool_use("t1", "Read"), tool_use("t2", "Read")),
        u("r", tool_result("t2", "two", is_error=True)),
    ]
    assert normalize_for_api(h)[2]["content"] == [
        tool_result("t2", "two", is_error=True),
        missing_result("t1"),
    ]


def test_orphan_and_duplicate_results_are_dropped() -> None:
    h = [
        u("u1", text("go")),
        a("a1", tool_use("t1", "Read")),
        u("r", tool_result("t1", "first"), tool_result("t1", "again"), tool_result("tx", "?")),
    ]
    assert normalize_for_api(h)[2] == {"role": USER, "content": [tool_result("t1", "first")]}


def test_result_answering_an_older_assistant_message_is_an_orphan() -> None:
    h = [
        u("u1", text("go")),
        a("a1", tool_use("t1", "Read")),
        u("r1", tool_result("t1", "ok")),
        a("a2", tool_use("t2", "Read")),
        u("r2", tool_result("t1", "late"), tool_result("t2", "ok2")),
    ]
    assert normalize_for_api(h)[4] == {"role": USER, "content": [tool_result("t2", "ok2")]}


def test_user_message_emptied_by_dropping_merges_its_neighbours() -> None:
    h = [
        u("u1", text("hi")),
        a("a1", text("one")),
        u("r", tool_result("ghost", "orphan")),
        a("a2", text("two"), tool_use("t1", "Read")),
        u("r2", tool_result("t1", "ok")),
    ]
    pairs = normalize_with_uuids(h)
    assert [m for m, _ in pairs] == [
        {"role": USER, "content": [text("hi")]},
        {"role": ASSISTANT, "content": [text("one"), text("two"), tool_use("t1", "Read")]},
        {"role": USER, "content": [tool_result("t1", "ok")]},
    ]
    assert [uuids for _, uuids in pairs] == [["u1"], ["a1", "a2"], ["r2"]]


def test_merge_puts_tool_results_first() -> None:
    h = [
        u("u1", text("go")),
        a("a1", tool_use("t1", "Read")),
        u("typed", text("also check b")),
        u("r", tool_result("t1", "ok"), text("note")),
    ]
    assert normalize_for_api(h)[2]["content"] == [
        tool_result("t1", "ok"),
        text("also check b"),
        text("note"),
    ]


def test_view_starting_with_assistant_gets_a_user_note_in_front() -> None:
    h = [a("a1", text("continuing")), u("u1", text("ok"))]
    assert normalize_with_uuids(h) == [
        (OMITTED, []),
        ({"role": ASSISTANT, "content": [text("continuing")]}, ["a1"]),
        ({"role": USER, "content": [text("ok")]}, ["u1"]),
    ]


def test_view_ending_on_open_tool_use_gets_placeholder_message() -> None:
    h = [u("u1", text("go")), a("a1", text("calling"), tool_use("t1", "lookup_order"))]
    assert normalize_with_uuids(h)[-1] == (
        {"role": USER, "content": [missing_result("t1")]},
        [],
    )


def test_internal_rows_empty_replies_and_blank_text_left_out() -> None:
    h = [
        u("u1", text("q"), text("   "), text("")),
        node("b", None, [], type=SYSTEM, subtype=COMPACT_BOUNDARY),
        a("err", text("API Error: overloaded"), subtype=API_ERROR),
        a("empty", text("")),
        a("empty2"),
        u("blank", text("\n")),
        a("a1", text("answer")),
    ]
    assert normalize_with_uuids(h) == [
        ({"role": USER, "content": [text("q")]}, ["u1"]),
        ({"role": ASSISTANT, "content": [text("answer")]}, ["a1"]),
    ]


def test_final_assistant_trailing_whitespace_is_stripped_only_at_the_end() -> None:
    h = [u("u1", text("q")), a("a1", text("one \n")), u("u2", text("q2")), a("a2", text("two  "))]
    out = normalize_for_api(h)
    assert out[1]["content"] == [text("one \n")]
    assert out[3]["content"] == [text("two")]
    assert h[3].content == [text("two  ")]


def test_final_assistant_message_sheds_its_thinking() -> None:
    """A chain ending in a reply with thinking (an imported transcript, say): the API
    refuses thinking in a final assistant message (with thinking off, and a prefill is
    not taken with thinking on), so it is left out; a reply of thinking alone goes."""
    signed = thinking("let me see", signature="sig")
    h = [u("u1", text("q")), a("a1", signed, text("answer"))]
    assert normalize_for_api(h) == [
        {"role": USER, "content": [text("q")]},
        {"role": ASSISTANT, "content": [text("answer")]},
    ]
    assert normalize_for_api([u("u1", text("q")), a("a1", signed)]) == [
        {"role": USER, "content": [text("q")]}
    ]
    # Not final: kept byte for byte.
    out = normalize_for_api([*h, u("u2", text("more"))])
    assert out[1]["content"][0] is signed
    problems = validate_api_messages(
        [{"role": USER, "content": [text("q")]}, {"role": ASSISTANT, "content": [signed]}]
    )
    assert any("cannot hold thinking" in p for p in problems)


def test_cache_control_removed_and_blocks_shared_otherwise() -> None:
    marked = text("q", cache_control={"type": "ephemeral"})
    sig = thinking("deep", "SIG")
    use = tool_use("t1", "Read", file_path="a")
    h = [u("u1", marked), a("a1", sig, use), u("r", tool_result("t1", "x"))]
    out = normalize_for_api(h)
    assert out[0]["content"] == [text("q")]
    assert "cache_control" in marked  # the stored block is untouched
    assert out[1]["content"][0] is sig
    assert out[1]["content"][1] is use


def test_blank_tool_result_content_gets_text() -> None:
    h = [
        u("u1", text("go")),
        a("a1", tool_use("t1", "Bash"), tool_use("t2", "Bash")),
        u("r", tool_result("t1", "", is_error=True), tool_result("t2", [text(" ")])),
    ]
    assert normalize_for_api(h)[2]["content"] == [
        tool_result("t1", EMPTY_TOOL_RESULT, is_error=True),
        tool_result("t2", EMPTY_TOOL_RESULT),
    ]


def test_reused_tool_use_id_is_dropped_from_the_later_message() -> None:
    h = [
        u("u1", text("go")),
        a("a1", tool_use("t1", "Read")),
        u("r1", tool_result("t1", "ok")),
        a("a2", text("again"), tool_use("t1", "Read")),
        u("r2", tool_result("t1", "second")),
    ]
    out = normalize_for_api(h)
    assert out[3:] == [{"role": ASSISTANT, "content": [text("again")]}]


def test_nothing_visible_gives_no_messages() -> None:
    h = [node("b", None, [], type=SYSTEM, subtype=COMPACT_BOUNDARY), a("e", text(" "))]
    assert normalize_for_api(h) == []


def test_string_content_is_accepted() -> None:
    h = [Node(uuid="u", type=USER, role=USER, content="hello")]  # type: ignore[arg-type]
    assert normalize_for_api(h) == [{"role": USER, "content": [text("hello")]}]


# --- validate_api_messages ----------------------------------------------------------


def test_validate_accepts_a_plain_exchange() -> None:
    assert validate_api_messages([{"role": USER, "content": "hi"}]) == []


def test_validate_finds_each_broken_rule() -> None:
    cases: list[tuple[list[ApiMessage], str]] = [
        ([], "at least one message"),
        ([{"role": ASSISTANT, "content": [text("x")]}], "first message"),
        (
            [{"role": USER, "content": [text("x")]}, {"role": USER, "content": [text("y")]}],
            "alternate",
        ),
        ([{"role": USER, "content": []}], "non-empty content"),
        ([{"role": USER, "content": [text("")]}], "must be non-empty"),
        ([{"role": USER, "content": [text(" \n")]}], "non-whitespace"),
        (
            [{"role": USER, "content": [text("q")]}, {"role": ASSISTANT, "content": [text("a ")]}],
            "trailing whitespace",
        ),
        ([{"role": USER, "content": [tool_result("t1")]}], "unexpected `tool_use_id`"),
        (
            [
                {"role": USER, "content": [text("q")]},
                {"role": ASSISTANT, "content": [tool_use("t1", "Read")]},
                {"role": USER, "content": [text("no answer")]},
            ],
            "without `tool_result`",
        ),
        (
            [
                {"role": USER, "content": [text("q")]},
                {"role": ASSISTANT, "content": [tool_use("t1", "Read")]},
                {"role": USER, "content": [text("first"), tool_result("t1")]},
            ],
            "must come first",
        ),
        (
            [
                {"role": USER, "content": [text("q")]},
                {"role": ASSISTANT, "content": [tool_use("t1", "Read")]},
                {"role": USER, "content": [tool_result("t1"), tool_result("t1")]},
            ],
            "duplicate tool_result",
        ),
        (
            [
                {"role": USER, "content": [text("q")]},
                {"role": ASSISTANT, "content": [tool_use("t1", "Read"), tool_use("t1", "Read")]},
                {"role": USER, "content": [tool_result("t1")]},
            ],
            "must be unique",
        ),
        (
            [
                {
                    "role": USER,
                    "content": [
                        text(str(i), cache_control={"type": "ephemeral"}) for i in range(5)
                    ],
                }
            ],
            "maximum of 4",
        ),
        (
            [
                {"role": USER, "content": [text("q")]},
                {"role": ASSISTANT, "content": [tool_use("t1", "Read")]},
                {"role": USER, "content": [tool_result("t1", "", is_error=True)]},
            ],
            "tool_result content is empty",
        ),
    ]
    for messages, expected in cases:
        problems = validate_api_messages(messages)
        assert any(expected in p for p in problems), (messages, problems)


def test_validate_allows_final_assistant_with_open_tool_use_and_empty_final() -> None:
    assert (
        validate_api_messages(
            [
                {"role": USER, "content": [text("q")]},
                {"role": ASSISTANT, "content": [tool_use("t", "X")]},
            ]
        )
        == []
    )
    assert (
        validate_api_messages([{"role": USER, "content": "q"}, {"role": ASSISTANT, "content": []}])
        == []
    )


# --- properties -------------------------------------------------------------------


def _only_results(n: Node) -> bool:
    return all(
        b.get("type") == "tool_result" or (b.get("type") == "text" and not b["text"].strip())
        for b in n.content
    )


@given(histories())
def test_output_is_always_valid(h: list[Node]) -> None:
    out = normalize_for_api(h)
    if out:
        assert validate_api_messages(out) == []
    else:  # only orphan results (or nothing) were visible
        assert all(_only_results(n) for n in h if is_model_visible(n) and n.role == USER)
        assert not any(is_model_visible(n) and n.role == ASSISTANT for n in h)


@given(histories())
def test_idempotent(h: list[Node]) -> None:
    once = normalize_for_api(h)
    assert normalize_for_api(as_nodes(once)) == once


@given(histories())
def test_inputs_not_mutated(h: list[Node]) -> None:
    before = copy.deepcopy(h)
    normalize_for_api(h)
    assert h == before


@given(histories())
def test_thinking_and_tool_use_blocks_pass_through_unaltered(h: list[Node]) -> None:
    # (a user turn after them: the final assistant message of a prefill sheds its thinking)
    out = normalize_for_api([*h, u("next", text("go on"))])
    sent = [b for m in out if m["role"] == ASSISTANT for b in m["content"]]
    seen: set[str] = set()
    expected = []
    for n in h:
        if n.role != ASSISTANT or not is_model_visible(n):
            continue
        for b in n.content:
            if b["type"] in ("thinking", "redacted_thinking"):
                expected.append(b)
            elif b["type"] == "tool_use" and b["id"] not in seen:
                seen.add(b["id"])
                expected.append(b)
    kept = [b for b in sent if b["type"] in ("thinking", "redacted_thinking", "tool_use")]
    assert len(kept) == len(expected)
    assert all(x is y for x, y in zip(kept, expected, strict=True))


@given(histories())
def test_every_non_blank_text_is_sent_in_order(h: list[Node]) -> None:
    stored = [
        b["text"].rstrip()
        for n in h
        if is_model_visible(n)
        for b in n.content
        if b["type"] == "text" and b["text"].strip()
    ]
    out = normalize_for_api(h)
    sent = [b["text"].rstrip() for m in out for b in m["content"] if b["type"] == "text"]
    if out and out[0] == OMITTED and (not stored or stored[0] != EARLIER_CONVERSATION_OMITTED):
        sent = sent[1:]
    assert sent == stored


@given(histories())
def test_placeholders_only_where_the_answer_held_no_result(h: list[Node]) -> None:
    by_uuid = {n.uuid: n for n in h}
    for message, uuids in normalize_with_uuids(h):
        if message["role"] != USER:
            continue
        stored = {
            b["tool_use_id"]
            for x in uuids
            for b in by_uuid[x].content
            if b["type"] == "tool_result"
        }
        for b in message["content"]:
            assert "cache_control" not in b
            if b.get("type") == "tool_result" and b == missing_result(b["tool_use_id"]):
                assert b["tool_use_id"] not in stored


@given(histories())
def test_uuids_follow_the_stored_order(h: list[Node]) -> None:
    pairs = normalize_with_uuids(h)
    assert [m for m, _ in pairs] == normalize_for_api(h)
    flat = [x for _, uuids in pairs for x in uuids]
    order = [n.uuid for n in h if is_model_visible(n)]
    positions = [order.index(x) for x in flat]
    assert positions == sorted(set(positions))


@given(agent_histories())
def test_requests_of_an_agent_loop_extend_each_other(h: list[Node]) -> None:
    """Each request of a healthy loop (made after a user row) is a prefix of every later
    one, so the prompt cache written by one turn is read by the next."""
    full = normalize_for_api(h)
    for k in range(1, len(h) + 1):
        if h[k - 1].role == USER:
            request = normalize_for_api(h[:k])
            assert full[: len(request)] == request


# --- the memo: normalising a view that extends the last one goes on from there ---------


@given(histories(max_size=30), histories(max_size=10), st.data())
def test_a_memo_changes_no_result(h: list[Node], other: list[Node], data: st.DataObject) -> None:
    """A conversation's views as turns add rows (each extending the last), then a
    branch that shares only a prefix, then the first view again: with one memo
    throughout, every result equals the one computed without, and no earlier result
    changes afterwards."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(h)), max_size=4)))
    branch_at = data.draw(st.integers(0, len(h)))
    views = [h[:cut] for cut in cuts] + [h, h[:branch_at] + other, h[: cuts[0] if cuts else 0], h]
    memo = MergeMemo()
    results = []
    for view in views:
        got = normalize_for_api(view, memo)
        assert got == normalize_for_api(view)
        results.append((got, copy.deepcopy(got)))
    for got, then in results:
        assert got == then, "a later call changed an earlier result"


@given(histories(max_size=40), st.data())
def test_a_memo_follows_a_conversation_row_by_row(h: list[Node], data: st.DataObject) -> None:
    """Every view of a growing conversation (one to three rows more each turn), with
    one memo throughout: each result equals the one computed without, so the merged,
    paired and rendered tail the memo carries over is exactly what a fresh pass makes."""
    memo = MergeMemo()
    cut = 0
    while cut < len(h):
        cut = min(len(h), cut + data.draw(st.integers(1, 3)))
        assert normalize_for_api(h[:cut], memo) == normalize_for_api(h[:cut])


@given(histories(max_size=30))
def test_a_memo_is_resumed_only_by_a_view_that_extends_it(h: list[Node]) -> None:
    memo = MergeMemo()
    normalize_for_api(h, memo)
    assert memo.resumes([*h, node("new", USER, [text("more")])]) == bool(h)
    if h:
        replaced = [node(h[0].uuid, h[0].role or USER, h[0].content), *h[1:]]
        assert not memo.resumes(replaced), "same uuid, another row object: from the start"
        assert not memo.resumes(h[:-1])


def test_a_memo_resumed_after_rows_that_merged_or_were_trimmed() -> None:
    """A final reply trimmed as a prefill, and replies merged around an emptied user
    message: neither changes what the memo keeps for the next turn."""
    trimmed = [u("u1", text("hi")), a("a1", text("one "))]
    merged = [
        u("u1", text("hi")),
        a("a1", text("one")),
        u("r", tool_result("ghost", "orphan")),
        a("a2", text("two"), thinking()),
        u("r2", tool_result("ghost", "orphan")),
        a("a3", text("three")),
    ]
    for view in (trimmed, merged):
        memo = MergeMemo()
        assert normalize_for_api(view, memo) == normalize_for_api(view)
        longer = [*view, u("u2", text("next")), a("a9", text("nine"))]
        assert normalize_for_api(longer, memo) == normalize_for_api(longer)
        assert memo.nodes == tuple(longer)
