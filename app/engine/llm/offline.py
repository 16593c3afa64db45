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
  are ignored (the text reply then says why). The reply holds only the tool_use
  blocks, ``stop_reason`` ``tool_use``.
- When the last user message holds ``tool_result`` blocks it answers with text like
  ``Tool Read returned 12 lines.`` plus the first line of each result, ``end_turn``.
- ``/think`` makes every reply of that turn start with a thinking block (with a fake
  signature), but only when the body enables thinking.
- ``/long N`` replies with about N tokens of filler text (N*4 characters).
- A compaction request (the last user message contains ``SUMMARY_MARKER`` from
  ``app.context.summary_prompt``, or ``<summary>`` while that module is absent) gets
  an extractive summary: ``<summary>`` with the nine fixed section headings, filled
  with lines quoted from the conversation (the messages, and a ``<transcript>`` in
  the instruction when the conversation was sent as text), then ``</summary>``.
- A request ending with an assistant message (prefill, e.g. a ``max_tokens``
  continuation) gets the rest of the reply that message started.

Every reply respects ``max_tokens`` at 4 characters a token: past it, output stops
with ``stop_reason`` ``max_tokens`` (a tool input cut that way is reported as
truncated). Usage: input tokens are the body's JSON length / 4, output tokens the
produced characters / 4; no caching. The same body always gives the same events,
ids included (they derive from a hash of the body).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import re
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import Any, Final

from .assembler import MessageAssembler
from .client import ModelClient
from .events import StreamEvent
from .models import OFFLINE_MODEL

__all__ = ["CHARS_PER_TOKEN", "SUMMARY_HEADINGS", "OfflineModel", "WireReply", "summary_marker"]

CHARS_PER_TOKEN: Final = 4
SUMMARY_HEADINGS: Final = (
    "1. Primary Request and Intent",
    "2. Key Technical Concepts",
    "3. Files and Code Sections",
    "4. Errors and fixes",
    "5. Problem Solving",
    "6. All user messages",
    "7. Pending Tasks",
    "8. Current Work",
    "9. Optional Next Step",
)
_FALLBACK_MARKER: Final = "<summary>"
_TEXT_CHUNK: Final = 24  # characters per text delta, at word boundaries
_JSON_CHUNK: Final = 16
_DEFAULT_MAX_TOKENS: Final = 4096
_MAX_LONG_TOKENS: Final = 128_000  # above any model's max_tokens
_TOOL_LINE = re.compile(r"^\s*/tool\s+(\S+)(?:\s+(.*?))?\s*$")
_LONG_LINE = re.compile(r"^\s*/long\s+(\d+)\s*$")
_THINK_LINE = re.compile(r"^\s*/think\s*$")
_PATH_KEYS: Final = ("file_path", "path", "notebook_path")


def summary_marker() -> str:
    """The compaction marker, read lazily: its module may not exist yet."""
    try:
        module = importlib.import_module("app.context.summary_prompt")
    except ImportError:
        return _FALLBACK_MARKER
    marker = getattr(module, "SUMMARY_MARKER", None)
    return marker if isinstance(marker, str) and marker else _FALLBACK_MARKER


@dataclass(frozen=True, slots=True)
class _Block:
    kind: str  # "thinking" | "text" | "tool_use"
    text: str = ""
    name: str = ""
    input: dict[str, Any] | None = None


def _text_of(content: object, *, skip: str | None = None) -> str:
    """The text of a message's content; text blocks containing `skip` are left out."""
    if isinstance(content, str):
        return "" if skip and skip in content else content
    if not isinstance(content, list):
        return ""
    texts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str) and not (skip and skip in text):
                texts.append(text)
    return "\n".join(texts)


def _blocks_of(content: object, btype: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == btype]


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return _text_of(content)


