"""The fake Anthropic server, exercised with the real ``anthropic`` SDK."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from tests.fake_anthropic import (
    BLOCK_OVERHEAD_TOKENS,
    CHARS_PER_TOKEN,
    FakeAnthropic,
    count_tokens,
    items,
    prompt_blocks,
    sign_thinking,
)

MODEL = "claude-fake-1"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fake() -> Any:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh(fake: FakeAnthropic) -> None:
    fake.reset()


@pytest.fixture
async def client(fake: FakeAnthropic) -> Any:
    c = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0)
    yield c
    await c.close()


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def tool_use_block(id_: str, name: str = "Read", input_: Any = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": input_ or {"path": "a"}}


def tool_result(id_: str, content: Any = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": id_, "content": content}


TOOL = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def raw_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in text.split("\n\n"):
        if not chunk.strip():
            continue
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def collect_types(stream: Any, received: list[str]) -> None:
    """Iterates a stream (or an un-entered stream manager), noting each event's type."""
    if hasattr(stream, "__aenter__") and not hasattr(stream, "__anext__"):
        async with stream as entered:
            await collect_types(entered, received)
        return
    async for event in stream:
        received.append(event.type)


def api_headers() -> dict[str, str]:
    return {"x-api-key": "test", "anthropic-version": "2023-06-01"}


# ---- streaming ------------------------------------------------------------------------------


async def test_stream_helper_assembles_text(fake: FakeAnthropic, client: Any) -> None:
    reply = "The quick brown fox jumps over the lazy dog, twice, to be sure."
    fake.script(items.message(reply))
    deltas = []
    async with client.messages.stream(
        model=MODEL, max_tokens=100, messages=[user("Tell me about foxes")]
    ) as stream:
        async for piece in stream.text_stream:
            deltas.append(piece)
        final = await stream.get_final_message()
        assert stream.request_id.startswith("req_")
    assert len(deltas) > 2
    assert "".join(deltas) == reply
    assert final.content[0].text == reply
    assert final.model == MODEL
    assert final.id.startswith("msg_")
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == math.ceil(len(reply) / CHARS_PER_TOKEN)
    assert final.usage.input_tokens == count_tokens({"messages": [user("Tell me about foxes")]})
    assert fake.rejections == []
    assert fake.pending == []


async def test_create_stream_true_yields_the_real_event_sequence(
    fake: FakeAnthropic, client: Any
) -> None:
    fake.script(items.message("Hello there, streaming world!"))
    stream = await client.messages.create(
        model=MODEL, max_tokens=50, messages=[user("hi")], stream=True
    )
    kinds = []
    text = ""
    async for event in stream:
        kinds.append(event.type)
        if event.type == "content_block_delta":
            text += event.delta.text
        if event.type == "message_start":
            assert event.message.content == []
            assert event.message.usage.cache_read_input_tokens == 0
            assert event.message.usage.cache_creation_input_tokens == 0
        if event.type == "message_delta":
            assert event.delta.stop_reason == "end_turn"
            assert event.usage.output_tokens > 0
    assert text == "Hello there, streaming world!"
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert kinds.count("content_block_delta") >= 2


