"""Cache breakpoints."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.context.cache import add_cache_breakpoints, cache_cold
from app.context.normalize import normalize_for_api, validate_api_messages
from app.context.types import ASSISTANT, CACHEABLE_BLOCK_TYPES, USER, ApiMessage
from tests.unit.strategies import histories, text, thinking, tool_result, tool_use

EPHEMERAL = {"type": "ephemeral"}
TOOLS: list[dict[str, Any]] = [
    {"name": "Read", "input_schema": {"type": "object"}},
    {"name": "Grep", "input_schema": {"type": "object"}},
]
SYSTEM = [text("You are helpful."), text("Project rules.")]


def marked(block: dict[str, Any], mark: dict[str, str] = EPHEMERAL) -> dict[str, Any]:
    return {**block, "cache_control": mark}


def loop() -> list[ApiMessage]:
    return [
        {"role": USER, "content": [text("go")]},
        {"role": ASSISTANT, "content": [tool_use("t1", "Read"), tool_use("t1b", "Grep")]},
        {"role": USER, "content": [tool_result("t1", "a"), tool_result("t1b", "b")]},
        {"role": ASSISTANT, "content": [thinking(), tool_use("t2", "Read")]},
        {"role": USER, "content": [tool_result("t2", "c")]},
    ]


def strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list | tuple):
        return [strip(v) for v in value]
    return value


def marks(system: Any, tools: Any, messages: Any) -> int:
    blocks = [*(system or []), *tools, *(b for m in messages for b in m["content"])]
    return sum("cache_control" in b for b in blocks)


def test_four_breakpoints_on_a_tool_loop() -> None:
    messages = loop()
    system, tools, out = add_cache_breakpoints(SYSTEM, TOOLS, messages)
    assert tools == [TOOLS[0], marked(TOOLS[1])]
    assert system == [SYSTEM[0], marked(SYSTEM[1])]
    assert out[4]["content"] == [marked(tool_result("t2", "c"))]
    assert out[2]["content"] == [tool_result("t1", "a"), marked(tool_result("t1b", "b"))]
    assert [out[i] is messages[i] for i in (0, 1, 3)] == [True, True, True]
    assert messages == loop()  # inputs unchanged
    assert validate_api_messages(out) == []


def test_prefill_marks_the_previous_user_message() -> None:
    messages = [
        {"role": USER, "content": [text("q")]},
        {"role": ASSISTANT, "content": [text("a")]},
        {"role": USER, "content": [text("q2")]},
        {"role": ASSISTANT, "content": [text("The answer is")]},
    ]
    _, _, out = add_cache_breakpoints(None, [], messages)
    assert out[3]["content"] == [marked(text("The answer is"))]
    assert out[2]["content"] == [marked(text("q2"))]
    assert out[0] is messages[0]


def test_thinking_at_the_end_passes_the_mark_to_an_earlier_block() -> None:
    messages = [
        {"role": USER, "content": [text("q")]},
        {
            "role": ASSISTANT,
            "content": [text("t"), thinking(), {"type": "redacted_thinking", "data": "x"}],
        },
    ]
    _, _, out = add_cache_breakpoints(None, [], messages)
    assert out[1]["content"][0] == marked(text("t"))
    assert "cache_control" not in out[1]["content"][1]
    only_thinking = [
        {"role": USER, "content": [text("q")]},
        {"role": ASSISTANT, "content": [thinking()]},
    ]
    _, _, out = add_cache_breakpoints(None, [], only_thinking)
    assert out[1] is only_thinking[1]
    assert out[0]["content"] == [marked(text("q"))]


def test_one_hour_ttl_string_system_and_stored_marks_replaced() -> None:
    hour = {"type": "ephemeral", "ttl": "1h"}
    stale = [{"role": USER, "content": [marked(text("old")), text("new")]}]
    tools = [marked(TOOLS[0]), TOOLS[1]]
    system, new_tools, out = add_cache_breakpoints("Be brief.", tools, stale, ttl="1h")
    assert system == [marked(text("Be brief."), hour)]
    assert new_tools == [TOOLS[0], marked(TOOLS[1], hour)]
    assert out[0]["content"] == [text("old"), marked(text("new"), hour)]
    assert stale[0]["content"][0] == marked(text("old"))
    assert tools[0] == marked(TOOLS[0])


def test_empty_inputs_and_bad_ttl() -> None:
    assert add_cache_breakpoints(None, [], []) == (None, [], [])
    with pytest.raises(ValueError, match="ttl"):
        add_cache_breakpoints(None, [], [], ttl="2h")


@given(histories(), st.sampled_from([None, "5m", "1h"]))
def test_normalised_messages_need_no_search_for_stored_marks(h: Any, ttl: str | None) -> None:
    """What normalize_for_api makes carries no mark: placing breakpoints without looking
    for one (`unmarked`) gives the same request, a stored mark on the rows or not."""
    marked_rows = [replace(node, content=[marked(block) for block in node.content]) for node in h]
    for view in (h, marked_rows):
        messages = normalize_for_api(view)
        assert add_cache_breakpoints(SYSTEM, TOOLS, messages, ttl=ttl, unmarked=True) == (
            add_cache_breakpoints(SYSTEM, TOOLS, messages, ttl=ttl)
        )


@given(histories(), st.booleans(), st.booleans(), st.sampled_from([None, "5m", "1h"]))
def test_at_most_four_marks_on_cacheable_blocks_inputs_untouched(
    h: Any, with_system: bool, with_tools: bool, ttl: str | None
) -> None:
    messages = normalize_for_api(h)
    system = copy.deepcopy(SYSTEM) if with_system else None
    tools = copy.deepcopy(TOOLS) if with_tools else []
    before = copy.deepcopy((system, tools, messages))
    new_system, new_tools, out = add_cache_breakpoints(system, tools, messages, ttl=ttl)
    assert (system, tools, messages) == before
    assert strip((new_system, new_tools, out)) == strip(before)
    count = marks(new_system, new_tools, out)
    assert count <= 4
    assert count == with_system + with_tools + (
        len({id(m) for m in out} - {id(m) for m in messages})
    )
    for m in out:
        for b in m["content"]:
            if "cache_control" in b:
                assert b["type"] in CACHEABLE_BLOCK_TYPES
    if out:
        assert validate_api_messages(out) == []
        last = out[-1]["content"]
        if any(b["type"] in CACHEABLE_BLOCK_TYPES for b in last):
            assert any("cache_control" in b for b in last)


def test_a_session_never_sent_is_cold() -> None:
    """Nothing of Parley's prefix is cached before its first request (an imported
    transcript's cache was the source's): compaction renders to text, micro clears."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert cache_cold(None, 300, now)
    assert not cache_cold(now - timedelta(seconds=10), 300, now)
    assert cache_cold(now - timedelta(seconds=301), 300, now)
    assert not cache_cold((now - timedelta(seconds=10)).replace(tzinfo=None), 300, now)
