"""A turn the model API refuses as invalid (400 `invalid_request_error`, 413, a bad
image) must not poison the session: sent again with every later turn, it would be
refused again. The run fails with the API's message, the turn's user message is marked
`refused` and stays in the tree, and the head goes back to that message's parent, so
later turns are built without it. Transient failures and other refusals (authentication,
billing, a prompt too long, which compaction handles) end the run as before.
"""

from __future__ import annotations

import uuid
from typing import Any

from app.context.types import REFUSED
from app.conversation import store
from app.domain import RunKind
from app.engine.handle import RunStep
from app.engine.llm.errors import ModelError, PromptTooLong
from app.models import Run

REFUSING_KINDS = frozenset({"invalid_request", "request_too_large"})


def refused_turn(run: Run, exc: ModelError) -> uuid.UUID | None:
    """The user message of the turn `exc` refuses, if it is such a refusal."""
    if run.kind != RunKind.TURN or isinstance(exc, PromptTooLong):
        return None
    return run.user_message_uuid if exc.kind in REFUSING_KINDS else None


def refused_error(exc: ModelError) -> dict[str, Any]:
    """The run's error: the API's own message."""
    error = {"type": "request_refused", "message": exc.message}
    if exc.request_id:
        error["request_id"] = exc.request_id
    return error


async def rewind(step: RunStep, session_id: uuid.UUID, message_uuid: uuid.UUID) -> None:
    """In the run's final step: mark the message refused and make its parent the head."""
    found, parent = await store.mark(step.db, session_id, message_uuid, REFUSED)
    if found:
        await store.set_head(step.db, session_id, parent)
        step.head = parent