async def test_raw_sse_wire_format(fake: FakeAnthropic) -> None:
    fake.script(
        items.message(
            items.thinking("Let me think."),
            "Reading it.",
            items.tool_use("Read", {"path": "a.txt"}, id="toolu_01abc"),
        )
    )
    body = {"model": MODEL, "max_tokens": 2048, "stream": True, "messages": [user("go")]}
    body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    body["tools"] = [TOOL]
    async with httpx.AsyncClient(base_url=fake.base_url) as http:
        r = await http.post("/v1/messages", json=body, headers=api_headers())
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["request-id"].startswith("req_")
    events = raw_events(r.text)
    names = [name for name, _ in events]
    assert names[0] == "message_start"
    assert "ping" in names
    assert names[-2:] == ["message_delta", "message_stop"]
    for name, data in events:
        assert data["type"] == name
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert starts[1] == {"type": "text", "text": ""}
    assert starts[2] == {"type": "tool_use", "id": "toolu_01abc", "name": "Read", "input": {}}
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    kinds = [d["type"] for d in deltas]
    assert (
        kinds.index("signature_delta")
        == max(i for i, k in enumerate(kinds) if k == "thinking_delta") + 1
    )
    json_parts = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert json_parts[0] == ""
    assert json.loads("".join(json_parts)) == {"path": "a.txt"}
    start_usage = events[0][1]["message"]["usage"]
    assert set(start_usage) >= {
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    }
    delta_event = events[-2][1]
    assert delta_event["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


async def test_tool_use_input_arrives_via_input_json_delta(
    fake: FakeAnthropic, client: Any
) -> None:
    tool_input = {"path": "src/app.py", "lines": [1, 2, 3], "options": {"follow": True}}
    fake.script(items.message("Let me look.", items.tool_use("Read", tool_input)))
    json_chunks = []
    async with client.messages.stream(
        model=MODEL, max_tokens=100, tools=[TOOL], messages=[user("read it")]
    ) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                json_chunks.append(event.delta.partial_json)
        final = await stream.get_final_message()
    assert json_chunks[0] == ""
    assert len(json_chunks) > 2
    block = final.content[1]
    assert block.type == "tool_use"
    assert block.input == tool_input
    assert block.id.startswith("toolu_")
    assert final.stop_reason == "tool_use"

    # answering the tool use is a valid next request
    await client.messages.create(
        model=MODEL,
        max_tokens=100,
        tools=[TOOL],
        messages=[
            user("read it"),
            {"role": "assistant", "content": [b.model_dump() for b in final.content]},
            user([tool_result(block.id, "print('hi')")]),
        ],
    )
    assert fake.rejections == []


async def test_non_stream_returns_full_message(fake: FakeAnthropic, client: Any) -> None:
    fake.script(items.message("Done.", stop_reason="stop_sequence", stop_sequence="END"))
    msg = await client.messages.create(model=MODEL, max_tokens=10, messages=[user("x")])
    assert msg.content[0].text == "Done."
    assert msg.stop_reason == "stop_sequence"
    assert msg.stop_sequence == "END"
    assert msg.usage.input_tokens > 0


async def test_default_reply_and_responder(fake: FakeAnthropic, client: Any) -> None:
    long_text = "word " * 40
    msg = await client.messages.create(model=MODEL, max_tokens=500, messages=[user(long_text)])
    assert msg.content[0].text == "Fake reply to: " + long_text[:80]
    assert msg.stop_reason == "end_turn"

    seen = []

    def responder(body: dict[str, Any]) -> Any:
        seen.append(body["messages"][-1]["content"])
        return "from responder" if body["messages"][-1]["content"] == "ask" else None

    fake.responder = responder
    fake.script("scripted first")
    texts = []
    for prompt in ("ask", "ask", "other"):
        m = await client.messages.create(model=MODEL, max_tokens=50, messages=[user(prompt)])
        texts.append(m.content[0].text)
    assert texts == ["scripted first", "from responder", "Fake reply to: other"]
    assert seen == ["ask", "other"]
    assert [r["source"] for r in fake.records] == [
        "default",
        "script",
        "responder",
        "default",
    ]


# ---- thinking -------------------------------------------------------------------------------


async def test_thinking_signature_round_trips(fake: FakeAnthropic, client: Any) -> None:
    thinking_cfg = {"type": "enabled", "budget_tokens": 1024}
    fake.script(
        items.message(items.thinking("I should read the file first."), items.tool_use("Read"))
    )
    first = await client.messages.create(
        model=MODEL,
        max_tokens=2048,
        thinking=thinking_cfg,
        tools=[TOOL],
        messages=[user("read a")],
        stream=False,
    )
    thought = first.content[0]
    assert thought.type == "thinking"
    assert thought.signature == sign_thinking("I should read the file first.")
    tool_id = first.content[1].id

    def history(assistant_content: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [user("read a"), assistant(assistant_content), user([tool_result(tool_id)])]

    echoed = [b.model_dump() for b in first.content]
    reply = await client.messages.create(
        model=MODEL, max_tokens=2048, thinking=thinking_cfg, tools=[TOOL], messages=history(echoed)
    )
    assert reply.content[0].type == "thinking"  # default replies think when thinking is on
    assert reply.content[0].signature == sign_thinking(reply.content[0].thinking)
    assert fake.rejections == []

    edited = [dict(echoed[0], thinking="I should delete the file."), echoed[1]]
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.create(
            model=MODEL,
            max_tokens=2048,
            thinking=thinking_cfg,
            tools=[TOOL],
            messages=history(edited),
        )
    assert exc.value.body["error"]["message"] == (
        "messages.1.content.0: Invalid `signature` in `thinking` block"
    )

    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.create(
            model=MODEL,
            max_tokens=2048,
            thinking=thinking_cfg,
            tools=[TOOL],
            messages=history([echoed[1]]),
        )
    assert exc.value.body["error"]["message"].startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
        "`tool_use`. When `thinking` is enabled, a final `assistant` message must start "
        "with a thinking block"
    )
    # without thinking enabled the same history is fine
    await client.messages.create(
        model=MODEL, max_tokens=100, tools=[TOOL], messages=history([echoed[1]])
    )
    assert len(fake.rejections) == 2


async def test_redacted_thinking_streams_whole_and_round_trips(
    fake: FakeAnthropic, client: Any
) -> None:
    thinking_cfg = {"type": "enabled", "budget_tokens": 1024}
    fake.script(
        items.message(
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va"}, items.tool_use("Read")
        )
    )
    async with client.messages.stream(
        model=MODEL, max_tokens=2048, thinking=thinking_cfg, tools=[TOOL], messages=[user("go")]
    ) as stream:
        final = await stream.get_final_message()
    assert final.content[0].type == "redacted_thinking"
    assert final.content[0].data == "EmwKAhgBEgy3va"
    messages = [
        user("go"),
        assistant([b.model_dump() for b in final.content]),
        user([tool_result(final.content[1].id)]),
    ]
    await client.messages.create(
        model=MODEL, max_tokens=2048, thinking=thinking_cfg, tools=[TOOL], messages=messages
    )
    assert fake.rejections == []


# ---- validation -----------------------------------------------------------------------------

ORPHAN = (
    "unexpected `tool_use_id` found in `tool_result` blocks: {ids}. Each `tool_result` "
    "block must have a corresponding `tool_use` block in the previous message."
)
UNANSWERED = (
    "`tool_use` ids were found without `tool_result` blocks immediately after: {ids}. Each "
    "`tool_use` block must have a corresponding `tool_result` block in the next message."
)
EMPTY = "all messages must have non-empty content except for the optional final assistant message"

INVALID_CASES = [
    pytest.param(
        {"messages": [assistant("hi"), user("x")]},
        'messages: first message must use the "user" role',
        id="first-assistant",
    ),
    pytest.param(
        {"messages": [user("a"), {"role": "system", "content": "b"}]},
        "messages.1.role: Input should be 'user' or 'assistant'",
        id="bad-role",
    ),
    pytest.param(
        {"messages": [user("a"), assistant([]), user("b")]},
        f"messages.1: {EMPTY}",
        id="empty-content",
    ),
    pytest.param(
        {"messages": [user("a"), assistant(""), user("b")]},
        f"messages.1: {EMPTY}",
        id="empty-string-content",
    ),
    pytest.param(
        {"messages": [user([{"type": "text", "text": ""}])]},
        "messages: text content blocks must be non-empty",
        id="empty-text",
    ),
    pytest.param(
        {"messages": [user([{"type": "text", "text": "ok"}, {"type": "text", "text": " \n"}])]},
        "messages: text content blocks must contain non-whitespace text",
        id="whitespace-text",
    ),
    pytest.param(
        {"messages": [user("a"), assistant("b"), user([tool_result("toolu_x")])]},
        "messages.2.content.0: " + ORPHAN.format(ids="toolu_x"),
        id="orphan-result",
    ),
    pytest.param(
        # the two user messages merge: the orphan is messages.2.content.1
        {
            "messages": [
                user("a"),
                assistant("b"),
                user("c"),
                user([tool_result("toolu_y"), tool_result("toolu_z")]),
            ]
        },
        "messages.2.content.1: " + ORPHAN.format(ids="toolu_y, toolu_z"),
        id="orphan-after-merge",
    ),
    pytest.param(
        # users merge, so the assistant with the tool_use is messages.1
        {
            "messages": [
                user("a"),
                user("b"),
                assistant([tool_use_block("toolu_1"), tool_use_block("toolu_2")]),
                user([tool_result("toolu_1"), {"type": "text", "text": "and"}]),
            ]
        },
        "messages.1: " + UNANSWERED.format(ids="toolu_2"),
        id="unanswered-after-merge",
    ),
    pytest.param(
        {
            "messages": [
                user("a"),
                assistant([tool_use_block("toolu_1")]),
                user("no result here"),
            ]
        },
        "messages.1: " + UNANSWERED.format(ids="toolu_1"),
        id="unanswered",
    ),
    pytest.param(
        {
            "messages": [
                user("a"),
                assistant([tool_use_block("toolu_1")]),
                user([{"type": "text", "text": "first"}, tool_result("toolu_1")]),
            ]
        },
        "messages.2: Did not find 1 `tool_result` block(s) at the beginning of this message. "
        "Messages following `tool_use` blocks must begin with a matching number of "
        "`tool_result` blocks.",
        id="result-not-first",
    ),
    pytest.param(
        {
            "messages": [
                user("a"),
                assistant([tool_use_block("toolu_1"), tool_use_block("toolu_1")]),
                user([tool_result("toolu_1")]),
            ]
        },
        "messages.1.content.1: `tool_use` ids must be unique",
        id="duplicate-tool-use-id",
    ),
    pytest.param(
        {
            "system": [
                {"type": "text", "text": "s1", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "s2", "cache_control": {"type": "ephemeral"}},
            ],
            "tools": [dict(TOOL, cache_control={"type": "ephemeral"})],
            "messages": [
                user([{"type": "text", "text": "u", "cache_control": {"type": "ephemeral"}}]),
                assistant("b"),
                user([{"type": "text", "text": "v", "cache_control": {"type": "ephemeral"}}]),
            ],
        },
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        id="five-cache-controls",
    ),
    pytest.param(
        {"thinking": {"type": "enabled", "budget_tokens": 1000}, "max_tokens": 4000},
        "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
        id="thinking-budget-small",
    ),
    pytest.param(
        {"thinking": {"type": "enabled", "budget_tokens": 2000}, "max_tokens": 2000},
        "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
        "documentation at https://docs.claude.com/en/docs/build-with-claude/"
        "extended-thinking#max-tokens-and-context-window-size",
        id="thinking-budget-over-max",
    ),
    pytest.param(
        {"tools": [dict(TOOL, name="read file")]},
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'",
        id="tool-name-pattern",
    ),
    pytest.param(
        {"tools": [dict(TOOL, name="x" * 65)]},
        "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'",
        id="tool-name-too-long",
    ),
    pytest.param(
        {"tools": [TOOL, dict(TOOL, description="again")]},
        "tools: Tool names must be unique.",
        id="tool-names-unique",
    ),
    pytest.param(
        {"tools": [{"name": "Read"}]},
        "tools.0.custom.input_schema: Field required",
        id="tool-no-schema",
    ),
    pytest.param(
        {"tools": [dict(TOOL, input_schema="object")]},
        "tools.0.custom.input_schema: Input should be a valid dictionary",
        id="tool-schema-not-object",
    ),
    pytest.param(
        {"tools": [TOOL, dict(TOOL, name="Run", compactable=True)]},
        "tools.1.custom.compactable: Extra inputs are not permitted",
        id="tool-compactable-key",
    ),
    pytest.param(
        {"max_tokens": -1},
        "max_tokens: Input should be greater than or equal to 0",
        id="max-tokens-negative",
    ),
    pytest.param(
        {"messages": []},
        "messages: List should have at least 1 item after validation, not 0",
        id="no-messages",
    ),
    pytest.param(
        {"parley_session": "abc"},
        "parley_session: Extra inputs are not permitted",
        id="unknown-top-level-key",
    ),
    pytest.param(
        {"messages": [user("a"), assistant("prefill ")]},
        "messages: final assistant content cannot end with trailing whitespace",
        id="prefill-trailing-space",
    ),
    pytest.param(
        {
            "messages": [
                user(
                    [
                        {"type": "text", "text": "look"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": "R0lGODlhAQABAAAAACw=",  # a GIF's first bytes
                            },
                        },
                    ]
                )
            ]
        },
        "messages.0.content.1.image.source.base64: The image was specified using the "
        "image/png media type, but does not appear to be a valid png image",
        id="image-not-its-media-type",
    ),
]