def _quote(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return json.dumps(flat, ensure_ascii=False)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _chunks(text: str, size: int) -> Iterator[str]:
    """Pieces of about `size` characters, ending after a space when one is near."""
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            space = text.find(" ", end, start + 2 * size)
            if space != -1:
                end = space + 1
        yield text[start:end]
        start = end


class OfflineModel(ModelClient):
    """A deterministic stand-in for Claude that is NOT a language model (see module doc).

    `delay` pauses between deltas (seconds) so a playground shows text arriving;
    tests leave it at 0, which still yields to the event loop between deltas.
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
            items=_render(
                blocks,
                stop_reason,
                message_id=f"msg_offline_{digest[:24]}",
                tool_id_prefix=f"toolu_offline_{digest[:12]}_",
                input_tokens=max(1, len(canonical) // CHARS_PER_TOKEN),
                budget=max_tokens * CHARS_PER_TOKEN,
            ),
        )

    # -- deciding what to say --------------------------------------------------------

    def _plan(self, body: dict[str, Any]) -> tuple[list[_Block], str]:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        if not messages:
            return [_Block("text", text=_ECHO_PREFIX + "You sent no messages.")], "end_turn"
        last = messages[-1]
        if last.get("role") == "assistant":
            return self._continue(body, messages), "end_turn"
        marker = summary_marker()
        instruction = _text_of(last.get("content"))
        if marker in instruction:
            history = [*_transcript_messages(instruction), *messages]
            return [_Block("text", text=_summary(history, marker))], "end_turn"

        prompt = _prompt_text(messages)
        thinking = _thinking_block(body, prompt)
        last_text = _text_of(last.get("content"))
        calls, ignored = _tool_calls(last_text, _tool_names(body))
        if calls:
            return [*thinking, *calls], "tool_use"
        results = _blocks_of(last.get("content"), "tool_result")
        if results:
            text = _describe_results(results, messages)
            return [*thinking, _Block("text", text=text)], "end_turn"
        long_tokens = _long_request(last_text)
        if long_tokens is not None:
            return [*thinking, _Block("text", text=_filler(long_tokens))], "end_turn"
        return [*thinking, _Block("text", text=_echo(last_text, ignored))], "end_turn"

    def _continue(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> list[_Block]:
        """Prefill: the rest of the text the request without the prefill would get."""
        started = _text_of(messages[-1].get("content"))
        blocks, _ = self._plan({**body, "messages": messages[:-1]})
        text = "".join(b.text for b in blocks if b.kind == "text")
        rest = text[len(started) :] if text.startswith(started) else text
        return [_Block("text", text=rest)] if rest else []


@dataclass(frozen=True, slots=True)
class WireReply:
    """A reply as the Messages API would stream it: SSE event payloads in order."""

    request_id: str
    items: list[dict[str, Any]]


_ECHO_PREFIX: Final = "Offline model (not a language model). "


def _prompt_text(messages: list[dict[str, Any]]) -> str:
    """Text of the newest user message that has any: the turn's prompt."""
    for message in reversed(messages):
        if message.get("role") == "user":
            text = _text_of(message.get("content"))
            if text:
                return text
    return ""


def _thinking_enabled(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def _thinking_block(body: dict[str, Any], prompt: str) -> list[_Block]:
    if not _thinking_enabled(body):
        return []
    if not any(_THINK_LINE.match(line) for line in prompt.splitlines()):
        return []
    text = (
        "Offline thinking (a fixed template, not reasoning): the prompt has "
        f"{_plural(len(prompt), 'character')} on {_plural(len(prompt.splitlines()), 'line')}."
    )
    return [_Block("thinking", text=text)]


def _tool_names(body: dict[str, Any]) -> set[str]:
    tools = body.get("tools") or []
    return {t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)}


def _tool_calls(text: str, available: set[str]) -> tuple[list[_Block], list[str]]:
    calls: list[_Block] = []
    ignored: list[str] = []
    for line in text.splitlines():
        match = _TOOL_LINE.match(line)
        if match is None:
            continue
        name, raw = match.group(1), match.group(2) or ""
        if name not in available:
            ignored.append(f"/tool {name}: no such tool in this request")
            continue
        try:
            tool_input = json.loads(raw) if raw else {}
        except ValueError:
            tool_input = None
        if not isinstance(tool_input, dict):
            ignored.append(f"/tool {name}: the input is not a JSON object")
            continue
        calls.append(_Block("tool_use", name=name, input=tool_input))
    return calls, ignored


def _tool_use_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        if message.get("role") == "assistant":
            for block in _blocks_of(message.get("content"), "tool_use"):
                if isinstance(block.get("id"), str):
                    names[block["id"]] = str(block.get("name", "?"))
    return names


def _describe_results(results: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str:
    names = _tool_use_names(messages)
    lines = [_ECHO_PREFIX.strip()]
    for block in results:
        name = names.get(str(block.get("tool_use_id")), "unknown")
        text = _result_text(block)
        first = _first_line(text)
        if block.get("is_error"):
            lines.append(f"Tool {name} failed: {first or '(no message)'}")
            continue
        count = len(text.splitlines())
        lines.append(f"Tool {name} returned {_plural(count, 'line')}.")
        if first:
            lines.append(f"First line: {_quote(first, 200)}")
    return "\n".join(lines)


def _long_request(text: str) -> int | None:
    for line in text.splitlines():
        match = _LONG_LINE.match(line)
        if match is not None:
            return max(1, min(int(match.group(1)), _MAX_LONG_TOKENS))
    return None


def _filler(tokens: int) -> str:
    target = tokens * CHARS_PER_TOKEN
    parts: list[str] = []
    size = 0
    n = 0
    while size < target:
        n += 1
        sentence = f"Offline filler sentence {n}. "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)[:target]


def _is_command(line: str) -> bool:
    return any(pattern.match(line) for pattern in (_TOOL_LINE, _LONG_LINE, _THINK_LINE))


def _echo(text: str, ignored: list[str]) -> str:
    kept = "\n".join(line for line in text.splitlines() if not _is_command(line)).strip()
    reply = _ECHO_PREFIX + (f"You said: {kept}" if kept else "You sent no text.")
    if ignored:
        reply += "\nIgnored: " + "; ".join(ignored) + "."
    return reply


def _summary(messages: list[dict[str, Any]], marker: str) -> str:
    """An extractive summary: lines quoted from the conversation under fixed headings."""
    user_texts: list[str] = []
    assistant_texts: list[str] = []
    tool_counts: dict[str, int] = {}
    files: list[str] = []
    errors: list[str] = []
    names = _tool_use_names(messages)
    for message in messages:
        content = message.get("content")
        text = _text_of(content, skip=marker).strip()
        if message.get("role") == "user":
            if text:
                user_texts.append(text)
            for block in _blocks_of(content, "tool_result"):
                if block.get("is_error"):
                    name = names.get(str(block.get("tool_use_id")), "unknown")
                    first = _quote(_first_line(_result_text(block)), 200)
                    errors.append(f"- Tool {name} failed: {first}")
        elif message.get("role") == "assistant":
            if text:
                assistant_texts.append(text)
            for block in _blocks_of(content, "tool_use"):
                name = str(block.get("name", "?"))
                tool_counts[name] = tool_counts.get(name, 0) + 1
                tool_input = block.get("input")
                if isinstance(tool_input, dict):
                    for key in _PATH_KEYS:
                        value = tool_input.get(key)
                        if isinstance(value, str) and value not in files:
                            files.append(value)

    latest = user_texts[-1] if user_texts else ""
    sections = (
        [f"- {_quote(user_texts[0], 500)}"] if user_texts else [],
        [f"- Tool {name} used {_plural(n, 'time')}." for name, n in tool_counts.items()],
        [f"- {path}" for path in files],
        errors,
        [f"- {_quote(_first_line(t), 200)}" for t in assistant_texts[-10:-1]],
        [f"- {_quote(t, 300)}" for t in user_texts],
        [f"- Latest request: {_quote(latest, 300)}"] if latest else [],
        [f"- {_quote(assistant_texts[-1], 500)}"] if assistant_texts else [],
        [f"- Continue with: {_quote(latest, 200)}"] if latest else [],
    )
    lines = ["<summary>"]
    for heading, body in zip(SUMMARY_HEADINGS, sections, strict=True):
        lines.append(f"{heading}:")
        lines.extend(body or ["- None recorded."])
        lines.append("")
    lines[-1] = "</summary>"
    return "\n".join(lines)


_TRANSCRIPT = re.compile(r"<transcript>\n?(.*?)\n?</transcript>", re.DOTALL)
_CALLED = re.compile(r"^\[called ([^(\s]+)\((.*)\)\]$")
_RESULT = re.compile(r"^\[result( \(error\))?: (.*)\]$")
_QUOTED_PATH = re.compile(r'"(?:file_path|path|notebook_path)": "([^"]*)"')


def _transcript_messages(text: str) -> list[dict[str, Any]]:
    """Messages recovered from a `<transcript>` in the instruction, best effort.

    A summary request that cannot reuse the cached prefix carries the conversation as
    text (`app.context.render.render_for_summary`): "User: " / "Assistant: "
    paragraphs, tool calls as `[called Name({...})]`, results as `[result: ...]`.
    """
    match = _TRANSCRIPT.search(text)
    if match is None:
        return []
    messages: list[dict[str, Any]] = []
    last_tool_id = ""
    for paragraph in match.group(1).split("\n\n"):
        label, sep, rest = paragraph.partition(": ")
        if sep and label in ("User", "Assistant"):
            messages.append({"role": label.lower(), "content": []})
        elif sep and label.startswith("Summary of"):
            messages.append({"role": "user", "content": []})
        elif messages:  # a blank line inside a message
            rest = paragraph
        else:
            continue
        content: list[dict[str, Any]] = messages[-1]["content"]
        for line in rest.splitlines():
            called = _CALLED.match(line)
            result = _RESULT.match(line)
            if called is not None:
                last_tool_id = f"transcript_{len(messages)}_{len(content)}"
                try:
                    tool_input = json.loads(called.group(2))
                except ValueError:  # shortened by the renderer
                    path = _QUOTED_PATH.search(called.group(2))
                    tool_input = {"file_path": path.group(1)} if path else {}
                content.append(
                    {
                        "type": "tool_use",
                        "id": last_tool_id,
                        "name": called.group(1),
                        "input": tool_input,
                    }
                )
            elif result is not None:
                content.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": last_tool_id,
                        "is_error": result.group(1) is not None,
                        "content": result.group(2),
                    }
                )
            elif line.strip():
                content.append({"type": "text", "text": line})
    return messages


