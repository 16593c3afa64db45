"""A deterministic offline stand-in for the model. It is NOT a language model.

It exists so the service runs without an API key (development, demos) and so client
integration tests get exact, repeatable answers. It takes the same Messages API body
as the Anthropic client, produces the same wire events (run through the same
`MessageAssembler`, so deltas, tool uses and truncation behave identically) and never
does I/O. Replies are built mechanically from the request:

- By default it answers ``Offline model (not a language model). You said: <text>``,
  quoting the last user message (command lines removed), in several small text
  deltas, ``stop_reason`` ``end_turn``.
- ``/tool <Name> <json input>`` on a line of the last user message calls tool
  ``<Name>`` with that input (``{}`` when omitted). Several such lines make parallel
  calls. Tools missing from ``body["tools"]`` and inputs that are not a JSON object
  are ignored (the echo reply then says why). The reply holds only the tool_use
  blocks, ``stop_reason`` ``tool_use``.
- When the last user message holds ``tool_result`` blocks it answers with text like
  ``Tool Read returned 12 lines.`` plus the first line of each result, ``end_turn``.
- ``/think`` makes every reply of that turn start with a thinking block (with a fake
  signature), but only when the body enables thinking.
- ``/long N`` replies with about N tokens of filler text (N*4 characters).
- A compaction request (the last user message contains ``SUMMARY_MARKER`` from
  ``app.context.summary_prompt``) gets an extractive summary: ``<summary>`` with the
  nine fixed section headings, filled with lines quoted from the conversation (the
  messages, and a ``<transcript>`` in the instruction when the conversation was sent
  as text), then ``</summary>``.
- A request ending with an assistant message (prefill, e.g. a ``max_tokens``
  continuation) gets the rest of the reply that message started.

Every reply respects ``max_tokens`` at 4 characters a token: past it, output stops
with ``stop_reason`` ``max_tokens`` (a tool input cut that way is reported as
truncated). Usage: input tokens are the body's JSON length / 4, output tokens the
produced characters / 4; no caching. The same body always gives the same events,
ids included (they derive from a hash of the body).

This module decides which reply a body gets; `offline_replies` and `offline_summary`
compose them, `offline_wire` turns them into stream events.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Final

from .assembler import MessageAssembler
from .client import ModelClient
from .events import StreamEvent
from .offline_messages import blocks_of, text_of
from .offline_replies import (
    ECHO_PREFIX,
    describe_results,
    echo,
    filler,
    long_request_tokens,
    prompt_text,
    thinking_blocks,
    tool_calls,
    tool_names,
)
from .offline_summary import (
    SUMMARY_HEADINGS,
    extractive_summary,
    summary_marker,
    transcript_messages,
)
from .offline_wire import CHARS_PER_TOKEN, ReplyBlock, render_wire_events

__all__ = ["CHARS_PER_TOKEN", "SUMMARY_HEADINGS", "OfflineModel", "WireReply", "summary_marker"]

_DEFAULT_MAX_TOKENS: Final = 4096


class OfflineModel(ModelClient):
    """A deterministic stand-in for Claude that is NOT a language model (see module doc).

    `delay` (seconds) pauses between streamed events, to watch text arrive; the
    service and the tests use 0, which still yields to the event loop between events.
    """

    def __init__(self, *, delay: float = 0.0) -> None:
        self._delay = delay

    async def aclose(self) -> None:
        return None

    async def stream(self, body: dict[str, Any]) -> AsyncGenerator[StreamEvent, None]:
        events = self.wire_events(body)
        assembler = MessageAssembler(events.request_id)
        for raw in events.items:
            out = assembler.feed(raw)
            if out is None:
                continue
            if isinstance(out, list):
                for item in out:
                    yield item
            else:
                yield out
                await asyncio.sleep(self._delay)

    def wire_events(self, body: dict[str, Any]) -> WireReply:
        """The reply as Messages API stream events (dicts), plus its request id."""
        canonical = json.dumps(body, ensure_ascii=False, sort_keys=True, default=str)
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        blocks, stop_reason = self._plan(body)
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            max_tokens = _DEFAULT_MAX_TOKENS
        return WireReply(
            request_id=f"req_offline_{digest[:24]}",
            items=render_wire_events(
                blocks,
                stop_reason,
                message_id=f"msg_offline_{digest[:24]}",
                tool_id_prefix=f"toolu_offline_{digest[:12]}_",
                input_tokens=max(1, len(canonical) // CHARS_PER_TOKEN),
                budget=max_tokens * CHARS_PER_TOKEN,
            ),
        )

    # -- deciding what to say --------------------------------------------------------

    def _plan(self, body: dict[str, Any]) -> tuple[list[ReplyBlock], str]:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        if not messages:
            return [ReplyBlock("text", text=ECHO_PREFIX + "You sent no messages.")], "end_turn"
        last = messages[-1]
        if last.get("role") == "assistant":
            return self._continue(body, messages), "end_turn"
        marker = summary_marker()
        instruction = text_of(last.get("content"))
        if marker in instruction:
            history = [*transcript_messages(instruction), *messages]
            return [ReplyBlock("text", text=extractive_summary(history, marker))], "end_turn"

        prompt = prompt_text(messages)
        thinking = thinking_blocks(body, prompt)
        last_text = text_of(last.get("content"))
        calls, ignored = tool_calls(last_text, tool_names(body))
        if calls:
            return [*thinking, *calls], "tool_use"
        results = blocks_of(last.get("content"), "tool_result")
        if results:
            text = describe_results(results, messages)
            return [*thinking, ReplyBlock("text", text=text)], "end_turn"
        long_tokens = long_request_tokens(last_text)
        if long_tokens is not None:
            return [*thinking, ReplyBlock("text", text=filler(long_tokens))], "end_turn"
        return [*thinking, ReplyBlock("text", text=echo(last_text, ignored))], "end_turn"

    def _continue(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> list[ReplyBlock]:
        """Prefill: the rest of the text the request without the prefill would get."""
        started = text_of(messages[-1].get("content"))
        blocks, _ = self._plan({**body, "messages": messages[:-1]})
        text = "".join(b.text for b in blocks if b.kind == "text")
        rest = text[len(started) :] if text.startswith(started) else text
        return [ReplyBlock("text", text=rest)] if rest else []


@dataclass(frozen=True, slots=True)
class WireReply:
    """A reply as the Messages API would stream it: SSE event payloads in order."""

    request_id: str
    items: list[dict[str, Any]]
