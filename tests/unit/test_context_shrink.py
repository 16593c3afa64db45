"""Shrinking tool results to head and tail around a marker (the newest round kept
through a compaction): properties over generated rounds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.context.normalize import normalize_for_api, validate_api_messages
from app.context.shrink import MARKER_CHARS, MIN_RESULT_CHARS, shrink_results, shrink_text
from app.context.tokens import estimate_messages
from app.context.types import ASSISTANT, USER, Node
from tests.unit.strategies import IMAGE, node, text, tool_result, tool_use


def test_shrink_text_keeps_head_and_tail() -> None:
    body = "".join(chr(65 + i % 26) for i in range(10_000))
    cut = shrink_text(body, 1_000)
    head, _, _tail = cut.partition("\n[...")
    assert body.startswith(head)
    assert len(head) == 700
    assert cut.endswith(body[-300:])
    assert "9000 characters of this tool result were left out" in cut
    assert shrink_text("short", 1_000) == "short"


@st.composite
def rounds(draw: st.DrawFn) -> list[Node]:
    """A prompt, then one response with parallel calls and their results (strings,
    nested text blocks with an image, empty)."""
    calls = draw(st.integers(1, 4))
    uses = [tool_use(f"toolu_{k}", "Read", file_path=f"f{k}") for k in range(calls)]
    results = []
    for k in range(calls):
        size = draw(st.integers(0, 60_000))
        kind = draw(st.sampled_from(["str", "blocks"]))
        body = "x" * size
        content = body if kind == "str" else [text(body or "y"), IMAGE]
        results.append(tool_result(f"toolu_{k}", content))
    return [
        node("p", USER, [text("do it")]),
        node("a", ASSISTANT, [text("calling"), *uses]),
        node("r", USER, results),
    ]


@settings(max_examples=200, deadline=None)
@given(round_=rounds(), budget=st.integers(100, 30_000))
def test_shrunk_round_is_a_valid_request_that_fits(round_: list[Node], budget: int) -> None:
    out = shrink_results(round_, budget)
    assert [n.uuid for n in out] == [n.uuid for n in round_]
    assert out[0] is round_[0]
    assert out[1] is round_[1]
    assert validate_api_messages(normalize_for_api(out)) == []
    before = [b["tool_use_id"] for b in round_[2].content]
    assert [b["tool_use_id"] for b in out[2].content] == before
    total = estimate_messages(out)
    if estimate_messages(round_) <= budget:
        assert out[2] is round_[2]
        return
    assert total <= estimate_messages(round_)
    # Fits, unless every result is already down to the floor.
    floor = MIN_RESULT_CHARS + MARKER_CHARS
    texts = [
        b["content"] if isinstance(b["content"], str) else b["content"][0]["text"]
        for b in out[2].content
    ]
    assert total <= budget + 50 or all(len(t) <= floor for t in texts)