def _render(
    blocks: list[_Block],
    stop_reason: str,
    *,
    message_id: str,
    tool_id_prefix: str,
    input_tokens: int,
    budget: int,
) -> list[dict[str, Any]]:
    """Wire events for `blocks`, cut at `budget` characters like a max_tokens stop."""
    usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": OFFLINE_MODEL,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        }
    ]
    produced = 0
    cut = False
    tool_number = 0
    for index, block in enumerate(blocks):
        if produced >= budget:
            cut = True
            break
        room = budget - produced
        if block.kind == "tool_use":
            tool_number += 1
            start: dict[str, Any] = {
                "type": "tool_use",
                "id": f"{tool_id_prefix}{tool_number}",
                "name": block.name,
                "input": {},
            }
            payload = json.dumps(block.input, ensure_ascii=False)
            pieces = ["", *_chunks(payload, _JSON_CHUNK)]
            delta_type, key = "input_json_delta", "partial_json"
        elif block.kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            payload = block.text
            pieces = list(_chunks(payload, _TEXT_CHUNK))
            delta_type, key = "thinking_delta", "thinking"
        else:
            start = {"type": "text", "text": ""}
            payload = block.text
            pieces = list(_chunks(payload, _TEXT_CHUNK))
            delta_type, key = "text_delta", "text"
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        for piece in pieces:
            if len(piece) > room:
                piece = piece[:room]
                cut = True
            if piece or delta_type == "input_json_delta":
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": delta_type, key: piece},
                    }
                )
            room -= len(piece)
            produced += len(piece)
            if cut:
                break
        if block.kind == "thinking":
            signature = hashlib.sha256(payload.encode()).hexdigest()
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": f"offline-{signature}"},
                }
            )
        events.append({"type": "content_block_stop", "index": index})
        if cut:
            break
    output_tokens = max(1, -(-produced // CHARS_PER_TOKEN))
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens" if cut else stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        }
    )
    events.append({"type": "message_stop"})
    return events
