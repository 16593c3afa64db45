"""The model client seam: one streamed response per call, as `StreamEvent`s.

`AnthropicClient` sends the Messages API body it is given, unchanged, and turns the raw
SSE events into `events.py` values. It reads raw events (`AsyncStream.raw_events`)
instead of iterating the SDK's typed stream: that skips building a pydantic model per
delta on the hot path, and it posts the body as pre-serialised JSON so the SDK does not
walk and copy a large history before sending it. The SDK still owns the connection
pool, auth headers, `anthropic-version` and the mapping of HTTP errors to exceptions.

There are no retries here (the SDK's are off too): callers retry, because only the
agent loop can tell the client to discard a partially shown message first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson

from .assembler import MessageAssembler
from .errors import ModelError, error_from_body, error_from_exception
from .events import StreamEvent

# How long a finished stream's end of body is waited for (it follows at once).
END_OF_BODY_SECONDS = 1.0

if TYPE_CHECKING:
    import anthropic

    from app.config import Settings

__all__ = ["AnthropicClient", "ModelClient"]


@runtime_checkable
class ModelClient(Protocol):
    """Streams one model response; the caller owns retries.

    `stream` returns an async generator (an `AsyncIterator` that also has `aclose`):
    iterate it inside `contextlib.aclosing(...)`, or run it to the end, so an
    abandoned stream releases its connection at once. It raises `ModelError` for
    every failure, including ones after events were yielded.
    """

    def stream(self, body: dict[str, Any]) -> AsyncGenerator[StreamEvent, None]: ...

    async def aclose(self) -> None: ...


class AnthropicClient:
    """`ModelClient` over the Anthropic Messages API (official SDK, SDK retries off)."""

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        # Imported here: the SDK takes seconds to import, which the offline provider
        # and the pure modules of this package should not pay.
        import anthropic
        import httpx2

        # A short connect timeout fails fast on an unreachable API; `timeout` bounds
        # each read, i.e. the longest silence tolerated inside a stream.
        self._sdk: anthropic.AsyncAnthropic = anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=base_url,
            max_retries=0,
            timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)),
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> AnthropicClient:
        key = settings.anthropic_api_key
        return cls(
            api_key=key.get_secret_value() if key is not None else None,
            base_url=settings.anthropic_base_url,
            timeout=settings.model_timeout_seconds,
        )

    async def stream(self, body: dict[str, Any]) -> AsyncGenerator[StreamEvent, None]:
        """POST `body` with `stream: true` and yield its events; one attempt, no retries.

        A `betas` list in the body, which the API does not accept as a field, is sent
        as the `anthropic-beta` header instead, as the SDK's beta client does.
        """
        payload = dict(body)
        payload["stream"] = True
        headers: dict[str, str] = {}
        betas = payload.pop("betas", None)
        if betas:
            headers["anthropic-beta"] = ",".join(betas)
        content = _encode(payload)
        from anthropic import AsyncStream  # loaded by __init__ already: a dict lookup

        try:
            opened = await self._sdk.post(
                "/v1/messages",
                cast_to=object,
                content=content,
                options={"headers": headers},
                stream=True,
                stream_cls=AsyncStream[object],
            )
        except Exception as exc:
            raise error_from_exception(exc) from exc
        response = opened.response
        assembler = MessageAssembler(response.headers.get("request-id"))
        raw_events = AsyncStream.raw_events(response)
        stopped = False  # message_stop arrived
        try:
            async for sse in raw_events:
                data = sse.data
                if not data:
                    continue
                if sse.event == "error":
                    raise _stream_error(data, assembler.request_id)
                try:
                    out = assembler.feed(json.loads(data))
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise ModelError(
                        "stream_broken" if assembler.started else "connection",
                        f"malformed model stream event {sse.event!r}: {type(exc).__name__}: {exc}",
                        request_id=assembler.request_id,
                    ) from exc
                if out is None:
                    continue
                if isinstance(out, list):
                    stopped = True
                    for item in out:
                        yield item
                    return
                yield out
        except ModelError:
            raise
        except Exception as exc:
            error = error_from_exception(exc, events_seen=assembler.started)
            error.request_id = error.request_id or assembler.request_id
            raise error from exc
        finally:
            if stopped:
                await _read_to_end(raw_events)
            # Close the decoder generators now rather than whenever they are collected.
            close = getattr(raw_events, "aclose", None)
            if close is not None:
                await close()
            await response.aclose()
        if assembler.started and assembler.stop_reason is not None:
            # Everything but message_stop arrived: the message is complete.
            for item in assembler.finish():
                yield item
            return
        raise ModelError(
            "stream_broken" if assembler.started else "connection",
            "model stream ended before message_stop",
            request_id=assembler.request_id,
        )

    async def aclose(self) -> None:
        await self._sdk.close()


async def _read_to_end(events: AsyncIterator[Any]) -> None:
    """Read what follows `message_stop` (the end of the body) for a moment: a response
    read to its end leaves its connection to the next call, one closed before is
    dropped, and the next call pays a new connection (and TLS handshake)."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(END_OF_BODY_SECONDS):
            async for _ in events:
                pass


def _encode(payload: dict[str, Any]) -> bytes:
    """The request body as compact UTF-8 JSON. orjson: the body holds the whole view, and
    encoding it is the largest piece of Python work before the model is called."""
    try:
        return orjson.dumps(payload)
    except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a lone surrogate
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        try:
            return text.encode()
        except UnicodeEncodeError:  # a lone surrogate from some client's JSON: escape it
            return json.dumps(payload, separators=(",", ":")).encode()


def _stream_error(data: str, request_id: str | None) -> ModelError:
    try:
        body: object = json.loads(data)
    except ValueError:
        body = data
    return error_from_body(200, body, request_id=request_id, fallback_message=data)
