"""A fake Anthropic Messages API speaking the real wire protocol.

``create_app(state)`` returns a Starlette app; ``FakeState`` holds the script queue, the
configuration, the prompt cache and the request log. See ``__init__.FakeAnthropic`` for the
in-process helper and ``__main__`` for running it as its own process.

API routes: ``POST /v1/messages`` (stream and non-stream), ``POST /v1/messages/count_tokens``.
Control routes: ``POST /_fake/script`` (a JSON list of items, appended to the queue),
``POST /_fake/reset``, ``GET|POST /_fake/config`` (POST merges settings),
``GET /_fake/requests`` (every API request with its outcome), ``GET /_fake/rejections``
(the ones that failed validation), ``GET /_fake/queue`` (items not yet used).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .cache import PromptCache
from .items import normalize_item
from .tokens import output_tokens, prompt_blocks
from .validate import ApiError, sign_thinking, validate_messages_request

__all__ = ["DEFAULT_CONFIG", "FakeConnectionDrop", "FakeState", "create_app"]

log = logging.getLogger("fake_anthropic")

DEFAULT_CONFIG: dict[str, Any] = {
    "max_context_tokens": 200_000,  # "prompt is too long" above this
    "min_cache_tokens": 1024,  # shorter prefixes are silently not cached
    "cache_ttl_seconds": 300.0,  # default ("5m") cache entry life
    "cache_ttl_1h_seconds": 3600.0,  # life of a {"ttl": "1h"} entry
    "cache_lookback_blocks": 20,  # a breakpoint finds cached prefixes up to N blocks back
    "clock_offset": 0.0,  # seconds added to time.monotonic() (simulate time passing)
    "first_token_delay": 0.0,  # stream: sleep after message_start; non-stream: before answer
    "chunk_delay": 0.0,  # stream: sleep between later events (0: one write for all)
    "text_chunk_chars": 16,  # characters per text_delta / thinking_delta
    "json_chunk_chars": 24,  # characters per input_json_delta after the first "" chunk
    "ping_every": 0,  # extra ping every N events (one ping after the first block start always)
    "max_request_bytes": 32 * 1024 * 1024,  # 413 request_too_large above this
    "api_key": None,  # when set, only this key is accepted (401 otherwise)
    "record_bodies": True,  # keep request bodies in the log (rejected ones are always kept)
    "max_records": 5000,  # the log keeps the newest N records (rejections are all kept)
}

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


class FakeConnectionDrop(Exception):
    """Raised inside a streaming answer to make uvicorn close the connection mid-body."""


class _QuietDrops(logging.Filter):
    """Keeps uvicorn from logging a traceback for each deliberate connection drop."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, FakeConnectionDrop)


_QUIET_DROPS = _QuietDrops()


def _rand_id(prefix: str, n: int = 24) -> str:
    raw = base64.b32encode(os.urandom(15)).decode().rstrip("=")
    return prefix + raw[:n]


def new_request_id() -> str:
    return _rand_id("req_011C")


def _dumps(obj: Any) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a scripted lone surrogate: send it escaped, as JSON allows
        return json.dumps(obj, separators=(",", ":")).encode()


