"""Asking the model for a summary: from the cached prefix when it can, else from the
conversation rendered to text, dropping the oldest API rounds while still too long.

Whatever the request, the user's own prompts of the part being summarised are in it
verbatim: those the messages do not show word for word (inside a collapsed span, in a
dropped round) are listed before the instruction, so a compaction never loses them.
Every call is charged to the run (`usage.charge_run`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from app.context.blocks import result_text
from app.context.cache import cache_cold
from app.context.compaction import CompactionPlan, text_node
from app.context.cut import api_rounds
from app.context.estimates import prefix_sent, view_estimate
from app.context.limits import Limits
from app.context.render import render_for_summary
from app.context.request import build_body
from app.context.summary_prompt import (
    extract_summary,
    prompts_section,
    summary_instruction,
    transcript_request,
)
from app.context.tokens import CHARS_PER_TOKEN, chars_to_tokens
from app.context.types import Node
from app.engine.compaction.usage import charge_run
from app.engine.handle import RunHandle
from app.engine.llm.errors import ModelError, PromptTooLong
from app.engine.llm.events import MessageDone
from app.engine.llm.retrying import stream_with_retries
from app.engine.resources import Resources

log = logging.getLogger("parley.compaction")

MAX_PTL_RETRIES = 3
SUMMARY_MAX_TOKENS = 20_000
SUMMARY_SYSTEM = "You are a helpful AI assistant tasked with summarizing conversations."
# The prompts listed verbatim take at most this share of the context window.
PROMPTS_WINDOW_SHARE = 0.25


class CompactionFailed(Exception):
    def __init__(self, message: str, cause: ModelError | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def _texts(nodes: Iterable[Node]) -> Iterable[str]:
    for node in nodes:
        for block in node.content:
            kind = block.get("type")
            if kind == "text":
                yield str(block.get("text") or "")
            elif kind == "tool_result":
                yield result_text(block)


def unseen_prompts(prompts: Sequence[str], shown: str, window: int) -> str:
    """The section listing the `prompts` that `shown` (the request's text) does not
    hold verbatim, newest kept first within PROMPTS_WINDOW_SHARE of the window."""
    missing = [p for p in prompts if p not in shown]
    limit = int(PROMPTS_WINDOW_SHARE * window * CHARS_PER_TOKEN)
    kept: list[str] = []
    for prompt in reversed(missing):
        if len(prompt) > limit:
            continue
        limit -= len(prompt)
        kept.append(prompt)
    return prompts_section(list(reversed(kept)))


async def summarise(
    run: RunHandle, plan: CompactionPlan, instructions: str | None, prompts: Sequence[str]
) -> str:
    """Ask the model for the summary. By default the request is the conversation as the
    model last saw it plus one final instruction, so its prefix is read from the prompt
    cache; when that cannot work (too long, cache cold, another model) the compacted
    messages are rendered to text, and if that is still too long the oldest API rounds
    are dropped, up to MAX_PTL_RETRIES times. `prompts`: the user's prompts of the part
    being summarised, each of which the request carries verbatim."""
    resources, config = run.resources, run.config
    settings = resources.settings
    model = settings.compaction_model or config.model
    limits = Limits.of(config)
    max_tokens = min(SUMMARY_MAX_TOKENS, limits.max_output_tokens)
    instruction = summary_instruction(instructions)
    fits = (
        view_estimate(config, plan.projected) + chars_to_tokens(len(instruction)) + max_tokens
        <= limits.context_window
    )
    # Cold: expired, or this view's prefix was never sent (imported, just compacted).
    cold = cache_cold(
        run.session.last_request_at, settings.cache_ttl_seconds, datetime.now(UTC)
    ) or not prefix_sent(config, plan.projected)
    if model == config.model and fits and not cold:
        shown = "\n".join(_texts(plan.projected))
        section = unseen_prompts(prompts, shown, limits.context_window)
        final = f"{section}\n\n{instruction}" if section else instruction
        body = build_body(config, [*plan.projected, text_node(final)], thinking=False)
        body["max_tokens"] = max_tokens
        try:
            return await _summary_from(run, body)
        except PromptTooLong:
            log.info("cached-prefix summary request too long; rendering to text")
    compacted = plan.compacted
    rounds = api_rounds(compacted)
    for attempt in range(MAX_PTL_RETRIES + 1):
        if attempt and attempt >= len(rounds):
            break
        start = rounds[attempt][0] if attempt else 0
        transcript = render_for_summary(compacted[start:])
        if start:
            transcript = f"[{start} earlier messages omitted]\n{transcript}"
        section = unseen_prompts(prompts, transcript, limits.context_window)
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "system": [{"type": "text", "text": SUMMARY_SYSTEM}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": transcript_request(transcript, instructions, section),
                        }
                    ],
                }
            ],
        }
        try:
            return await _summary_from(run, body)
        except PromptTooLong:
            log.info("summary request too long; dropping the oldest API round (%d)", attempt + 1)
    raise CompactionFailed("The summary request stayed too long after dropping old rounds")


async def _summary_from(run: RunHandle, body: dict[str, Any]) -> str:
    done = await complete(run.resources, body)
    await charge_run(run, done.usage)
    text = "".join(b.get("text", "") for b in done.content if b.get("type") == "text")
    summary = extract_summary(text)
    if not summary:
        raise CompactionFailed("The model returned an empty summary")
    return summary


async def complete(resources: Resources, body: dict[str, Any]) -> MessageDone:
    """One model response, with the same retry policy as turns, reporting no events."""
    try:
        return await stream_with_retries(resources.llm, body, resources.retry)
    except PromptTooLong:
        raise
    except ModelError as exc:
        raise CompactionFailed(f"The summary request failed: {exc.message}", exc) from exc