@pytest.mark.parametrize(("patch", "expected"), INVALID_CASES)
async def test_invalid_requests_are_rejected_with_real_wording(
    fake: FakeAnthropic, patch: dict[str, Any], expected: str
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 100, "messages": [user("hi")]}
    body.update(patch)
    fake.script("never used")
    async with httpx.AsyncClient(base_url=fake.base_url) as http:
        r = await http.post("/v1/messages", json=body, headers=api_headers())
    assert r.status_code == 400
    payload = r.json()
    assert payload["type"] == "error"
    assert payload["error"] == {"type": "invalid_request_error", "message": expected}
    assert payload["request_id"] == r.headers["request-id"]
    assert payload["request_id"].startswith("req_")
    [rejection] = fake.rejections
    assert rejection["error"]["message"] == expected
    assert rejection["body"] == body
    assert len(fake.pending) == 1  # a rejected request uses no script item


async def test_sdk_raises_bad_request_with_the_message(fake: FakeAnthropic, client: Any) -> None:
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=[user("a"), assistant("b"), user([tool_result("t")])],
        )
    assert exc.value.status_code == 400
    assert exc.value.type == "invalid_request_error"
    assert exc.value.api_message == "messages.2.content.0: " + ORPHAN.format(ids="t")
    assert exc.value.request_id == exc.value.body["request_id"]