class FakeState:
    """Everything the fake remembers. Shared between the server thread and test threads."""

    def __init__(self, **config: Any) -> None:
        self.lock = threading.Lock()
        self.config: dict[str, Any] = dict(DEFAULT_CONFIG)
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.cache = PromptCache()
        self.log: collections.deque[dict[str, Any]] = collections.deque(maxlen=5000)
        self.rejected: list[dict[str, Any]] = []
        self.responder: Callable[[dict[str, Any]], Any] | None = None
        self._seq = 0
        if config:
            self.configure(**config)

    # ---- configuration and script ----------------------------------------------------------
    def configure(self, **settings: Any) -> dict[str, Any]:
        unknown = sorted(set(settings) - set(DEFAULT_CONFIG))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(DEFAULT_CONFIG)}")
        with self.lock:
            # copy-on-write: request handlers read self.config without the lock
            self.config = {**self.config, **settings}
            if self.log.maxlen != int(self.config["max_records"]):
                self.log = collections.deque(self.log, maxlen=int(self.config["max_records"]))
            return dict(self.config)

    def script(self, items: Iterable[Any]) -> int:
        normalized = [normalize_item(item) for item in items]
        with self.lock:
            self.queue.extend(normalized)
            return len(self.queue)

    def reset(self) -> None:
        """Forgets the queue, the log, the cache, the responder, and restores the defaults."""
        with self.lock:
            self.queue.clear()
            self.config = dict(DEFAULT_CONFIG)
            self.log = collections.deque(maxlen=int(self.config["max_records"]))
            self.rejected.clear()
            self.cache.clear()
            self.responder = None

    def now(self) -> float:
        return time.monotonic() + float(self.config["clock_offset"])

    # ---- views --------------------------------------------------------------------------------
    @property
    def records(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.log)

    @property
    def rejections(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.rejected)

    @property
    def pending(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.queue)

    # ---- used by the handlers -------------------------------------------------------------
    def _add_record(self, record: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self._seq += 1
            record["seq"] = self._seq
            if not self.config["record_bodies"] and record["valid"]:
                record["body"] = None
            self.log.append(record)
            if not record["valid"]:
                self.rejected.append(record)
        return record

    def _take_item(self) -> dict[str, Any] | None:
        with self.lock:
            return self.queue.popleft() if self.queue else None

    def _apply_cache(self, body: dict[str, Any], blocks: list[Any]) -> dict[str, Any]:
        cfg = self.config
        with self.lock:
            return self.cache.apply(
                blocks,
                model=body["model"],
                now=self.now(),
                min_tokens=int(cfg["min_cache_tokens"]),
                lookback=int(cfg["cache_lookback_blocks"]),
                ttl_5m=float(cfg["cache_ttl_seconds"]),
                ttl_1h=float(cfg["cache_ttl_1h_seconds"]),
            )


# ---- answers ----------------------------------------------------------------------------------


def _error_response(err: ApiError, rid: str) -> Response:
    body = {"type": "error", "error": err.error_object(), "request_id": rid}
    headers = {"request-id": rid, **err.headers}
    return Response(_dumps(body), status_code=err.status, headers=headers, media_type=None)


def _json_response(obj: Any, rid: str | None = None, status: int = 200) -> Response:
    return Response(
        _dumps(obj),
        status_code=status,
        headers={"request-id": rid or new_request_id(), "content-type": "application/json"},
    )


def _item_error(item: dict[str, Any]) -> ApiError:
    headers: dict[str, str] = {}
    if item.get("retry_after") is not None:
        ra = item["retry_after"]
        headers["retry-after"] = str(int(ra)) if float(ra).is_integer() else str(ra)
    if item.get("retry_after_ms") is not None:
        headers["retry-after-ms"] = str(item["retry_after_ms"])
    if item.get("should_retry") is not None:
        headers["x-should-retry"] = "true" if item["should_retry"] else "false"
    headers.update({str(k).lower(): str(v) for k, v in (item.get("headers") or {}).items()})
    return ApiError(
        item["status"],
        item["error_type"],
        item["message"],
        headers=headers,
        details=item.get("details"),
    )


def _last_user_text(merged: list[tuple[str, list[Any]]]) -> str:
    for role, content in reversed(merged):
        if role != "user":
            continue
        texts = [b["text"] for b in content if b.get("type") == "text"]
        if texts:
            return texts[-1]
        for b in reversed(content):
            if b.get("type") == "tool_result":
                c = b.get("content")
                if isinstance(c, str):
                    return c
                if isinstance(c, list):
                    nested = [x.get("text", "") for x in c if x.get("type") == "text"]
                    if nested:
                        return nested[-1]
        return ""
    return ""


def _thinking_on(body: dict[str, Any]) -> bool:
    t = body.get("thinking")
    return isinstance(t, dict) and t.get("type") in ("enabled", "adaptive")


def _default_item(body: dict[str, Any], merged: list[tuple[str, list[Any]]]) -> dict[str, Any]:
    if body.get("max_tokens") == 0:
        return {"type": "message", "content": [], "stop_reason": "max_tokens"}
    user_text = _last_user_text(merged)
    content: list[dict[str, Any]] = []
    if _thinking_on(body):
        content.append({"type": "thinking", "thinking": f"The user wrote: {user_text[:40]}"})
    reply = f"Fake reply to: {user_text[:80]}"
    stop = "end_turn"
    max_chars = int(body.get("max_tokens") or 0) * 4
    if max_chars and len(reply) > max_chars:
        reply, stop = reply[:max_chars], "max_tokens"
    content.append({"type": "text", "text": reply})
    return {"type": "message", "content": content, "stop_reason": stop}


def _output_content(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text":
            out.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use":
            out.append(
                {
                    "type": "tool_use",
                    "id": block.get("id") or _rand_id("toolu_01", 22),
                    "name": block["name"],
                    "input": block.get("input") or {},
                }
            )
        elif kind == "thinking":
            sig = block.get("signature") or sign_thinking(block["thinking"])
            out.append({"type": "thinking", "thinking": block["thinking"], "signature": sig})
        elif kind == "redacted_thinking":
            data = block.get("data") or base64.b64encode(os.urandom(48)).decode()
            out.append({"type": "redacted_thinking", "data": data})
    return out


def _build_message(
    item: dict[str, Any],
    body: dict[str, Any],
    merged: list[tuple[str, list[Any]]],
    usage_in: dict[str, Any],
) -> dict[str, Any]:
    blocks = item.get("content")
    stop_reason = item.get("stop_reason")
    if blocks is None:
        default = _default_item(body, merged)
        blocks = default["content"]
        stop_reason = stop_reason or default["stop_reason"]
    content = _output_content(blocks)
    stop_reason = stop_reason or (
        "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    )
    out_tokens = (item.get("usage") or {}).get("output_tokens")
    if out_tokens is None:
        out_tokens = output_tokens(content) if content else 0
    usage = {
        "input_tokens": usage_in["input_tokens"],
        "cache_creation_input_tokens": usage_in["cache_creation_input_tokens"],
        "cache_read_input_tokens": usage_in["cache_read_input_tokens"],
        "cache_creation": dict(usage_in["cache_creation"]),
        "output_tokens": out_tokens,
        "service_tier": "standard",
    }
    return {
        "id": _rand_id("msg_01", 24),
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": item.get("stop_sequence"),
        "usage": usage,
    }


def _chunks(s: str, size: int) -> list[str]:
    size = max(1, size)
    return [s[i : i + size] for i in range(0, len(s), size)] or []


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _dumps(data) + b"\n\n"


PING = _event("ping", {"type": "ping"})


def stream_events(msg: dict[str, Any], cfg: dict[str, Any]) -> list[bytes]:
    """The SSE events of a message, in the real order."""
    usage = msg["usage"]
    start = {
        **msg,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1 if usage["output_tokens"] else 0},
    }
    events = [_event("message_start", {"type": "message_start", "message": start})]
    text_n = int(cfg["text_chunk_chars"])
    json_n = int(cfg["json_chunk_chars"])
    if not msg["content"]:
        events.append(PING)
    for index, block in enumerate(msg["content"]):
        kind = block["type"]
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": c} for c in _chunks(block["text"], text_n)]
        elif kind == "tool_use":
            first = {**block, "input": {}}
            raw = json.dumps(block["input"], ensure_ascii=False)
            deltas = [{"type": "input_json_delta", "partial_json": ""}]
            deltas += [
                {"type": "input_json_delta", "partial_json": c} for c in _chunks(raw, json_n)
            ]
        elif kind == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": c}
                for c in _chunks(block["thinking"], text_n)
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        else:  # redacted_thinking arrives whole in its start event
            first = block
        events.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": first},
            )
        )
        if index == 0:
            events.append(PING)
        for delta in deltas:
            events.append(
                _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": msg["stop_sequence"]},
                "usage": {
                    "input_tokens": usage["input_tokens"],
                    "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
                    "cache_read_input_tokens": usage["cache_read_input_tokens"],
                    "output_tokens": usage["output_tokens"],
                },
            },
        )
    )
    events.append(_event("message_stop", {"type": "message_stop"}))
    every = int(cfg["ping_every"])
    if every > 0:
        with_pings: list[bytes] = []
        for i, ev in enumerate(events):
            with_pings.append(ev)
            if (i + 1) % every == 0 and i + 1 < len(events):
                with_pings.append(PING)
        events = with_pings
    return events


