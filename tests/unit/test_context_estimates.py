"""The anchoring rule of token estimates: a reply's usage counts only for the prefix it
measured (Parley's own replies, which record their request's estimate); copies behind a
compact boundary and imported rows never anchor; a projection since the reply is taken
off the anchor by the change of the prefix's estimate."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.context.estimates import (
    REQUEST_ESTIMATE,
    TokenMemo,
    anchored_estimate,
    prefill_thinking,
    prefix_sent,
    request_estimate,
    view_estimate,
    without_anchor,
)
from app.context.micro import apply_micro, plan_micro
from app.context.session import CompactionConfig, SessionConfig
from app.context.tokens import node_tokens
from app.context.tools import COMPACTABLE_BUILTINS
from app.context.types import ASSISTANT, USER, Node
from tests.unit.strategies import agent_histories, node, text, tool_result, tool_use


def config(model: str = "claude-sonnet-4-5", system: str = "be brief") -> SessionConfig:
    return SessionConfig(
        model=model,
        system=system,
        tools=[],
        builtin_tools=[],
        max_tokens=None,
        thinking=None,
        compaction=CompactionConfig(
            auto=True,
            threshold_tokens=None,
            context_window=None,
            keep_recent_tool_results=5,
            micro_batch_tokens=20_000,
            micro=True,
            collapse_at=0.9,
        ),
    )


def reply(uuid: str, words: str, *, usage: dict[str, int], meta: dict[str, Any] | None) -> Node:
    return node(uuid, ASSISTANT, [text(words)], usage=usage, meta=meta, type=ASSISTANT)


def measured(cfg: SessionConfig, before: list[Node], uuid: str, real: int, out: int = 7) -> Node:
    """A reply Parley stored after sending `before` (it records that request's estimate)."""
    return reply(
        uuid,
        "an answer",
        usage={"input_tokens": real, "output_tokens": out},
        meta={REQUEST_ESTIMATE: request_estimate(cfg, before)},
    )


def test_no_reply_means_the_content_estimate() -> None:
    cfg = config()
    nodes = [node("u1", USER, [text("hello " * 40)], type=USER)]
    assert anchored_estimate(cfg, nodes) == view_estimate(cfg, nodes)


def test_a_parley_reply_anchors_its_prefix() -> None:
    cfg = config()
    first = [node("u1", USER, [text("hello " * 40)], type=USER)]
    answered = [*first, measured(cfg, first, "a1", real=1_000, out=12)]
    later = node("u2", USER, [text("and then?")], type=USER)
    assert anchored_estimate(cfg, answered) == 1_012
    assert anchored_estimate(cfg, [*answered, later]) == 1_012 + node_tokens(later)


def test_imported_and_copied_replies_never_anchor() -> None:
    """Claude Code's usage (its own system prompt and tools) and a copy's usage (the
    whole view before the compaction) say nothing of Parley's request."""
    cfg = config()
    first = [node("u1", USER, [text("hello " * 40)], type=USER)]
    usage = {"input_tokens": 90_000, "output_tokens": 12}
    imported = reply("a1", "an answer", usage=usage, meta={"source_uuid": "x"})
    assert anchored_estimate(cfg, [*first, imported]) == view_estimate(cfg, [*first, imported])
    original = measured(cfg, first, "a1", real=90_000)
    copy = _with_meta(original, without_anchor(original.meta))
    assert copy.meta == {}
    summary = node("s", USER, [text("summary of what came before")], type=USER)
    assert anchored_estimate(cfg, [summary, copy]) == view_estimate(cfg, [summary, copy])


def _with_meta(n: Node, meta: dict[str, Any] | None) -> Node:
    return dataclasses.replace(n, meta=meta)


def test_the_estimate_right_after_a_compaction_is_the_new_view() -> None:
    """The copies keep their usage (130k) but it no longer anchors: the estimate is the
    new view's, not the pre-compaction figure."""
    cfg = config()
    history = [node(f"u{i}", USER, [text("x" * 3_000)], type=USER) for i in range(30)]
    answered = measured(cfg, history, "a", real=130_882)
    assert anchored_estimate(cfg, [*history, answered]) == 130_882 + 7
    summary = node("s", USER, [text("the summary")], type=USER)
    copy = _with_meta(answered, without_anchor(answered.meta))
    after = anchored_estimate(cfg, [summary, copy])
    assert after == view_estimate(cfg, [summary, copy])
    assert after < 100


def test_a_projection_since_the_reply_is_taken_off_the_anchor() -> None:
    """Micro-compaction after the last reply: the estimate drops by what it freed (and
    when it cleared most of what the reply measured, the view is estimated instead)."""
    cfg = config()
    nodes: list[Node] = [node("u0", USER, [text("read them all")], type=USER)]
    for i in range(8):
        use = f"toolu_{i}"
        nodes.append(
            node(f"a{i}", ASSISTANT, [tool_use(use, "Read", file_path=f"f{i}")], type=ASSISTANT)
        )
        nodes.append(node(f"r{i}", USER, [tool_result(use, "y" * 4_000)], type=USER))
    answered = [*nodes, measured(cfg, nodes, "final", real=12_345)]
    before = anchored_estimate(cfg, answered)
    plan = plan_micro(
        answered,
        watermark=None,
        compactable=COMPACTABLE_BUILTINS,
        keep_recent=5,
        batch_tokens=0,
        cache_cold=False,
    )
    assert plan is not None
    projected = apply_micro(answered, plan.watermark, COMPACTABLE_BUILTINS)
    assert anchored_estimate(cfg, projected) == before - plan.tokens_freed
    most = apply_micro(answered, len(answered) - 3, COMPACTABLE_BUILTINS)
    assert anchored_estimate(cfg, most) == view_estimate(cfg, most)


def test_a_changed_system_prompt_changes_the_figure() -> None:
    cfg = config(system="short")
    first = [node("u1", USER, [text("hello")], type=USER)]
    answered = [*first, measured(cfg, first, "a1", real=500)]
    longer = config(system="a much longer system prompt " * 50)
    grown = request_estimate(longer, first) - request_estimate(cfg, first)
    assert anchored_estimate(longer, answered) == 507 + grown


def test_an_anchor_that_measured_little_of_the_view_is_not_used() -> None:
    """When most of what the reply measured is gone, the view is estimated instead."""
    cfg = config()
    big = [node(f"u{i}", USER, [text("z" * 3_000)], type=USER) for i in range(10)]
    answered = measured(cfg, big, "a", real=11_000)
    small = [big[0], answered]  # nine of ten prompts snipped since
    assert anchored_estimate(cfg, small) == view_estimate(cfg, small)


@settings(max_examples=200, deadline=None)
@given(history=agent_histories(), real=st.integers(1, 500_000), cut=st.integers(0, 100))
def test_anchored_on_the_unchanged_prefix_is_exact(
    history: list[Node], real: int, cut: int
) -> None:
    """For every history: a reply recorded on its exact prefix anchors at its usage,
    plus the content estimates of what came after it; the same reply as a copy (no
    record) gives the content estimate of the whole view."""
    cfg = config()
    index = cut % (len(history) + 1)
    prefix, rest = history[:index], history[index:]
    if prefix and prefix[-1].role == ASSISTANT:
        return  # no request ends with a reply (the loop sends after a user message)
    answer = measured(cfg, prefix, "answer", real=real, out=3)
    view = [*prefix, answer, *rest]
    # (a final reply's thinking is not sent: a prefill goes without it)
    after = sum(node_tokens(n) for n in rest) - prefill_thinking(rest)
    assert anchored_estimate(cfg, view) == real + 3 + after
    copied = [*prefix, _with_meta(answer, without_anchor(answer.meta)), *rest]
    assert anchored_estimate(cfg, copied) == view_estimate(cfg, copied)


def test_a_final_replys_thinking_is_not_counted() -> None:
    """It is not sent (GET /context/request sends that reply as a prefill without it)."""
    cfg = config()
    prompt = node("u1", USER, [text("hello")], type=USER)
    signed = {"type": "thinking", "thinking": "ponder " * 100, "signature": "s"}
    final = node("a1", ASSISTANT, [signed, text("hi")], type=ASSISTANT)
    assert view_estimate(cfg, [prompt, final]) == view_estimate(
        cfg, [prompt, node("a1", ASSISTANT, [text("hi")], type=ASSISTANT)]
    )
    calling = node("a2", ASSISTANT, [signed, tool_use("t", "Read", file_path="f")])
    assert prefill_thinking([prompt, calling]) == 0


def test_the_new_tokenizer_factor_scales_only_what_is_estimated() -> None:
    cfg = config(model="claude-sonnet-5-5")
    first = [node("u1", USER, [text("hello " * 40)], type=USER)]
    later = node("u2", USER, [text("more " * 100)], type=USER)
    view = [*first, measured(cfg, first, "a1", real=1_000, out=10), later]
    assert anchored_estimate(cfg, view) == int(1_010 + 1.3 * node_tokens(later))


def test_prefix_sent_only_when_a_reply_measured_the_view() -> None:
    """The summary request reuses the prompt cache only for a view Parley has sent:
    not an imported one, not the one a compaction just left."""
    cfg = config()
    first = [node("u1", USER, [text("hello " * 40)], type=USER)]
    sent = [*first, measured(cfg, first, "a1", real=1_000)]
    assert prefix_sent(cfg, sent)
    usage = {"input_tokens": 90_000, "output_tokens": 12}
    imported = [*first, reply("a1", "answer", usage=usage, meta={"source_uuid": "x"})]
    assert not prefix_sent(cfg, imported)
    copied = [first[0], _with_meta(sent[1], without_anchor(sent[1].meta))]
    assert not prefix_sent(cfg, copied)


@given(history=agent_histories(), other=agent_histories(), data=st.data())
def test_a_memo_changes_no_estimate(
    history: list[Node], other: list[Node], data: st.DataObject
) -> None:
    """A conversation's views as turns add rows (a reply measuring each request, as the
    loop stores them), the same view twice, then a branch sharing only a prefix and
    the first view again: with one memo throughout, every figure equals the one
    computed without."""
    cfg = config()
    views: list[list[Node]] = []
    view: list[Node] = []
    for i, row in enumerate(history):
        view = [*view, row]
        if row.role != ASSISTANT and data.draw(st.booleans()):
            real = data.draw(st.integers(1, 500_000))
            view = [*view, measured(cfg, view, f"reply-{i}", real=real)]
        views.append(view)
    branch_at = data.draw(st.integers(0, len(view)))
    views += [view, view[:branch_at] + other, views[0] if views else [], view]
    memo = TokenMemo()
    for each in views:
        assert request_estimate(cfg, each, memo) == request_estimate(cfg, each)
        assert anchored_estimate(cfg, each, memo) == anchored_estimate(cfg, each)