async def test_valid_edge_cases_are_accepted(fake: FakeAnthropic, client: Any) -> None:
    ok_histories = [
        [user("a"), assistant("")],  # empty final assistant
        [user("a"), assistant([])],
        [user("a"), assistant("The answer is")],  # prefill
        [user("a"), user("b"), assistant("c"), assistant("d"), user("e")],  # merged
        [
            user("a"),
            assistant([{"type": "text", "text": "t"}, tool_use_block("toolu_1")]),
            user(
                [
                    tool_result("toolu_1", [{"type": "text", "text": "r"}]),
                    {"type": "text", "text": "x"},
                ]
            ),
        ],
        [user("a"), assistant([tool_use_block("toolu_1")])],  # final assistant may be unanswered
    ]
    for messages in ok_histories:
        await client.messages.create(model=MODEL, max_tokens=10, messages=messages, tools=[TOOL])
    await client.messages.create(model=MODEL, max_tokens=0, messages=[user("warm the cache")])
    assert fake.rejections == []


async def test_auth_and_version_headers(fake: FakeAnthropic) -> None:
    body = {"model": MODEL, "max_tokens": 10, "messages": [user("hi")]}
    async with httpx.AsyncClient(base_url=fake.base_url) as http:
        r = await http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        assert r.headers["request-id"] == r.json()["request_id"]
        r = await http.post(
            "/v1/messages",
            json=body,
            headers={"authorization": "Bearer k", "anthropic-version": "2023-06-01"},
        )
        assert r.status_code == 200
        r = await http.post("/v1/messages", json=body, headers={"x-api-key": "k"})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "anthropic-version: header is required"
        r = await http.get("/v1/nothing")
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "not_found_error"
        assert r.headers["request-id"].startswith("req_")
    fake.configure(api_key="right")
    bad = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        await bad.messages.create(model=MODEL, max_tokens=10, messages=[user("hi")])
    await bad.close()


