"""Block helpers and token estimates."""

from __future__ import annotations

import dataclasses

import pytest

from app.context import tokens
from app.context.blocks import (
    as_blocks,
    has_tool_result,
    is_clean_user_turn,
    is_model_visible,
    preview,
    result_text,
    tool_result_ids,
    tool_use_ids,
)
from app.context.tokens import (
    BLOCK_OVERHEAD_TOKENS,
    MEDIA_TOKENS,
    TOOL_ID_TOKENS,
    estimate_content,
    estimate_messages,
    estimate_system,
    estimate_tools,
)
from app.context.types import (
    ASSISTANT,
    COLLAPSED,
    COMPACT_BOUNDARY,
    COMPACT_SUMMARY,
    SYSTEM,
    USER,
    Node,
)
from tests.unit.strategies import IMAGE, node, text, thinking, tool_result, tool_use


def test_ids_and_results() -> None:
    content = [text("a"), tool_use("t1", "Read"), tool_use("t2", "Grep"), tool_result("t0")]
    assert tool_use_ids(content) == ["t1", "t2"]
    assert tool_result_ids(content) == ["t0"]
    assert has_tool_result(content)
    assert tool_use_ids("plain") == []
    assert not has_tool_result("plain")


def test_as_blocks() -> None:
    assert as_blocks("hi") == [text("hi")]
    assert as_blocks("") == []
    assert as_blocks(None) == []
    blocks = [text("x")]
    assert as_blocks(blocks) is blocks


@pytest.mark.parametrize(
    ("row", "clean"),
    [
        (node("u", USER, [text("do it")]), True),
        (node("u", USER, [IMAGE]), True),
        (node("u", USER, [text("  ")]), False),
        (node("u", USER, [tool_result("t"), text("and")]), False),
        (node("u", USER, [text("m")], is_meta=True), False),
        (node("u", USER, [text("s")], subtype=COMPACT_SUMMARY), False),
        (node("u", USER, [text("s")], subtype=COLLAPSED), False),
        (node("u", USER, [text("file")], type="attachment"), False),
        (node("a", ASSISTANT, [text("hi")]), False),
    ],
)
def test_is_clean_user_turn(row: Node, clean: bool) -> None:
    assert is_clean_user_turn(row) is clean


def test_is_model_visible() -> None:
    assert is_model_visible(node("u", USER, [text("x")]))
    assert not is_model_visible(node("a", ASSISTANT, [text(" ")]))
    assert not is_model_visible(node("a", ASSISTANT, [text("e")], subtype="api_error"))
    assert not is_model_visible(node("b", None, [], type=SYSTEM, subtype=COMPACT_BOUNDARY))


def test_result_text_and_preview() -> None:
    assert result_text(tool_result("t", "out")) == "out"
    assert result_text(tool_result("t", [text("a"), IMAGE, text("b")])) == "a\n[image]\nb"
    assert result_text({"type": "tool_result", "tool_use_id": "t"}) == ""
    content = [thinking("hidden"), text("Let me  look\n at it"), tool_use("t", "Read"), IMAGE]
    assert preview(content) == "Let me look at it [tool: Read] [image]"
    assert preview([tool_result("t", "line1\nline2")]) == "[result] line1 line2"
    long = preview("word " * 100, limit=20)
    assert long == "word word word word…"
    assert len(long) <= 20


def test_estimates() -> None:
    assert estimate_content("") == 0
    assert estimate_content("x" * 28) == 10 + BLOCK_OVERHEAD_TOKENS
    assert estimate_content([text("x" * 28)]) == 10 + BLOCK_OVERHEAD_TOKENS
    assert estimate_content([IMAGE]) == MEDIA_TOKENS + BLOCK_OVERHEAD_TOKENS
    nested = estimate_content([tool_result("t", [text("x" * 28), IMAGE])])
    assert nested == TOOL_ID_TOKENS + 10 + MEDIA_TOKENS + 3 * BLOCK_OVERHEAD_TOKENS
    assert estimate_content([thinking("x" * 280)]) == 100 + BLOCK_OVERHEAD_TOKENS
    use = estimate_content([tool_use("t", "Read", file_path="a.py")])
    chars = len("Read") + len('{"file_path":"a.py"}')
    assert use == TOOL_ID_TOKENS + -(-chars // 2.8) + BLOCK_OVERHEAD_TOKENS
    assert estimate_system(None) == 0
    assert estimate_system("x" * 28) == estimate_system([text("x" * 28)]) - BLOCK_OVERHEAD_TOKENS
    assert estimate_tools([]) == 0
    assert estimate_tools([{"name": "Read"}]) > 0


def test_estimate_messages_prefers_the_stored_figure() -> None:
    stored = Node(uuid="a", type=USER, role=USER, content=[text("x" * 280)], token_estimate=7)
    fresh = Node(uuid="b", type=USER, role=USER, content=[text("x" * 280)])
    assert estimate_messages([stored, fresh]) == 7 + 100 + BLOCK_OVERHEAD_TOKENS


def test_chars_per_token_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "CHARS_PER_TOKEN", 4.0)
    assert estimate_content("x" * 40) == 10 + BLOCK_OVERHEAD_TOKENS


def test_with_content_carries_every_other_field() -> None:
    values = {f.name: f"v-{f.name}" for f in dataclasses.fields(Node)}
    original = Node(**values)  # type: ignore[arg-type]
    copy = original.with_content([text("new")], 42)
    for f in dataclasses.fields(Node):
        expected = {"content": [text("new")], "token_estimate": 42}.get(f.name, values[f.name])
        assert getattr(copy, f.name) == expected, f.name
