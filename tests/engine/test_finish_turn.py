"""The last step of a plain turn as one statement (Postgres, `engine.finishing`): what it
reports is what it stores, a session that moved meanwhile takes the ordinary step, and
an owner that lost the run writes nothing of its end."""

from __future__ import annotations

import asyncio

from sqlalchemy import delete, func, select, update

from app.conversation import store
from app.conversation.payloads import message_payload, run_json
from app.domain import USAGE_COUNTERS, RunStatus
from app.engine.quotas.budgets import INPUT_COUNTERS
from app.models import AgentSession, Message, Run, TokenUsage, WebhookDelivery, WebhookEndpoint
from tests.engine.conftest import Harness, Outcome, assert_gap_free
from tests.engine.scripted import ScriptedModel, held, reply, tool_use
from tests.statements import recorded

FINISH_MARK = "WITH seen AS"  # the head of `finishing.FINISH_TURN`


def finished_at_once(seen: list[str]) -> int:
    return sum(FINISH_MARK in statement for statement in seen)


async def usage_rows(h: Harness, session: AgentSession) -> tuple[int, int]:
    async with h.db.sessionmaker() as db:
        row = (
            await db.execute(
                select(
                    func.coalesce(func.sum(TokenUsage.input_tokens), 0),
                    func.coalesce(func.sum(TokenUsage.output_tokens), 0),
                ).where(TokenUsage.session_id == session.id)
            )
        ).one()
    return int(row[0]), int(row[1])


async def assert_stored_as_reported(h: Harness, session: AgentSession, out: Outcome) -> None:
    """The run's end and final reply as reported equal the rows, and the session's
    counters, head and count agree with its messages."""
    assert out.run.status == RunStatus.COMPLETED
    assert_gap_free(out.events)
    assert out.names[-1] == "run.completed"
    assert out.events[-1].data == run_json(out.run)
    final = out.messages[-1]
    assert out.of("message.completed")[-1] == message_payload(final)
    run = out.run
    assert run.last_event_seq == run.reserved_seq == out.events[-1].seq
    assert run.lease_expires_at is None
    assert run.streaming_uuid is None
    assert run.finished_at is not None

    row = await h.session(session.id)
    replies = [m for m in await h.chain(session.id) if m.role == "assistant"]
    async with h.db.sessionmaker() as db:
        count = await db.scalar(
            select(func.max(Message.seq)).where(Message.session_id == session.id)
        )
    assert row.head_uuid == final.uuid
    assert row.message_seq == final.seq == count
    for name in USAGE_COUNTERS:
        assert getattr(row, name) == sum((m.usage or {}).get(name, 0) for m in replies)
    spent_in = sum((m.usage or {}).get(n, 0) for m in replies for n in INPUT_COUNTERS)
    assert await usage_rows(h, session) == (spent_in, row.output_tokens)
    assert row.last_request_at is not None


async def test_the_final_step_stores_what_it_reports(h: Harness, model: ScriptedModel) -> None:
    model.script(
        reply("plain"),
        reply(tool_use("Write", {"file_path": "a.txt", "content": "x"}, id="toolu_1")),
        reply("after a tool"),
    )
    session = await h.new_session(builtin_tools=["Write"])
    for text in ("first", "second"):
        with recorded(h.db) as seen:
            out = await h.settle((await h.start(session.id, text)).id)
        assert finished_at_once(seen) == 1, "the end was one statement"
        await assert_stored_as_reported(h, session, out)
    await h.next_request(session.id)


async def test_a_session_that_moved_takes_the_ordinary_step(
    h: Harness, model: ScriptedModel
) -> None:
    gate = held(reply("the reply"), after=1)
    model.script(gate)
    session = await h.new_session()
    with recorded(h.db) as seen:
        run = await h.start(session.id, "go")
        await asyncio.wait_for(gate.reached.wait(), 10)
        async with h.db.transaction() as db:  # a seq taken by something else
            taken = await store.allocate_seq(db, session.id)
        gate.release()
        out = await h.settle(run.id)
    assert finished_at_once(seen) == 1, "tried, and found the session moved"
    assert out.messages[-1].seq == taken + 1
    assert [m.seq for m in out.messages] == [taken - 1, taken + 1]
    await assert_stored_as_reported(h, session, out)


async def test_an_owner_that_lost_the_run_stores_nothing_of_its_end(
    h: Harness, model: ScriptedModel
) -> None:
    gate = held(reply("never stored"), after=1)
    model.script(gate)
    session = await h.new_session()
    run = await h.start(session.id, "go")
    await asyncio.wait_for(gate.reached.wait(), 10)
    before = await h.session(session.id)
    spent = await usage_rows(h, session)
    async with h.db.transaction() as db:  # another process took the run over
        await db.execute(update(Run).where(Run.id == run.id).values(epoch=Run.epoch + 1))
    events = await h.events(run.id)
    gate.release()
    await asyncio.wait_for(h.launched[run.id], 10)

    after = await h.session(session.id)
    assert (after.message_seq, after.head_uuid) == (before.message_seq, before.head_uuid)
    assert after.output_tokens == before.output_tokens
    assert await usage_rows(h, session) == spent
    assert (await h.run(run.id)).status == RunStatus.RUNNING  # left to its new owner
    assert [e.seq for e in await h.events(run.id)] == [e.seq for e in events]
    await h.abandon(run.id)


async def test_a_tenant_with_webhook_endpoints_gets_the_deliveries_with_the_end(
    h: Harness, model: ScriptedModel
) -> None:
    """The end goes alone (autocommitted) only for a tenant without endpoints: with one,
    the alone try writes nothing and the end goes in a transaction with its deliveries;
    the next end goes there at once, until the tenant has none again."""
    session = await h.new_session()
    async with h.db.transaction() as db:
        endpoint = WebhookEndpoint(
            tenant=session.tenant, url="https://hooks.example/in", events=["run.completed"]
        )
        endpoint.secret = "whsec_" + "x" * 32
        db.add(endpoint)
    tries: list[int] = []

    async def turn(text: str) -> list[str]:
        model.script(reply(f"reply to {text}"))
        with recorded(h.db) as seen:
            out = await h.settle((await h.start(session.id, text)).id)
        tries.append(finished_at_once(seen))
        await assert_stored_as_reported(h, session, out)
        async with h.db.sessionmaker() as db:
            found = await db.scalars(
                select(WebhookDelivery.event).where(WebhookDelivery.run_id == out.run.id)
            )
            return list(found)

    try:
        assert await turn("first") == ["run.completed"]
        assert await turn("second") == ["run.completed"]
        assert tries == [2, 1], "tried alone once, then with the deliveries at once"
        assert session.tenant in h.resources.webhook_tenants
    finally:
        async with h.db.transaction() as db:  # its deliveries go with it (cascade)
            await db.execute(delete(WebhookEndpoint).where(WebhookEndpoint.id == endpoint.id))
    assert await turn("third") == []
    assert await turn("fourth") == []
    assert tries[2:] == [1, 1]
    assert session.tenant not in h.resources.webhook_tenants