async def test_request_too_large(fake: FakeAnthropic, client: Any) -> None:
    assert fake.state.config["max_request_bytes"] == 32 * 1024 * 1024
    fake.configure(max_request_bytes=50_000)
    with pytest.raises(anthropic.APIStatusError) as exc:
        await client.messages.create(model=MODEL, max_tokens=10, messages=[user("x" * 60_000)])
    assert exc.value.status_code == 413
    assert exc.value.body["error"]["type"] == "request_too_large"
    assert fake.rejections[0]["status"] == 413


async def test_prompt_too_long(fake: FakeAnthropic, client: Any) -> None:
    fake.configure(max_context_tokens=1000)
    messages = [user("y" * 2794)]
    n = count_tokens({"messages": messages})
    assert n == math.ceil(2794 / CHARS_PER_TOKEN) + BLOCK_OVERHEAD_TOKENS == 1001
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.create(model=MODEL, max_tokens=10, messages=messages)
    assert exc.value.api_message == "prompt is too long: 1001 tokens > 1000 maximum"
    await client.messages.create(model=MODEL, max_tokens=10, messages=[user("y" * 2790)])


async def test_count_tokens_matches_the_estimate(fake: FakeAnthropic, client: Any) -> None:
    body = {
        "model": MODEL,
        "system": [{"type": "text", "text": "You are terse."}],
        "tools": [TOOL],
        "messages": [
            user("a" * 101),
            assistant([tool_use_block("toolu_1", input_={"path": "x.txt"})]),
            user([tool_result("toolu_1", "file body " * 30)]),
        ],
    }
    counted = await client.messages.count_tokens(**body)
    expected = (
        math.ceil(len(json.dumps(TOOL, separators=(",", ":"), sort_keys=True)) / CHARS_PER_TOKEN)
        + math.ceil(len("You are terse.") / CHARS_PER_TOKEN)
        + math.ceil(101 / CHARS_PER_TOKEN)
        + math.ceil((len("Read") + len('{"path":"x.txt"}')) / CHARS_PER_TOKEN)
        + math.ceil(len("file body " * 30) / CHARS_PER_TOKEN)
        + 5 * BLOCK_OVERHEAD_TOKENS
    )
    assert counted.input_tokens == expected == count_tokens(body)
    msg = await client.messages.create(max_tokens=10, **body)
    u = msg.usage
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == expected


