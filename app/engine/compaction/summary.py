"""Asking the model for a summary: from the cached prefix when it can, else from the
conversation rendered to text, dropping the oldest API rounds while still too long."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from app.context.cut import api_rounds
from app.context.render import render_for_summary
from app.context.summary_prompt import (
    extract_summary,
    summary_instruction,
    transcript_request,
)
from app.context.tokens import chars_to_tokens, estimate_content
from app.context.types import Node
from app.conversation.sessions import Limits
from app.engine.compaction.estimates import cache_cold, view_estimate
from app.engine.llm.errors import ModelError, PromptTooLong
from app.engine.llm.events import MessageDone
from app.engine.llm.retry import backoff_delay
from app.engine.requests import build_body
from app.models import AgentSession

if TYPE_CHECKING:
    from app.engine.compaction.compact import CompactionPlan
    from app.engine.loop import TurnRunner
    from app.engine.runtime import Runtime

log = logging.getLogger("parley.compaction")


MAX_PTL_RETRIES = 3
SUMMARY_MAX_TOKENS = 20_000
SUMMARY_SYSTEM = "You are a helpful AI assistant tasked with summarizing conversations."


class CompactionFailed(Exception):
    def __init__(self, message: str, cause: ModelError | None = None) -> None:
        super().__init__(message)
        self.cause = cause


async def summarise(
    runner: TurnRunner, session: AgentSession, plan: CompactionPlan, instructions: str | None
) -> str:
    """Ask the model for the summary. By default the request is the conversation as the
    model last saw it plus one final instruction, so its prefix is read from the prompt
    cache; when that cannot work (too long, cache cold, another model) the compacted
    messages are rendered to text, and if that is still too long the oldest API rounds
    are dropped, up to MAX_PTL_RETRIES times."""
    rt = runner.rt
    settings = rt.settings
    model = settings.compaction_model or session.model
    limits = Limits(session, settings)
    max_tokens = min(SUMMARY_MAX_TOKENS, limits.max_output_tokens)
    instruction = summary_instruction(instructions)
    fits = (
        view_estimate(session, plan.nodes) + chars_to_tokens(len(instruction)) + max_tokens
        <= limits.context_window
    )
    warm = not cache_cold(session, settings.cache_ttl_seconds)
    if model == session.model and fits and warm:
        nodes = [*plan.nodes, text_node(instruction)]
        body = build_body(session, nodes, thinking=False)
        body["max_tokens"] = max_tokens
        try:
            return await _summary_from(rt, body)
        except PromptTooLong:
            log.info("cached-prefix summary request too long; rendering to text")
    compacted = plan.nodes[: plan.cut.index]
    rounds = api_rounds(compacted)
    for attempt in range(MAX_PTL_RETRIES + 1):
        start = rounds[attempt][0] if attempt < len(rounds) and attempt else 0
        if attempt and attempt >= len(rounds):
            break
        transcript = render_for_summary(compacted[start:])
        if start:
            transcript = f"[{start} earlier messages omitted]\n{transcript}"
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "system": [{"type": "text", "text": SUMMARY_SYSTEM}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": transcript_request(transcript, instructions)}
                    ],
                }
            ],
        }
        try:
            return await _summary_from(rt, body)
        except PromptTooLong:
            log.info("summary request too long; dropping the oldest API round (%d)", attempt + 1)
    raise CompactionFailed("The summary request stayed too long after dropping old rounds")


def text_node(text: str) -> Node:
    content = [{"type": "text", "text": text}]
    return Node(
        uuid=str(uuid.uuid4()),
        type="user",
        role="user",
        content=content,
        token_estimate=estimate_content(content),
    )


async def _summary_from(rt: Runtime, body: dict[str, Any]) -> str:
    done = await complete(rt, body)
    text = "".join(b.get("text", "") for b in done.content if b.get("type") == "text")
    summary = extract_summary(text)
    if not summary:
        raise CompactionFailed("The model returned an empty summary")
    return summary


async def complete(rt: Runtime, body: dict[str, Any]) -> MessageDone:
    """One model response, with the same retry policy as turns, reporting no events."""
    settings = rt.settings
    attempt = 0
    while True:
        try:
            done: MessageDone | None = None
            async for event in rt.llm.stream(body):
                if isinstance(event, MessageDone):
                    done = event
            if done is None:
                raise CompactionFailed("The model stream ended early")
            return done
        except PromptTooLong:
            raise
        except ModelError as exc:
            if not exc.retryable or attempt >= settings.max_retries:
                raise CompactionFailed(f"The summary request failed: {exc.message}", exc) from exc
            await asyncio.sleep(
                backoff_delay(
                    attempt,
                    base=settings.retry_base_seconds,
                    cap=settings.retry_max_seconds,
                    retry_after=exc.retry_after,
                )
            )
            attempt += 1