class _StreamAnswer:
    """A raw ASGI answer: a chunked body written event by event, optionally cut short."""

    def __init__(
        self,
        chunks: list[bytes],
        headers: list[tuple[bytes, bytes]],
        *,
        status: int = 200,
        drop: bool = False,
        first_delay: float = 0.0,
        chunk_delay: float = 0.0,
    ) -> None:
        self.chunks = chunks
        self.headers = headers
        self.status = status
        self.drop = drop
        self.first_delay = first_delay
        self.chunk_delay = chunk_delay

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        chunks = self.chunks
        if self.first_delay or self.chunk_delay:
            for i, chunk in enumerate(chunks):
                if i == 1 and self.first_delay:
                    await asyncio.sleep(self.first_delay)
                elif i > 1 and self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if self.drop:
                raise FakeConnectionDrop
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if self.drop:
            if chunks:
                await send(
                    {"type": "http.response.body", "body": b"".join(chunks), "more_body": True}
                )
            raise FakeConnectionDrop
        await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": False})


# ---- request handling ---------------------------------------------------------------------------


async def _read_body(request: Request, limit: int) -> tuple[bytes | None, int]:
    """The body, or None when it is over the limit (the rest is drained, not kept)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) <= limit:
        data = await request.body()
        return data, len(data)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            parts.append(chunk)
        else:
            parts.clear()
    return (None if size > limit else b"".join(parts)), size


def _check_headers(request: Request, cfg: dict[str, Any]) -> None:
    key = request.headers.get("x-api-key")
    if key is None:
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
    if not key:
        raise ApiError(401, "authentication_error", "x-api-key header is required")
    if cfg["api_key"] is not None and key != cfg["api_key"]:
        raise ApiError(401, "authentication_error", "invalid x-api-key")
    if not request.headers.get("anthropic-version"):
        raise ApiError(400, "invalid_request_error", "anthropic-version: header is required")


async def _parse_request(
    request: Request, state: FakeState, rid: str, *, count_route: bool
) -> tuple[dict[str, Any], Any, list[Any], dict[str, Any]]:
    """Reads and validates; returns (record, body, merged messages, prompt blocks)."""
    cfg = state.config
    record: dict[str, Any] = {
        "path": request.url.path,
        "request_id": rid,
        # The client's end of the TCP connection: requests sharing one came over it.
        "peer": request.client.port if request.client is not None else None,
        "time": time.time(),
        "headers": {
            k: v
            for k in ("anthropic-version", "anthropic-beta", "x-stainless-retry-count")
            if (v := request.headers.get(k)) is not None
        },
        "body": None,
        "stream": False,
        "valid": False,
        "status": None,
        "error": None,
        "response": None,
        "usage": None,
    }
    raw, size = await _read_body(request, int(cfg["max_request_bytes"]))
    record["body_bytes"] = size
    try:
        _check_headers(request, cfg)
        if raw is None:
            raise ApiError(
                413, "request_too_large", "Request exceeds the maximum allowed number of bytes."
            )
        try:
            body = json.loads(raw)
        except ValueError:
            record["body"] = raw[:10_000].decode("utf-8", "replace")
            raise ApiError(
                400,
                "invalid_request_error",
                "There was an error parsing the body of your request: invalid JSON",
            ) from None
        record["body"] = body
        if isinstance(body, dict):
            record["stream"] = body.get("stream") is True
        merged = validate_messages_request(body, count_tokens_route=count_route)
        blocks = prompt_blocks(body)
        total = sum(b.tokens for b in blocks)
        record["input_tokens_total"] = total
        limit = int(cfg["max_context_tokens"])
        if not count_route and total > limit:
            raise ApiError(
                400,
                "invalid_request_error",
                f"prompt is too long: {total} tokens > {limit} maximum",
            )
    except ApiError as err:
        record["status"] = err.status
        record["error"] = err.error_object()
        state._add_record(record)
        raise
    record["valid"] = True
    state._add_record(record)  # in arrival order; the answer's fields are filled in later
    return record, body, merged, blocks


ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


async def messages_endpoint(request: Request) -> Any:
    state: FakeState = request.app.state.fake
    rid = new_request_id()
    try:
        record, body, merged, blocks = await _parse_request(request, state, rid, count_route=False)
    except ApiError as err:
        return _error_response(err, rid)
    cfg = state.config
    item = state._take_item()
    source = "script"
    if item is None and state.responder is not None:
        produced = state.responder(body)
        if produced is not None:
            item, source = normalize_item(produced), "responder"
    if item is None:
        item, source = {"type": "message"}, "default"
    record["response"] = item["type"]
    record["source"] = source

    if item.get("delay"):
        await asyncio.sleep(item["delay"])

    if item["type"] == "error":
        err = _item_error(item)
        record["status"] = err.status
        record["error"] = err.error_object()
        return _error_response(err, rid)

    usage_in = state._apply_cache(body, blocks)
    msg = _build_message(item, body, merged, usage_in)
    record["usage"] = {
        k: msg["usage"][k]
        for k in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "cache_creation",
            "output_tokens",
        )
    }
    record["status"] = 200
    record["message"] = msg

    first_delay = float(cfg["first_token_delay"])
    chunk_delay = float(cfg["chunk_delay"])
    if item["type"] == "stream_error":
        record["error"] = {"type": item["error_type"], "message": item["message"]}
    if not body.get("stream"):
        if item["type"] == "stream_error":  # without a stream, it is a plain HTTP error
            err = ApiError(
                ERROR_STATUS.get(item["error_type"], 500), item["error_type"], item["message"]
            )
            record["status"] = err.status
            return _error_response(err, rid)
        if first_delay:
            await asyncio.sleep(first_delay)
        data = _dumps(msg)
        if item["type"] == "drop":
            headers = [
                *JSON_HEADERS,
                (b"content-length", str(len(data)).encode()),
                (b"request-id", rid.encode()),
            ]
            return _StreamAnswer([data[: len(data) // 2]], headers, drop=True)
        return Response(data, headers={"request-id": rid, "content-type": "application/json"})

    events = stream_events(msg, cfg)
    drop = False
    if item["type"] == "stream_error":
        error_body = {
            "type": "error",
            "error": {"type": item["error_type"], "message": item["message"]},
            "request_id": rid,
        }
        events = [*events[: item["after_events"]], _event("error", error_body)]
    elif item["type"] == "drop":
        events = events[: item["after_events"]]
        drop = True
    headers = [*SSE_HEADERS, (b"request-id", rid.encode())]
    return _StreamAnswer(
        events, headers, drop=drop, first_delay=first_delay, chunk_delay=chunk_delay
    )


async def count_tokens_endpoint(request: Request) -> Response:
    state: FakeState = request.app.state.fake
    rid = new_request_id()
    try:
        record, _body, _merged, blocks = await _parse_request(request, state, rid, count_route=True)
    except ApiError as err:
        return _error_response(err, rid)
    total = sum(b.tokens for b in blocks)
    record["status"] = 200
    record["response"] = "count_tokens"
    record["usage"] = {"input_tokens": total}
    return _json_response({"input_tokens": total}, rid)


# ---- control routes -----------------------------------------------------------------------------


async def _control_json(request: Request) -> Any:
    raw = await request.body()
    return json.loads(raw) if raw.strip() else None


def _control_error(message: str) -> Response:
    return _error_response(ApiError(400, "invalid_request_error", message), new_request_id())


async def script_endpoint(request: Request) -> Response:
    state: FakeState = request.app.state.fake
    try:
        items = await _control_json(request)
        if isinstance(items, dict | str):
            items = [items]
        if not isinstance(items, list):
            raise ValueError("the body must be a JSON list of script items")
        queued = state.script(items)
    except ValueError as exc:
        return _control_error(str(exc))
    return _json_response({"queued": queued})


async def reset_endpoint(request: Request) -> Response:
    request.app.state.fake.reset()
    return _json_response({"ok": True})


async def config_endpoint(request: Request) -> Response:
    state: FakeState = request.app.state.fake
    if request.method == "GET":
        return _json_response(dict(state.config))
    try:
        settings = await _control_json(request) or {}
        if not isinstance(settings, dict):
            raise ValueError("the body must be a JSON object of settings")
        return _json_response(state.configure(**settings))
    except ValueError as exc:
        return _control_error(str(exc))


async def requests_endpoint(request: Request) -> Response:
    return _json_response(request.app.state.fake.records)


async def rejections_endpoint(request: Request) -> Response:
    return _json_response(request.app.state.fake.rejections)


async def queue_endpoint(request: Request) -> Response:
    return _json_response(request.app.state.fake.pending)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    error_type = {404: "not_found_error", 405: "invalid_request_error"}.get(status, "api_error")
    message = {404: "Not found", 405: "Method not allowed"}.get(status, "Internal server error")
    return _error_response(ApiError(status, error_type, message), new_request_id())


def _guard(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """A bug in the fake answers 500 api_error (with a request-id) and logs the traceback."""

    async def guarded(request: Request) -> Any:
        try:
            return await endpoint(request)
        except Exception:
            log.exception("bug in the fake Anthropic server")
            return _error_response(
                ApiError(500, "api_error", "Internal server error"), new_request_id()
            )

    return guarded


def create_app(state: FakeState | None = None) -> Starlette:
    """The fake as a Starlette app; ``app.state.fake`` is its FakeState."""
    logging.getLogger("uvicorn.error").addFilter(_QUIET_DROPS)
    app = Starlette(
        routes=[
            Route("/v1/messages", _guard(messages_endpoint), methods=["POST"]),
            Route("/v1/messages/count_tokens", _guard(count_tokens_endpoint), methods=["POST"]),
            Route("/_fake/script", _guard(script_endpoint), methods=["POST"]),
            Route("/_fake/reset", _guard(reset_endpoint), methods=["POST"]),
            Route("/_fake/config", _guard(config_endpoint), methods=["GET", "POST"]),
            Route("/_fake/requests", _guard(requests_endpoint), methods=["GET"]),
            Route("/_fake/rejections", _guard(rejections_endpoint), methods=["GET"]),
            Route("/_fake/queue", _guard(queue_endpoint), methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
    )
    app.state.fake = state if state is not None else FakeState()
    return app