# ---- errors ---------------------------------------------------------------------------------


async def test_rate_limit_has_retry_after(fake: FakeAnthropic, client: Any) -> None:
    fake.script(items.rate_limit(retry_after=1))
    with pytest.raises(anthropic.RateLimitError) as exc:
        await client.messages.create(model=MODEL, max_tokens=10, messages=[user("x")])
    assert exc.value.status_code == 429
    assert exc.value.response.headers["retry-after"] == "1"
    assert exc.value.body["error"]["type"] == "rate_limit_error"
    assert exc.value.request_id.startswith("req_")
    assert fake.rejections == []  # a scripted error is not a rejection


async def test_sdk_retries_honour_the_script(fake: FakeAnthropic) -> None:
    fake.script(items.error(429, retry_after_ms=5), items.error(529, retry_after_ms=5), "ok")
    retrying = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="t", max_retries=2)
    msg = await retrying.messages.create(model=MODEL, max_tokens=10, messages=[user("x")])
    await retrying.close()
    assert msg.content[0].text == "ok"
    assert [r["headers"]["x-stainless-retry-count"] for r in fake.records] == ["0", "1", "2"]
    assert [r["status"] for r in fake.records] == [429, 529, 200]


async def test_spend_limit_429_is_not_retried(fake: FakeAnthropic) -> None:
    fake.script(
        items.error(
            429,
            "spend limit reached",
            should_retry=False,
            details={"error_code": "enforced_spend_limit_reached"},
        )
    )
    retrying = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="t", max_retries=2)
    with pytest.raises(anthropic.RateLimitError) as exc:
        await retrying.messages.create(model=MODEL, max_tokens=10, messages=[user("x")])
    await retrying.close()
    assert exc.value.error_code == "enforced_spend_limit_reached"
    assert len(fake.records) == 1


@pytest.mark.parametrize(
    ("status", "error_cls", "message"),
    [
        (529, anthropic.OverloadedError, "Overloaded"),
        (500, anthropic.InternalServerError, "Internal server error"),
    ],
)
async def test_server_errors(
    fake: FakeAnthropic, client: Any, status: int, error_cls: type, message: str
) -> None:
    fake.script(items.error(status))
    with pytest.raises(error_cls) as exc:
        await client.messages.create(model=MODEL, max_tokens=10, messages=[user("x")])
    assert exc.value.status_code == status
    assert exc.value.api_message == message
    # a scripted error in a stream request is an HTTP error before any event
    fake.script(items.error(status))
    with pytest.raises(error_cls):
        await client.messages.create(model=MODEL, max_tokens=10, messages=[user("x")], stream=True)


async def test_stream_error_event_raises_during_iteration(fake: FakeAnthropic, client: Any) -> None:
    fake.script(items.stream_error(4, "partial text that will not finish"))
    received = []
    stream = await client.messages.create(
        model=MODEL, max_tokens=50, messages=[user("x")], stream=True
    )
    with pytest.raises(anthropic.APIStatusError) as exc:
        await collect_types(stream, received)
    assert received == ["message_start", "content_block_start", "content_block_delta"]
    assert exc.value.status_code == 200
    assert exc.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert not isinstance(exc.value, anthropic.OverloadedError)


async def test_drop_closes_the_connection_mid_stream(fake: FakeAnthropic, client: Any) -> None:
    fake.script(items.drop(5, "a long answer " * 20), "after the drop")
    received = []
    with pytest.raises(httpx2.RemoteProtocolError):
        await collect_types(
            client.messages.stream(model=MODEL, max_tokens=100, messages=[user("x")]), received
        )
    assert received[0] == "message_start"
    assert "message_stop" not in received
    assert len(received) >= 3
    # the server is fine afterwards
    msg = await client.messages.create(model=MODEL, max_tokens=10, messages=[user("x")])
    assert msg.content[0].text == "after the drop"


async def test_drop_on_a_non_stream_request(fake: FakeAnthropic, client: Any) -> None:
    fake.script(items.drop(0))
    with pytest.raises(anthropic.APIConnectionError) as exc:
        await client.messages.create(model=MODEL, max_tokens=10, messages=[user("x")])
    assert isinstance(exc.value.__cause__, httpx2.RemoteProtocolError)


