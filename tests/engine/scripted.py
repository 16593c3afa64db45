"""A scripted `ModelClient` for tests of the engine below HTTP.

It replays what a test scripts, one item per model call (each retry is a call):

- a reply (`reply(...)`, or a bare string for a one-text-block reply) is streamed as
  `app.engine.llm.events` values: `MessageStart`, text and thinking deltas in small
  chunks, `ToolUseReady` for each complete tool use, then `MessageDone`;
- a `ModelError` (`rate_limited()`, `overloaded()`, `prompt_too_long(...)`, ...) fails
  the call before any event;
- `broken(reply, after=N)` streams N events of the reply, then fails (`stream_broken`
  by default), as a dropped connection does;
- `held(reply, after=N)` streams N events and then waits until the test releases it
  (`Gate.release()`), so a test can cancel a run in the middle of a stream.

When the script is empty, `responder(body)` (if set) decides the item. Every request body
is recorded (`requests`) and checked with `validate_api_messages`; an invalid one is
refused with a 400-like `ModelError`, as the API would, and kept in `rejected`.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from app.context.normalize import validate_api_messages
from app.engine.llm.errors import ModelError, PromptTooLong
from app.engine.llm.events import (
    MessageDone,
    MessageStart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseReady,
)

Block: TypeAlias = dict[str, Any]

_ids = itertools.count(1)


# --- content blocks ------------------------------------------------------------------


def text(value: str) -> Block:
    return {"type": "text", "text": value}


def thinking(value: str, signature: str | None = None) -> Block:
    return {"type": "thinking", "thinking": value, "signature": signature or f"sig-{next(_ids)}"}


def tool_use(name: str, input: dict[str, Any] | None = None, *, id: str | None = None) -> Block:
    return {
        "type": "tool_use",
        "id": id or f"toolu_{next(_ids):04d}",
        "name": name,
        "input": input or {},
    }


def cut_tool_use(name: str, *, id: str | None = None) -> Block:
    """A tool use whose input JSON the output limit cut off: it reaches the loop with
    `input: {}` and its id in `MessageDone.truncated_tool_use_ids`, never as ready."""
    return {**tool_use(name, id=id), "_truncated": True}


# --- script items --------------------------------------------------------------------


@dataclass
class Reply:
    content: list[Block]
    stop_reason: str | None = None  # default: tool_use when there is one, else end_turn
    usage: dict[str, int] | None = None  # default: counted from the body and the reply
    chunk: int = 8  # characters per text or thinking delta


def reply(
    *blocks: Block | str,
    stop_reason: str | None = None,
    usage: dict[str, int] | None = None,
    chunk: int = 8,
) -> Reply:
    """A whole response; strings are text blocks."""
    content = [text(b) if isinstance(b, str) else b for b in blocks]
    return Reply(content, stop_reason, usage, chunk)


@dataclass
class Broken:
    """Stream `after` events of `reply`, then fail with `error`."""

    reply: Reply
    after: int
    error: ModelError


def broken(what: Reply | str, *, after: int = 3, error: ModelError | None = None) -> Broken:
    return Broken(
        what if isinstance(what, Reply) else reply(what),
        after,
        error or ModelError("stream_broken", "connection dropped mid-stream"),
    )


@dataclass
class Gate:
    """Stream `after` events of `reply` (negative: all but that many at the end, so -1
    stops just before `MessageDone`), then wait for `release()`. `reached` is set when
    the stream stops there."""

    reply: Reply
    after: int
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    abandoned: asyncio.Event = field(default_factory=asyncio.Event)  # closed while held

    def release(self) -> None:
        self.released.set()


def held(what: Reply | str, *, after: int = 2) -> Gate:
    return Gate(what if isinstance(what, Reply) else reply(what), after)


# --- errors, as the client classifies them ----------------------------------------------


def rate_limited(retry_after: float | None = None) -> ModelError:
    return ModelError(
        "rate_limited", "rate limit", status=429, retry_after=retry_after, request_id="req_429"
    )


def overloaded() -> ModelError:
    return ModelError("overloaded", "Overloaded", status=529, request_id="req_529")


def server_error() -> ModelError:
    return ModelError("server", "Internal server error", status=500, request_id="req_500")


def bad_request(message: str = "some invalid_request_error") -> ModelError:
    return ModelError("invalid_request", message, status=400, request_id="req_400")


def prompt_too_long(tokens: int = 0, maximum: int = 0) -> PromptTooLong:
    message = "prompt is too long" + (f": {tokens} tokens > {maximum} maximum" if tokens else "")
    return PromptTooLong(message, tokens=tokens, maximum=maximum, request_id="req_ptl")


Item: TypeAlias = Reply | str | ModelError | Broken | Gate
Responder: TypeAlias = Callable[[dict[str, Any]], Item]


# --- the model -------------------------------------------------------------------------


def last_user_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    return " ".join(b.get("text", "") for b in content if b.get("type") == "text")


class ScriptedModel:
    """A `ModelClient` replaying a script (see the module doc)."""

    def __init__(self, *items: Item, responder: Responder | None = None) -> None:
        self.queue: list[Item] = list(items)
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.rejected: list[tuple[dict[str, Any], list[str]]] = []
        self.unscripted: list[dict[str, Any]] = []
        self.closed = False

    def script(self, *items: Item) -> None:
        self.queue.extend(items)

    @property
    def left(self) -> int:
        return len(self.queue)

    async def aclose(self) -> None:
        self.closed = True

    async def stream(self, body: dict[str, Any]) -> AsyncGenerator[StreamEvent, None]:
        recorded = copy.deepcopy(body)
        self.requests.append(recorded)
        problems = validate_api_messages(recorded.get("messages") or [])
        if not recorded.get("model") or not isinstance(recorded.get("max_tokens"), int):
            problems.append("model and max_tokens are required")
        if problems:
            self.rejected.append((recorded, problems))
            raise ModelError("invalid_request", f"invalid request: {problems}", status=400)
        item = self._next(recorded)
        if isinstance(item, ModelError):
            raise item
        n = len(self.requests)
        if isinstance(item, Broken):
            for event in render(item.reply, recorded, n)[: item.after]:
                yield event
            raise item.error
        if isinstance(item, Gate):
            events = render(item.reply, recorded, n)
            for event in events[: item.after]:
                yield event
            item.reached.set()
            try:
                await item.released.wait()
            except BaseException:  # the caller stopped reading (closed the request)
                item.abandoned.set()
                raise
            for event in events[item.after :]:
                yield event
            return
        for event in render(item if isinstance(item, Reply) else reply(item), recorded, n):
            yield event
            await asyncio.sleep(0)

    def _next(self, body: dict[str, Any]) -> Item:
        if self.queue:
            return self.queue.pop(0)
        if self.responder is not None:
            return self.responder(body)
        self.unscripted.append(body)
        return bad_request("the script has no reply left for this request")


def _chunks(value: str, size: int) -> list[str]:
    return [value[i : i + size] for i in range(0, len(value), size)] or [""]


def render(spec: Reply, body: dict[str, Any], n: int) -> list[StreamEvent]:
    """The events a client yields for `spec` answering `body` (the `n`th request)."""
    model = str(body.get("model"))
    message_id = f"msg_scripted_{n}"
    content: list[Block] = []
    truncated: list[str] = []
    events: list[StreamEvent] = []
    produced = 0
    for index, raw in enumerate(spec.content):
        block = {k: v for k, v in copy.deepcopy(raw).items() if k != "_truncated"}
        content.append(block)
        kind = block["type"]
        if kind == "text":
            produced += len(block["text"])
            events += [TextDelta(index, piece) for piece in _chunks(block["text"], spec.chunk)]
        elif kind == "thinking":
            produced += len(block["thinking"])
            events += [
                ThinkingDelta(index, piece) for piece in _chunks(block["thinking"], spec.chunk)
            ]
        elif kind == "tool_use":
            if raw.get("_truncated"):
                block["input"] = {}
                truncated.append(block["id"])
            else:
                produced += len(json.dumps(block["input"]))
                events.append(ToolUseReady(index, block))
    stop_reason = spec.stop_reason or (
        "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    )
    usage = {
        "input_tokens": max(1, len(json.dumps(body)) // 4),
        "output_tokens": max(1, produced // 4),
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    usage.update(spec.usage or {})
    start = MessageStart(message_id, model, {**usage, "output_tokens": 1})
    done = MessageDone(
        content=content,
        stop_reason=stop_reason,
        stop_sequence=None,
        usage=usage,
        model=model,
        message_id=message_id,
        request_id=f"req_scripted_{n}",
        truncated_tool_use_ids=tuple(truncated),
    )
    return [start, *events, done]
