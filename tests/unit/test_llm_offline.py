"""OfflineModel: the documented commands, tool rounds, summaries, limits, determinism."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.engine.llm.client import ModelClient
from app.engine.llm.events import (
    MessageDone,
    MessageStart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseReady,
)
from app.engine.llm.offline import SUMMARY_HEADINGS, OfflineModel, summary_marker

TOOLS = [
    {"name": "Read", "input_schema": {"type": "object"}},
    {"name": "Glob", "input_schema": {"type": "object"}},
]


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 2048, "messages": list(messages), **extra}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


async def run(request: dict[str, Any]) -> list[StreamEvent]:
    return [event async for event in OfflineModel().stream(request)]


def done_of(events: list[StreamEvent]) -> MessageDone:
    done = events[-1]
    assert isinstance(done, MessageDone)
    return done


def text_of(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_plain_reply_echoes_in_several_deltas() -> None:
    request = body(user("Hello there, offline model. How are you today?"))
    events = await run(request)
    start = events[0]
    assert isinstance(start, MessageStart)
    assert start.model == "parley-offline"
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 3
    expected = (
        "Offline model (not a language model). "
        "You said: Hello there, offline model. How are you today?"
    )
    assert text_of(events) == expected
    done = done_of(events)
    assert done.content == [{"type": "text", "text": expected}]
    assert done.stop_reason == "end_turn"
    canonical = json.dumps(request, ensure_ascii=False, sort_keys=True)
    assert done.usage["input_tokens"] == len(canonical) // 4
    assert done.usage["output_tokens"] == -(-len(expected) // 4)
    assert done.usage["cache_read_input_tokens"] == 0
    assert done.message_id.startswith("msg_")
    assert isinstance(OfflineModel(), ModelClient)


async def test_text_blocks_and_command_lines_in_the_echo() -> None:
    request = body(
        user([{"type": "text", "text": "first"}, {"type": "text", "text": "/long x\nsecond"}])
    )
    assert text_of(await run(request)).endswith("You said: first\n/long x\nsecond")
    only_commands = body(user("/think"))
    assert text_of(await run(only_commands)).endswith("You sent no text.")


async def test_tool_lines_make_parallel_tool_uses_and_unknown_tools_are_ignored() -> None:
    prompt = "\n".join(
        [
            "Look around.",
            '/tool Read {"file_path": "a.txt"}',
            "/tool Nope {}",
            '/tool Glob {"pattern": "*.py"}',
        ]
    )
    events = await run(body(user(prompt), tools=TOOLS))
    ready = [e for e in events if isinstance(e, ToolUseReady)]
    assert [(e.block["name"], e.block["input"]) for e in ready] == [
        ("Read", {"file_path": "a.txt"}),
        ("Glob", {"pattern": "*.py"}),
    ]
    done = done_of(events)
    assert done.stop_reason == "tool_use"
    assert done.content == [e.block for e in ready]
    ids = [b["id"] for b in done.content]
    assert len(set(ids)) == 2
    assert all(i.startswith("toolu_") for i in ids)
    assert all(b["type"] == "tool_use" for b in done.content)


async def test_tool_without_input_and_with_bad_input() -> None:
    events = await run(body(user("/tool Read\n/tool Glob [1, 2]"), tools=TOOLS))
    done = done_of(events)
    assert [(b["name"], b["input"]) for b in done.content] == [("Read", {})]


async def test_only_unknown_tools_gives_text_saying_why() -> None:
    events = await run(body(user("/tool Bash {}"), tools=TOOLS))
    done = done_of(events)
    assert done.stop_reason == "end_turn"
    assert "Ignored: /tool Bash: no such tool in this request" in done.content[0]["text"]
    no_tools = await run(body(user("/tool Read {}")))
    assert done_of(no_tools).stop_reason == "end_turn"


async def test_reply_after_tool_results_summarises_them() -> None:
    first = body(user('/tool Read {"file_path": "a.txt"}\n/tool Glob {}'), tools=TOOLS)
    calls = done_of(await run(first)).content
    read_id, glob_id = calls[0]["id"], calls[1]["id"]
    results = user(
        [
            {
                "type": "tool_result",
                "tool_use_id": read_id,
                "content": "line one\nline two\nline three",
            },
            {
                "type": "tool_result",
                "tool_use_id": glob_id,
                "is_error": True,
                "content": [{"type": "text", "text": "bad pattern\nmore"}],
            },
        ]
    )
    events = await run({**first, "messages": [*first["messages"], assistant(calls), results]})
    done = done_of(events)
    assert done.stop_reason == "end_turn"
    text = done.content[0]["text"]
    assert "Tool Read returned 3 lines." in text
    assert 'First line: "line one"' in text
    assert "Tool Glob failed: bad pattern" in text
    assert not any(isinstance(e, ToolUseReady) for e in events)


async def test_think_adds_a_signed_thinking_block_only_when_enabled() -> None:
    enabled = body(user("/think\nWhy?"), thinking={"type": "enabled", "budget_tokens": 1024})
    events = await run(enabled)
    assert any(isinstance(e, ThinkingDelta) for e in events)
    first = done_of(events).content[0]
    assert first["type"] == "thinking"
    assert first["thinking"]
    assert first["signature"]
    disabled = await run(body(user("/think\nWhy?")))
    assert [b["type"] for b in done_of(disabled).content] == ["text"]


async def test_think_also_starts_the_reply_after_tool_results() -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    first = body(user("/think\n/tool Read {}"), tools=TOOLS, thinking=thinking)
    content = done_of(await run(first)).content
    assert [b["type"] for b in content] == ["thinking", "tool_use"]
    results = user([{"type": "tool_result", "tool_use_id": content[1]["id"], "content": "x"}])
    after = await run({**first, "messages": [*first["messages"], assistant(content), results]})
    assert [b["type"] for b in done_of(after).content] == ["thinking", "text"]


async def test_long_reply_and_max_tokens_stop() -> None:
    short = done_of(await run(body(user("/long 50"))))
    assert short.stop_reason == "end_turn"
    assert len(short.content[0]["text"]) == 200
    assert short.usage["output_tokens"] == 50
    cut = done_of(await run(body(user("/long 300"), max_tokens=100)))
    assert cut.stop_reason == "max_tokens"
    assert len(cut.content[0]["text"]) == 400
    assert cut.usage["output_tokens"] == 100


async def test_prefill_continuation_gives_the_rest() -> None:
    request = body(user("/long 50"), max_tokens=20)
    part = done_of(await run(request))
    assert part.stop_reason == "max_tokens"
    head = part.content[0]["text"]
    rest = done_of(
        await run(
            {**request, "max_tokens": 2048, "messages": [*request["messages"], assistant(head)]}
        )
    )
    assert rest.stop_reason == "end_turn"
    whole = done_of(await run(body(user("/long 50")))).content[0]["text"]
    assert head + rest.content[0]["text"] == whole


async def test_tool_input_cut_by_max_tokens_is_truncated() -> None:
    long_input = json.dumps({"file_path": "x" * 200})
    events = await run(body(user(f"/tool Read {long_input}"), tools=TOOLS, max_tokens=10))
    done = done_of(events)
    assert done.stop_reason == "max_tokens"
    assert not any(isinstance(e, ToolUseReady) for e in events)
    assert done.truncated_tool_use_ids == (done.content[0]["id"],)
    assert done.content[0]["input"] == {}


async def test_zero_max_tokens_gives_an_empty_reply() -> None:
    done = done_of(await run(body(user("hi"), max_tokens=0)))
    assert (done.content, done.stop_reason) == ([], "max_tokens")


async def test_summary_request_gives_all_nine_headings_with_quotes() -> None:
    marker = summary_marker()
    conversation = [
        user("Please fix the login bug in auth.py"),
        assistant(
            [
                {"type": "text", "text": "I will read the file."},
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "auth.py"}},
            ]
        ),
        user(
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": "No such file",
                    "is_error": True,
                }
            ]
        ),
        assistant([{"type": "text", "text": "The file is missing; I created it instead."}]),
        user(
            [
                {"type": "text", "text": "Also add tests."},
                {"type": "text", "text": f"Summarise the conversation. {marker} ..."},
            ]
        ),
    ]
    events = await run(body(*conversation, max_tokens=8000))
    done = done_of(events)
    assert done.stop_reason == "end_turn"
    text = done.content[0]["text"]
    assert text.startswith("<summary>")
    assert text.endswith("</summary>")
    positions = [text.index(f"{heading}:") for heading in SUMMARY_HEADINGS]
    assert positions == sorted(positions)
    assert len(SUMMARY_HEADINGS) == 9
    primary = text[positions[0] : positions[1]]
    assert '"Please fix the login bug in auth.py"' in primary
    all_user = text[positions[5] : positions[6]]
    assert '"Please fix the login bug in auth.py"' in all_user
    assert '"Also add tests."' in all_user
    assert "Summarise the conversation" not in text  # the instruction is not quoted
    assert "auth.py" in text[positions[2] : positions[3]]
    assert "Tool Read failed" in text[positions[3] : positions[4]]
    current = text[positions[7] : positions[8]]
    assert '"The file is missing; I created it instead."' in current
    assert not any(isinstance(e, ToolUseReady) for e in events)


async def test_summary_request_ignores_commands_in_the_history() -> None:
    marker = summary_marker()
    events = await run(body(user("/tool Read {}"), user(f"{marker} summarise"), tools=TOOLS))
    done = done_of(events)
    assert done.stop_reason == "end_turn"
    assert done.content[0]["text"].startswith("<summary>")


@pytest.mark.parametrize(
    "request_body",
    [
        body(user("same input")),
        body(user('/tool Read {"file_path": "a"}\n/tool Glob {}'), tools=TOOLS),
        body(user("/think\n/long 40"), thinking={"type": "enabled", "budget_tokens": 1024}),
    ],
)
async def test_same_body_gives_the_same_events(request_body: dict[str, Any]) -> None:
    assert await run(request_body) == await run(json.loads(json.dumps(request_body)))


async def test_different_bodies_give_different_ids() -> None:
    one = done_of(await run(body(user("a"))))
    two = done_of(await run(body(user("b"))))
    assert one.message_id != two.message_id


async def test_summary_of_a_conversation_sent_as_a_transcript() -> None:
    transcript = "\n\n".join(
        [
            "User: Port the parser to Rust",
            'Assistant: Reading it first.\n[called Read({"file_path": "parser.py"})]',
            "User: [result (error): permission denied]",
            "Assistant: The file is locked; please unlock it.",
            "User: Done, try again",
        ]
    )
    instruction = (
        f"The conversation so far, as a transcript:\n\n<transcript>\n{transcript}\n</transcript>"
        f"\n\n{summary_marker()}, paying close attention to the user's explicit requests."
    )
    done = done_of(await run(body(user(instruction), max_tokens=8000)))
    text = done.content[0]["text"]
    positions = [text.index(f"{heading}:") for heading in SUMMARY_HEADINGS]
    assert '"Port the parser to Rust"' in text[positions[0] : positions[1]]
    assert "Tool Read used 1 time." in text[positions[1] : positions[2]]
    assert "parser.py" in text[positions[2] : positions[3]]
    assert 'Tool Read failed: "permission denied"' in text[positions[3] : positions[4]]
    all_user = text[positions[5] : positions[6]]
    assert all_user.count("\n- ") == 2
    assert '"Done, try again"' in all_user
    assert '"The file is locked; please unlock it."' in text[positions[7] : positions[8]]
    assert "paying close attention" not in text