async def test_delays(fake: FakeAnthropic, client: Any) -> None:
    fake.configure(first_token_delay=0.15, chunk_delay=0.01)
    fake.script(items.message("abcdefghij" * 4, delay=0.1))
    t0 = time.monotonic()
    stream = await client.messages.create(
        model=MODEL, max_tokens=50, messages=[user("x")], stream=True
    )
    first = await stream.__anext__()
    assert first.type == "message_start"
    t_start = time.monotonic() - t0
    async for _ in stream:
        pass
    total = time.monotonic() - t0
    assert t_start >= 0.1
    assert total >= 0.1 + 0.15 + 0.05


def test_bad_script_items_are_refused_at_script_time(fake: FakeAnthropic) -> None:
    with pytest.raises(ValueError, match="unknown script item type"):
        fake.script({"type": "nonsense"})
    with pytest.raises(ValueError, match="status"):
        fake.script({"type": "error"})
    with pytest.raises(ValueError, match="unknown setting"):
        fake.configure(max_context=5)


# ---- prompt cache -----------------------------------------------------------------------------

SYSTEM = [{"type": "text", "text": "You are a careful agent. " * 250}]  # ~1.5k tokens


def cached(block_text: str) -> dict[str, Any]:
    return {"type": "text", "text": block_text, "cache_control": {"type": "ephemeral"}}


def turn_messages(n: int) -> list[dict[str, Any]]:
    """An agent loop after n turns, its single breakpoint on the last message."""
    msgs: list[dict[str, Any]] = []
    for i in range(n):
        msgs.append(user(f"question {i}"))
        msgs.append(assistant(f"answer {i}"))
    msgs.append(user([cached(f"question {n}")]))
    return msgs


async def test_cache_reads_grow_as_the_conversation_extends(
    fake: FakeAnthropic, client: Any
) -> None:
    usages = []
    bodies = []
    for n in range(4):
        body = {"model": MODEL, "max_tokens": 10, "system": SYSTEM, "messages": turn_messages(n)}
        bodies.append(body)
        msg = await client.messages.create(**body)
        usages.append(msg.usage)
    totals = [count_tokens(b) for b in bodies]
    assert usages[0].cache_read_input_tokens == 0
    assert usages[0].cache_creation_input_tokens == totals[0]
    assert usages[0].input_tokens == 0
    for n in range(1, 4):
        assert usages[n].cache_read_input_tokens == totals[n - 1]
        assert usages[n].cache_creation_input_tokens == totals[n] - totals[n - 1]
        assert usages[n].input_tokens == 0
        assert usages[n].cache_read_input_tokens > usages[n - 1].cache_read_input_tokens
    assert fake.usages[3]["cache_read_input_tokens"] == totals[2]
    assert fake.usages[3]["cache_creation"]["ephemeral_5m_input_tokens"] == totals[3] - totals[2]


async def test_cache_is_cold_after_the_ttl(fake: FakeAnthropic, client: Any) -> None:
    body = {"model": MODEL, "max_tokens": 10, "system": SYSTEM, "messages": turn_messages(1)}
    await client.messages.create(**body)
    again = await client.messages.create(**body)
    assert again.usage.cache_read_input_tokens == count_tokens(body)
    fake.advance_clock(299)  # the hit above refreshed the entry: still warm
    warm = await client.messages.create(**body)
    assert warm.usage.cache_read_input_tokens == count_tokens(body)
    fake.configure(clock_offset=fake.state.config["clock_offset"] + 301)
    cold = await client.messages.create(**body)
    assert cold.usage.cache_read_input_tokens == 0
    assert cold.usage.cache_creation_input_tokens == count_tokens(body)


