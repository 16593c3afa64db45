"""The last step of a plain turn as one statement (Postgres): the final reply stored, the
session moved to it, the model call's usage counted, the run completed, its events
stored and followers elsewhere told, in one statement instead of five.

It holds only while the session row is where the run left it: its message count (the
reply's seq, and so every event reporting it, was chosen from that count before the
statement ran) and, when the run knows it, its version (`session_rows`). Otherwise
nothing is written and the caller takes the ordinary step (`Moved`). The run row is
fenced by the owner's epoch as every write of the owner is (`LostOwnership`).

The statement writes all of it or nothing (both rows are locked before either is
written), so it needs no transaction around it: `alone`, it is autocommitted, one round
trip. Alone it also requires the tenant to have no webhook endpoints, whose deliveries
must be stored in the same transaction as the events (`outbox.enqueue`); a tenant with
endpoints gets `NeedsOutbox`, nothing written.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.conversation.records import MessageRecord
from app.db import Database
from app.domain import USAGE_COUNTERS
from app.engine.events import (
    NOTIFY_CHANNEL,
    LostOwnership,
    StoredEvent,
    dumps,
    event_arrays,
)
from app.engine.quotas.budgets import INPUT_COUNTERS, hour_of


class Moved(Exception):
    """The session row is not where the run left it: nothing was written."""


class NeedsOutbox(Exception):
    """Alone, for a tenant with webhook endpoints: nothing was written; the statement
    goes in a transaction with the deliveries."""


@dataclass(frozen=True, slots=True)
class Finished:
    queued_next: bool  # a queued turn waits for the session
    has_endpoints: bool  # the tenant has webhook endpoints
    version: str  # the session row's (`xmin`) as the statement left it


async def finish_turn(
    db: AsyncSession,
    database: Database,
    *,
    alone: bool,
    tenant: str,
    reply: MessageRecord,
    usage: dict[str, int],
    run_id: uuid.UUID,
    epoch: int,
    run_usage: dict[str, int],
    state: dict[str, Any],
    finished_at: datetime,
    events: list[StoredEvent],
    version: str | None = None,
) -> Finished:
    """Run `FINISH_TURN`: `alone`, autocommitted (`Database.execute_once`); otherwise in
    `db`'s transaction. `reply` carries the seq after the session's message count as the
    run left it; `events` end with the one reporting the run's end. With `version` the
    session row must also still be at that version (`session_rows`)."""
    seen_seq = reply.seq - 1
    last = events[-1].seq
    params: dict[str, Any] = {
        "session_id": reply.session_id,
        "seen_seq": seen_seq,
        "seen_version": version,
        "alone": alone,
        "now": finished_at,
        **{f"add_{name}": usage.get(name, 0) for name in USAGE_COUNTERS},
        **{f"m_{name}": value for name, value in reply.values().items()},
        "m_content": dumps(reply.content),
        "m_usage": dumps(reply.usage),
        "m_metadata": dumps(reply.metadata),
        "tenant": tenant,
        "hour": hour_of(finished_at),
        "spent_in": sum(usage.get(name, 0) for name in INPUT_COUNTERS),
        "spent_out": usage.get("output_tokens", 0),
        "run_id": run_id,
        "epoch": epoch,
        "run_usage": dumps(run_usage),
        "state": dumps(state),
        "last": last,
        **event_arrays(events),
        "channel": NOTIFY_CHANNEL,
        "payload": f"{run_id}:{last}",
    }
    if alone:
        [row] = await database.execute_once(FINISH_TURN, params)
    else:
        row = (await db.execute(FINISH_TURN, params)).one()
    seen, new_version, settled, queued_next, has_endpoints = row[:5]
    if not seen:
        raise Moved(f"session {reply.session_id} has moved past message {seen_seq}")
    if alone and has_endpoints:
        raise NeedsOutbox(f"tenant {tenant} has webhook endpoints")
    if not settled:
        raise LostOwnership(f"run {run_id} was ended or taken elsewhere")
    return Finished(queued_next, has_endpoints, new_version)


# Both rows are locked before either is written, the session's first (the order of every
# transaction that takes both): the session row while it still has the run's message
# count (and version), then the run row while the owner's epoch holds it (and, alone,
# while the tenant has no webhook endpoints). Only with both held does the session move
# and the run settle, and neither can fail then; the rest is inserted only when the run
# settled (FROM settled). The usage row is the budgets' upsert.
FINISH_TURN = text(
    """
    WITH seen AS (
        SELECT id FROM agent_sessions
        WHERE id = :session_id AND message_seq = :seen_seq
          AND (CAST(:seen_version AS text) IS NULL OR xmin::text = :seen_version)
        FOR UPDATE
    ), fence AS (
        SELECT id FROM runs
        WHERE id = :run_id AND epoch = :epoch AND status = 'running'
          AND (NOT CAST(:alone AS boolean)
               OR NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant = :tenant))
          AND EXISTS (SELECT 1 FROM seen)
        FOR UPDATE
    ), moved AS (
        UPDATE agent_sessions
        SET message_seq = message_seq + 1, head_uuid = :m_uuid, updated_at = :now,
            last_request_at = :now,
            input_tokens = input_tokens + :add_input_tokens,
            output_tokens = output_tokens + :add_output_tokens,
            cache_read_input_tokens = cache_read_input_tokens + :add_cache_read_input_tokens,
            cache_creation_input_tokens =
                cache_creation_input_tokens + :add_cache_creation_input_tokens
        WHERE id IN (SELECT id FROM seen) AND EXISTS (SELECT 1 FROM fence)
        RETURNING id, xmin::text AS version
    ), settled AS (
        UPDATE runs
        SET status = 'completed', error = CAST('null' AS jsonb),
            required_action = CAST('null' AS jsonb), finished_at = :now,
            lease_expires_at = NULL, streaming_uuid = NULL, cancel_requested_at = NULL,
            usage = CAST(:run_usage AS jsonb), state = CAST(:state AS jsonb),
            last_event_seq = :last, reserved_seq = :last
        WHERE id IN (SELECT id FROM fence) AND EXISTS (SELECT 1 FROM moved)
        RETURNING id
    ), message AS (
        INSERT INTO messages (
            uuid, session_id, seq, parent_uuid, logical_parent_uuid, type, subtype, role,
            content, model, stop_reason, usage, is_meta, token_estimate, copied_from,
            run_id, metadata, created_at
        )
        SELECT :m_uuid, :session_id, :m_seq, :m_parent_uuid, :m_logical_parent_uuid,
               :m_type, :m_subtype, :m_role, CAST(:m_content AS jsonb), :m_model,
               :m_stop_reason, CAST(:m_usage AS jsonb), :m_is_meta, :m_token_estimate,
               :m_copied_from, :m_run_id, CAST(:m_metadata AS jsonb), :m_created_at
        FROM settled
    ), usage_row AS (
        INSERT INTO token_usage (session_id, hour, tenant, input_tokens, output_tokens)
        SELECT :session_id, :hour, :tenant, :spent_in, :spent_out
        FROM settled
        WHERE CAST(:spent_in AS bigint) + CAST(:spent_out AS bigint) > 0
        ON CONFLICT (session_id, hour) DO UPDATE
        SET input_tokens = token_usage.input_tokens + excluded.input_tokens,
            output_tokens = token_usage.output_tokens + excluded.output_tokens
    ), events AS (
        INSERT INTO run_events (run_id, seq, event, data, created_at)
        SELECT :run_id, e.seq, e.event, e.data, :now
        FROM settled, unnest(
            CAST(:e_seqs AS bigint[]), CAST(:e_names AS text[]), CAST(:e_data AS text[])
        ) AS e(seq, event, data)
    )
    SELECT EXISTS (SELECT 1 FROM seen) AS seen,
           (SELECT version FROM moved) AS version,
           EXISTS (SELECT 1 FROM settled) AS settled,
           EXISTS (
               SELECT 1 FROM runs
               WHERE session_id = :session_id AND status = 'queued'
           ) AS queued_next,
           EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant = :tenant) AS has_endpoints,
           CASE WHEN EXISTS (SELECT 1 FROM settled)
                THEN pg_notify(:channel, :payload) END AS notified
    """
)
