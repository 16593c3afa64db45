"""AnthropicClient against a tiny local HTTP server speaking the real wire format.

The server is raw asyncio (no framework) so a test can cut the connection in the middle
of a chunked SSE body, which is how a dropped stream really looks to the client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.config import Settings
from app.engine.llm.assembler import MessageAssembler
from app.engine.llm.client import AnthropicClient, _encode
from app.engine.llm.errors import ModelError, PromptTooLong
from app.engine.llm.events import (
    MessageDone,
    MessageStart,
    TextDelta,
    ThinkingDelta,
    ToolUseReady,
)
from app.engine.llm.offline import OfflineModel
from app.engine.llm.provider import make_model_client
from tests.fake_anthropic import FakeAnthropic, items

BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [{"role": "user", "content": "Read a.txt"}],
    "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
    "temperature": 0.5,
}
MODEL = "claude-sonnet-4-5-20250929"


def message_start(msg_id: str = "msg_01") -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 25,
                "cache_creation_input_tokens": None,
                "cache_read_input_tokens": 10,
                "output_tokens": 1,
            },
        },
    }


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, **payload: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": payload}


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str, output_tokens: int) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


PING = {"type": "ping"}
STOP = {"type": "message_stop"}
TOOL_BLOCK = {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {}}

FULL_STREAM = [
    message_start(),
    block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, type="thinking_delta", thinking="Let me"),
    PING,
    delta(0, type="thinking_delta", thinking=" think."),
    delta(0, type="signature_delta", signature="EqQBCgIYAhIM"),
    block_stop(0),
    block_start(1, {"type": "text", "text": ""}),
    delta(1, type="text_delta", text="Hello"),
    delta(1, type="text_delta", text=" wörld"),
    block_stop(1),
    block_start(2, TOOL_BLOCK),
    delta(2, type="input_json_delta", partial_json=""),
    delta(2, type="input_json_delta", partial_json='{"file_path"'),
    delta(2, type="input_json_delta", partial_json=': "a.txt"}'),
    block_stop(2),
    message_delta("tool_use", 42),
    STOP,
]


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any


Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@dataclass
class FakeAPI:
    """Routes `/<scenario>/v1/messages` to a writer coroutine and records each request."""

    port: int = 0
    scenarios: dict[str, Writer] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)

    def url(self, scenario: str) -> str:
        return f"http://127.0.0.1:{self.port}/{scenario}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(Recorded(path, headers, json.loads(raw) if raw else None))
            await self.scenarios[path.split("/")[1]](writer)
        finally:
            writer.close()


def sse_bytes(event: dict[str, Any]) -> bytes:
    name = event["type"]
    return f"event: {name}\ndata: {json.dumps(event)}\n\n".encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def sse(events: list[dict[str, Any]], *, cut_after: int | None = None) -> Writer:
    """A 200 chunked SSE answer; with `cut_after`, the socket closes after that many events."""

    async def write(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"request-id: req_stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        for n, event in enumerate(events):
            if cut_after is not None and n == cut_after:
                await writer.drain()
                return  # no terminating chunk: the peer sees a truncated body
            writer.write(chunk(sse_bytes(event)))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return write


def error(status: int, etype: str, message: str, headers: dict[str, str] | None = None) -> Writer:
    async def write(writer: asyncio.StreamWriter) -> None:
        payload = json.dumps(
            {
                "type": "error",
                "error": {"type": etype, "message": message},
                "request_id": "req_body",
            }
        ).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\n"
            f"request-id: req_err\r\ncontent-length: {len(payload)}\r\n"
            f"connection: close\r\n{extra}\r\n".encode()
            + payload
        )
        await writer.drain()

    return write


@pytest.fixture(scope="module")
async def api() -> AsyncIterator[FakeAPI]:
    fake = FakeAPI()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    fake.port = server.sockets[0].getsockname()[1]
    async with server:
        yield fake


async def collect(api: FakeAPI, scenario: str, writer: Writer) -> list[Any]:
    """Run one stream; returns its events, with the raised ModelError (if any) last."""
    api.scenarios[scenario] = writer
    client = AnthropicClient(api_key="sk-ant-test", base_url=api.url(scenario), timeout=5)
    out: list[Any] = []
    try:
        async with aclosing(client.stream(BODY)) as stream:
            async for event in stream:
                out.append(event)
    except ModelError as exc:
        out.append(exc)
    finally:
        await client.aclose()
    return out


async def test_full_stream_yields_events_and_the_message_as_the_api_would_return_it(
    api: FakeAPI,
) -> None:
    events = await collect(api, "full", sse(FULL_STREAM))

    tool = {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "a.txt"}}
    assert events[:-1] == [
        MessageStart(
            "msg_01",
            MODEL,
            {
                "input_tokens": 25,
                "output_tokens": 1,
                "cache_read_input_tokens": 10,
                "cache_creation_input_tokens": 0,
            },
        ),
        ThinkingDelta(0, "Let me"),
        ThinkingDelta(0, " think."),
        TextDelta(1, "Hello"),
        TextDelta(1, " wörld"),
        ToolUseReady(2, tool),
    ]
    done = events[-1]
    assert isinstance(done, MessageDone)
    assert done.content == [
        {"type": "thinking", "thinking": "Let me think.", "signature": "EqQBCgIYAhIM"},
        {"type": "text", "text": "Hello wörld"},
        tool,
    ]
    assert done.stop_reason == "tool_use"
    assert done.stop_sequence is None
    assert done.usage == {
        "input_tokens": 25,
        "output_tokens": 42,
        "cache_read_input_tokens": 10,
        "cache_creation_input_tokens": 0,
    }
    assert (done.model, done.message_id, done.request_id) == (MODEL, "msg_01", "req_stream")
    assert done.truncated_tool_use_ids == ()


async def test_body_is_sent_unchanged_with_stream_true(api: FakeAPI) -> None:
    await collect(api, "echo", sse(FULL_STREAM))
    sent = next(r for r in api.requests if r.path == "/echo/v1/messages")
    # temperature is not a keyword of messages.create in this SDK: it must still pass.
    assert sent.body == {**BODY, "stream": True}
    assert sent.headers["anthropic-version"]
    assert "sk-ant-test" in (
        sent.headers.get("authorization", "") + sent.headers.get("x-api-key", "")
    )
    assert sent.headers["x-stainless-retry-count"] == "0"


async def test_betas_in_body_become_the_beta_header(api: FakeAPI) -> None:
    api.scenarios["betas"] = sse(FULL_STREAM)
    client = AnthropicClient(api_key="sk-ant-test", base_url=api.url("betas"), timeout=5)
    try:
        body = {**BODY, "betas": ["context-management-2025-06-27", "b2"]}
        events = [e async for e in client.stream(body)]
    finally:
        await client.aclose()
    assert isinstance(events[-1], MessageDone)
    sent = next(r for r in api.requests if r.path == "/betas/v1/messages")
    assert "betas" not in sent.body
    assert sent.headers["anthropic-beta"] == "context-management-2025-06-27,b2"


async def test_tool_input_cut_by_max_tokens_is_reported_truncated_not_ready(api: FakeAPI) -> None:
    stream = [
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text="Reading."),
        block_stop(0),
        block_start(1, {**TOOL_BLOCK, "id": "toolu_02"}),
        delta(1, type="input_json_delta", partial_json='{"file_path": "a.t'),
        block_stop(1),
        message_delta("max_tokens", 16),
        STOP,
    ]
    events = await collect(api, "truncated", sse(stream))
    assert not any(isinstance(e, ToolUseReady) for e in events)
    done = events[-1]
    assert isinstance(done, MessageDone)
    assert done.stop_reason == "max_tokens"
    assert done.truncated_tool_use_ids == ("toolu_02",)
    assert done.content[1] == {"type": "tool_use", "id": "toolu_02", "name": "Read", "input": {}}


async def test_empty_tool_input_means_empty_object(api: FakeAPI) -> None:
    stream = [
        message_start(),
        block_start(0, TOOL_BLOCK),
        delta(0, type="input_json_delta", partial_json=""),
        block_stop(0),
        message_delta("tool_use", 5),
        STOP,
    ]
    events = await collect(api, "emptyinput", sse(stream))
    assert events[1] == ToolUseReady(0, {**TOOL_BLOCK, "input": {}})
    assert isinstance(events[-1], MessageDone)
    assert events[-1].truncated_tool_use_ids == ()


@pytest.mark.parametrize(
    ("status", "etype", "message", "headers", "kind", "retryable", "retry_after"),
    [
        (
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
            {"retry-after": "7"},
            "rate_limited",
            True,
            7.0,
        ),
        (
            429,
            "rate_limit_error",
            "slow down",
            {"retry-after-ms": "1500", "retry-after": "9"},
            "rate_limited",
            True,
            1.5,
        ),
        (429, "rate_limit_error", "You have reached your spend limit.", {}, "billing", False, None),
        (529, "overloaded_error", "Overloaded", {}, "overloaded", True, None),
        (500, "api_error", "Internal server error", {}, "server", True, None),
        (503, "api_error", "Service unavailable", {}, "server", True, None),
        (408, "timeout_error", "Request timeout", {}, "server", True, None),
        (409, "api_error", "Conflict", {}, "server", True, None),
        (
            400,
            "invalid_request_error",
            'messages: first message must use the "user" role',
            {},
            "invalid_request",
            False,
            None,
        ),
        (
            400,
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API.",
            {},
            "billing",
            False,
            None,
        ),
        (401, "authentication_error", "invalid x-api-key", {}, "authentication", False, None),
        (403, "permission_error", "no access", {}, "permission", False, None),
        (404, "not_found_error", "model: nope", {}, "not_found", False, None),
        (
            413,
            "request_too_large",
            "Request exceeds the maximum size",
            {},
            "request_too_large",
            False,
            None,
        ),
        (500, "api_error", "boom", {"x-should-retry": "false"}, "server", False, None),
    ],
)
async def test_http_errors_are_classified(
    api: FakeAPI,
    status: int,
    etype: str,
    message: str,
    headers: dict[str, str],
    kind: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    scenario = f"err{status}{kind}{len(api.scenarios)}"
    events = await collect(api, scenario, error(status, etype, message, headers))
    assert len(events) == 1
    exc = events[0]
    assert isinstance(exc, ModelError)
    assert (exc.kind, exc.status, exc.retryable) == (kind, status, retryable)
    assert exc.retry_after == retry_after
    assert exc.message == message
    assert exc.request_id == "req_err"


async def test_prompt_too_long_carries_the_numbers(api: FakeAPI) -> None:
    message = "prompt is too long: 215034 tokens > 200000 maximum"
    events = await collect(api, "ptl", error(400, "invalid_request_error", message))
    exc = events[0]
    assert isinstance(exc, PromptTooLong)
    assert (exc.kind, exc.tokens, exc.maximum, exc.retryable) == (
        "prompt_too_long",
        215034,
        200000,
        False,
    )


async def test_error_event_inside_a_200_stream_is_classified_by_its_type(api: FakeAPI) -> None:
    stream = [
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text="Hel"),
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        STOP,
    ]
    events = await collect(api, "instream", sse(stream))
    assert isinstance(events[0], MessageStart)
    assert events[1] == TextDelta(0, "Hel")
    exc = events[-1]
    assert isinstance(exc, ModelError)
    assert (exc.kind, exc.status, exc.retryable, exc.message) == (
        "overloaded",
        200,
        True,
        "Overloaded",
    )
    assert exc.request_id == "req_stream"


async def test_connection_cut_mid_stream_is_stream_broken(api: FakeAPI) -> None:
    events = await collect(api, "cut", sse(FULL_STREAM, cut_after=3))
    assert events[:2] == [events[0], ThinkingDelta(0, "Let me")]
    exc = events[-1]
    assert isinstance(exc, ModelError)
    assert (exc.kind, exc.retryable, exc.request_id) == ("stream_broken", True, "req_stream")
    # Not wrapped by the SDK: the HTTP library's own error is the cause.
    assert isinstance(exc.__cause__, httpx2.RemoteProtocolError)


async def test_cut_before_any_event_is_a_connection_error(api: FakeAPI) -> None:
    events = await collect(api, "cut0", sse(FULL_STREAM, cut_after=0))
    assert len(events) == 1
    assert isinstance(events[0], ModelError)
    assert (events[0].kind, events[0].retryable) == ("connection", True)


async def test_stream_that_ends_cleanly_without_message_stop_is_broken(api: FakeAPI) -> None:
    events = await collect(api, "short", sse(FULL_STREAM[:9]))
    exc = events[-1]
    assert isinstance(exc, ModelError)
    assert exc.kind == "stream_broken"


async def test_stream_missing_only_message_stop_is_complete(api: FakeAPI) -> None:
    events = await collect(api, "nostop", sse(FULL_STREAM[:-1]))
    done = events[-1]
    assert isinstance(done, MessageDone)
    assert (done.stop_reason, done.usage["output_tokens"]) == ("tool_use", 42)


async def test_abandoned_stream_releases_its_connection(api: FakeAPI) -> None:
    gone = asyncio.Event()

    async def endless(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        writer.write(chunk(sse_bytes(message_start())))
        writer.write(chunk(sse_bytes(block_start(0, {"type": "text", "text": ""}))))
        try:
            for _ in range(500):
                writer.write(chunk(sse_bytes(delta(0, type="text_delta", text="x"))))
                await writer.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            gone.set()

    api.scenarios["endless"] = endless
    client = AnthropicClient(api_key="sk-ant-test", base_url=api.url("endless"), timeout=5)
    try:
        async with aclosing(client.stream(BODY)) as stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    break
        await asyncio.wait_for(gone.wait(), 3)
    finally:
        await client.aclose()


async def test_unreachable_api_is_a_retryable_connection_error() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    client = AnthropicClient(api_key="sk-ant-test", base_url=f"http://127.0.0.1:{port}", timeout=5)
    try:
        with pytest.raises(ModelError) as caught:
            async for _ in client.stream(BODY):
                pass
    finally:
        await client.aclose()
    assert (caught.value.kind, caught.value.retryable, caught.value.status) == (
        "connection",
        True,
        None,
    )


def test_assembler_closes_blocks_left_open_when_the_stream_stops() -> None:
    assembler = MessageAssembler("req_x")
    for event in [
        message_start(),
        block_start(0, TOOL_BLOCK),
        delta(0, type="input_json_delta", partial_json='{"a": 1}'),
        message_delta("tool_use", 3),
    ]:
        assembler.feed(event)
    out = assembler.feed(STOP)
    assert isinstance(out, list)
    ready, done = out
    assert ready == ToolUseReady(0, {**TOOL_BLOCK, "input": {"a": 1}})
    assert isinstance(done, MessageDone)
    assert done.content == [{**TOOL_BLOCK, "input": {"a": 1}}]


def test_assembler_keeps_citations_and_redacted_thinking() -> None:
    assembler = MessageAssembler()
    citation = {"type": "char_location", "cited_text": "x", "document_index": 0}
    for event in [
        message_start(),
        block_start(0, {"type": "redacted_thinking", "data": "EmwKAhgB"}),
        block_stop(0),
        block_start(1, {"type": "text", "text": "", "citations": None}),
        delta(1, type="citations_delta", citation=citation),
        delta(1, type="text_delta", text="quoted"),
        block_stop(1),
        message_delta("end_turn", 3),
    ]:
        assembler.feed(event)
    out = assembler.feed(STOP)
    assert isinstance(out, list)
    done = out[-1]
    assert isinstance(done, MessageDone)
    assert done.content == [
        {"type": "redacted_thinking", "data": "EmwKAhgB"},
        {"type": "text", "text": "quoted", "citations": [citation]},
    ]


async def test_make_model_client_follows_the_provider() -> None:
    offline = make_model_client(Settings(_env_file=None, model_provider="offline"))
    assert isinstance(offline, OfflineModel)
    online = make_model_client(
        Settings(_env_file=None, model_provider="anthropic", anthropic_api_key="sk-ant-test")
    )
    try:
        assert isinstance(online, AnthropicClient)
    finally:
        await online.aclose()


async def test_consecutive_streams_share_one_connection(fake: FakeAnthropic) -> None:
    """A stream read to `message_stop` leaves its connection to the next call (one
    closed before its end of body would be dropped, and every call would connect)."""
    fake.script(items.message("one"), items.message("two"), items.message("three"))
    client = AnthropicClient(api_key="sk-ant-test", base_url=fake.base_url, timeout=5)
    try:
        for _ in range(3):
            async with aclosing(client.stream(BODY)) as stream:
                events = [event async for event in stream]
            assert isinstance(events[-1], MessageDone)
    finally:
        await client.aclose()
    peers = [record["peer"] for record in fake.records[-3:]]
    assert None not in peers
    assert len(set(peers)) == 1, peers


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5))
def test_a_request_body_is_the_compact_utf8_json_of_the_standard_library(
    payload: dict[str, Any],
) -> None:
    stdlib = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    assert _encode(payload) == stdlib.encode()


def test_a_body_orjson_refuses_is_still_encoded() -> None:
    """A lone surrogate (from some client's JSON) is escaped; an integer past 64 bits is
    written as is."""
    payload = {"text": "a\ud800b", "n": 2**70}
    body = _encode(payload)
    assert json.loads(body) == payload
    assert b"\\ud800" in body