async def test_cache_rules(fake: FakeAnthropic, client: Any) -> None:
    # too short a prefix is silently not cached
    short = {"model": MODEL, "max_tokens": 10, "messages": [user([cached("tiny")])]}
    for _ in range(2):
        m = await client.messages.create(**short)
        assert m.usage.cache_creation_input_tokens == m.usage.cache_read_input_tokens == 0

    # moving the breakpoint does not change the prefix hash; a system change misses
    base = [
        {"type": "text", "text": SYSTEM[0]["text"], "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "second block"},
    ]
    await client.messages.create(model=MODEL, max_tokens=10, system=base, messages=[user("a")])
    moved = [dict(base[0], cache_control=None), cached("second block")]
    m = await client.messages.create(model=MODEL, max_tokens=10, system=moved, messages=[user("a")])
    first_len = prompt_blocks({"system": base})[0].tokens
    assert m.usage.cache_read_input_tokens == first_len
    changed = [dict(moved[0], text=moved[0]["text"] + "!"), moved[1]]
    m = await client.messages.create(
        model=MODEL, max_tokens=10, system=changed, messages=[user("a")]
    )
    assert m.usage.cache_read_input_tokens == 0

    # the lookback reaches 20 blocks back, no further
    fake.reset()
    long_history = turn_messages(10)  # 21 blocks after the system block
    await client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=long_history)
    # the old breakpoint block stays (without its cache_control), two blocks are added
    near = [*long_history[:-1], user("question 10"), assistant("a10"), user([cached("q11")])]
    m = await client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=near)
    assert m.usage.cache_read_input_tokens == count_tokens(
        {"system": SYSTEM, "messages": long_history}
    )
    far = list(near[:-1])  # 21 blocks past the first breakpoint: out of reach
    for i in range(10):
        far += [user(f"y{i}"), assistant(f"x{i}")]
    far += [user([cached("last")])]
    m = await client.messages.create(model=MODEL, max_tokens=10, system=SYSTEM, messages=far)
    assert m.usage.cache_read_input_tokens == 0

    # 1h breakpoints outlive 5m ones
    fake.reset()
    one_hour = [dict(SYSTEM[0], cache_control={"type": "ephemeral", "ttl": "1h"})]
    m = await client.messages.create(
        model=MODEL, max_tokens=10, system=one_hour, messages=[user("a")]
    )
    assert m.usage.cache_creation.ephemeral_1h_input_tokens == m.usage.cache_creation_input_tokens
    fake.advance_clock(1000)
    m = await client.messages.create(
        model=MODEL, max_tokens=10, system=one_hour, messages=[user("a")]
    )
    assert m.usage.cache_read_input_tokens > 0


async def test_cache_control_count_over_four_is_rejected_by_the_sdk_path(
    fake: FakeAnthropic, client: Any
) -> None:
    tools = [dict(TOOL, name=f"T{i}", cache_control={"type": "ephemeral"}) for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.create(model=MODEL, max_tokens=10, tools=tools, messages=[user("a")])
    assert (
        exc.value.api_message
        == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    )


# ---- control routes and the separate process --------------------------------------------------


async def test_control_routes(fake: FakeAnthropic) -> None:
    async with httpx.AsyncClient(base_url=fake.base_url) as http:
        r = await http.post("/_fake/script", json=["one", {"type": "error", "status": 529}])
        assert r.json() == {"queued": 2}
        assert r.headers["request-id"].startswith("req_")
        assert len((await http.get("/_fake/queue")).json()) == 2
        r = await http.post("/_fake/config", json={"max_context_tokens": 50, "chunk_delay": 0})
        assert r.json()["max_context_tokens"] == 50
        assert (await http.get("/_fake/config")).json()["max_context_tokens"] == 50
        r = await http.post("/_fake/config", json={"nope": 1})
        assert r.status_code == 400
        r = await http.post("/_fake/script", json=[{"type": "bogus"}])
        assert r.status_code == 400
        body = {"model": MODEL, "max_tokens": 10, "messages": [user("x")]}
        r = await http.post("/v1/messages", json=body, headers=api_headers())
        assert r.json()["content"][0]["text"] == "one"
        too_long = {"model": MODEL, "max_tokens": 10, "messages": [user("z" * 400)]}
        r = await http.post("/v1/messages", json=too_long, headers=api_headers())
        assert r.status_code == 400
        records = (await http.get("/_fake/requests")).json()
        assert [(x["valid"], x["status"]) for x in records] == [(True, 200), (False, 400)]
        assert records[0]["body"] == body
        assert records[0]["usage"]["input_tokens"] > 0
        rejections = (await http.get("/_fake/rejections")).json()
        assert len(rejections) == 1
        assert rejections[0]["error"]["message"].startswith("prompt is too long")
        await http.post("/_fake/reset")
        assert (await http.get("/_fake/requests")).json() == []
        assert (await http.get("/_fake/queue")).json() == []
        assert (await http.get("/_fake/config")).json()["max_context_tokens"] == 200_000


async def test_runs_as_its_own_process(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fake_anthropic",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        port = int(await asyncio.wait_for(proc.stdout.readline(), timeout=20))
        assert port_file.read_text() == str(port)
        base_url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base_url) as http:
            await http.post("/_fake/script", json=["from the other process"])
        c = anthropic.AsyncAnthropic(base_url=base_url, api_key="t", max_retries=0)
        async with c.messages.stream(model=MODEL, max_tokens=10, messages=[user("x")]) as s:
            final = await s.get_final_message()
        await c.close()
        assert final.content[0].text == "from the other process"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)
