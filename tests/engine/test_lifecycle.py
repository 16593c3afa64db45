"""Runs executed by the supervisor below HTTP: cancel mid-stream, shutdown, busy sessions
(reject, enqueue, interrupt), paused runs cancelled or expired."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from app.domain import IfBusy, RunKind, RunParams, RunState, RunStatus
from app.engine import runs
from app.errors import Conflict
from app.models import Run
from tests.engine.conftest import Harness, MakeHarness, assert_gap_free
from tests.engine.scripted import Gate, ScriptedModel, held, reply, tool_use

WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}
LONG = "a reply long enough to be cut off half way through"


async def reached(gate: Gate) -> None:
    await asyncio.wait_for(gate.reached.wait(), timeout=5)


def texts(records: list[Any]) -> list[str]:
    return [b.get("text") or b["type"] for r in records for b in r.content]


async def test_cancel_mid_text_keeps_the_partial_reply(h: Harness, model: ScriptedModel) -> None:
    gate = held(reply(LONG, chunk=4), after=4)  # message start and three deltas
    model.script(gate)
    session = await h.new_session()
    run = await h.start(session.id, "go")
    await reached(gate)

    cancelled = await h.cancel(run.id)
    assert cancelled.status == RunStatus.CANCELLED
    out = await h.outcome(run.id)
    assert_gap_free(out.events)
    assert out.names[-1] == "run.cancelled"
    assert out.text == "a reply long"
    _, partial = await h.chain(session.id)
    assert partial.subtype == "interrupted"
    assert partial.content == [{"type": "text", "text": "a reply long"}]
    # Stored under the uuid its deltas were shown with, and reported.
    assert str(partial.uuid) == out.of("message.started")[0]["uuid"]
    assert out.of("message.completed")[-1]["uuid"] == str(partial.uuid)
    # Cancelling again changes nothing.
    again = await h.cancel(run.id)
    assert (again.status, again.finished_at) == (cancelled.status, cancelled.finished_at)
    assert await h.events(run.id) == out.events
    assert await h.active_run(session.id) is None
    await h.next_request(session.id)


async def test_cancel_after_a_tool_use_answers_it(h: Harness, model: ScriptedModel) -> None:
    gate = held(reply("Looking.", tool_use("Glob", {"pattern": "*"}, id="toolu_open")), after=-1)
    model.script(gate)  # everything but the end of the message
    session = await h.new_session(builtin_tools=["Glob"])
    run = await h.start(session.id, "go")
    await reached(gate)
    await h.cancel(run.id)

    out = await h.outcome(run.id)
    assert out.run.status == RunStatus.CANCELLED
    assert_gap_free(out.events)
    _, partial, answer = await h.chain(session.id)
    assert partial.subtype == "interrupted"
    assert [b["type"] for b in partial.content] == ["text", "tool_use"]
    assert answer.content == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_open",
            "content": runs.CANCELLED_TOOL_TEXT,
            "is_error": True,
        }
    ]
    assert [d["uuid"] for d in out.of("message.completed")][-2:] == [
        str(partial.uuid),
        str(answer.uuid),
    ]
    assert await h.files(session.id) == []
    await h.next_request(session.id)


async def test_busy_session_rejects_enqueues_and_interrupts(
    h: Harness, model: ScriptedModel
) -> None:
    slow = held("slow one", after=1)
    model.script(slow, reply("queued reply"))
    session = await h.new_session()
    first = await h.start(session.id, "one")
    await reached(slow)

    with pytest.raises(Conflict) as busy:
        await h.start(session.id, "two")
    assert busy.value.extra == {"run_id": str(first.id)}
    queued = await h.start(session.id, "two", if_busy=IfBusy.ENQUEUE)
    assert queued.status == RunStatus.QUEUED
    assert texts(await h.chain(session.id)) == ["one"]  # stored when it starts
    slow.release()
    assert (await h.settle(first.id)).run.status == RunStatus.COMPLETED
    second = await h.settle(queued.id)
    assert second.run.status == RunStatus.COMPLETED
    assert texts(await h.chain(session.id)) == ["one", "slow one", "two", "queued reply"]

    stuck = held("never finished", after=2)
    model.script(stuck, reply("after interrupt"))
    old = await h.start(session.id, "three")
    await reached(stuck)
    new = await h.start(session.id, "four", if_busy=IfBusy.INTERRUPT)
    assert (await h.run(old.id)).status == RunStatus.CANCELLED
    assert (await h.settle(new.id)).run.status == RunStatus.COMPLETED
    assert texts(await h.chain(session.id))[4:] == [
        "three",
        "never fi",  # the cancelled run's partial reply
        "four",
        "after interrupt",
    ]
    await h.next_request(session.id)


async def test_cancel_paused_run_keeps_computed_results(h: Harness, model: ScriptedModel) -> None:
    model.script(
        reply(
            tool_use("get_weather", {}, id="toolu_w"),
            tool_use("Glob", {"pattern": "*"}, id="toolu_g"),
        )
    )
    session = await h.new_session(tools=[WEATHER], builtin_tools=["Glob"])
    await h.put_file(session.id, "a.txt", "a")
    paused = await h.turn(session.id, "weather")
    assert paused.run.status == RunStatus.REQUIRES_ACTION

    cancelled = await h.cancel(paused.run.id)
    assert cancelled.status == RunStatus.CANCELLED
    assert cancelled.required_action is None
    answer = (await h.chain(session.id))[-1]
    assert [(b["tool_use_id"], b["content"], b["is_error"]) for b in answer.content] == [
        ("toolu_w", runs.CANCELLED_TOOL_TEXT, True),
        ("toolu_g", "a.txt", False),
    ]
    events = await h.events(paused.run.id)
    assert_gap_free(events)
    # The stored answer is reported, with the end, like any message a run stores.
    assert [e.name for e in events][-3:] == [
        "run.requires_action",
        "message.completed",
        "run.cancelled",
    ]
    assert events[-2].data["uuid"] == str(answer.uuid)
    assert await h.active_run(session.id) is None
    await h.next_request(session.id)


async def test_unanswered_client_tools_expire(
    make_harness: MakeHarness, model: ScriptedModel
) -> None:
    h = make_harness(model, requires_action_ttl_seconds=600)
    model.script(reply(tool_use("get_weather", {}, id="toolu_x")))
    session = await h.new_session(tools=[WEATHER])
    before = runs.now()
    paused = await h.turn(session.id, "weather")
    assert paused.run.status == RunStatus.REQUIRES_ACTION
    # While paused, the lease is the client's deadline.
    deadline = paused.run.lease_expires_at
    assert deadline is not None
    assert before + timedelta(seconds=600) <= deadline <= runs.now() + timedelta(seconds=600)
    await h.supervisor.reap()  # not yet: the deadline has not passed
    assert (await h.run(paused.run.id)).status == RunStatus.REQUIRES_ACTION
    async with h.db.transaction() as db:  # the deadline passes
        await db.execute(
            update(Run)
            .where(Run.id == paused.run.id)
            .values(lease_expires_at=runs.now() - timedelta(seconds=1))
        )
    await h.supervisor.reap()

    run = await h.run(paused.run.id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "expired"
    events = await h.events(run.id)
    assert_gap_free(events)
    assert [e.name for e in events][-3:] == [
        "run.requires_action",
        "message.completed",
        "run.failed",
    ]
    answer = (await h.chain(session.id))[-1]
    assert events[-2].data["uuid"] == str(answer.uuid)
    result = answer.content[0]
    assert (result["tool_use_id"], result["content"]) == ("toolu_x", runs.EXPIRED_TOOL_TEXT)
    with pytest.raises(Conflict):
        await h.submit_tool_results(run.id, [{"tool_use_id": "toolu_x"}])
    assert await h.active_run(session.id) is None
    await h.next_request(session.id)


async def test_interrupting_a_paused_run_continues_after_its_answered_tools(
    h: Harness, model: ScriptedModel
) -> None:
    model.script(reply(tool_use("get_weather", {}, id="toolu_w")), reply("after interrupt"))
    session = await h.new_session(tools=[WEATHER])
    paused = await h.turn(session.id, "one")
    assert paused.run.status == RunStatus.REQUIRES_ACTION

    new = await h.start(session.id, "two", if_busy=IfBusy.INTERRUPT)
    assert (await h.settle(new.id)).run.status == RunStatus.COMPLETED
    assert (await h.run(paused.run.id)).status == RunStatus.CANCELLED
    _, call, answer, two, reply_ = await h.chain(session.id)
    assert [b["type"] for b in call.content] == ["tool_use"]
    assert answer.content[0]["tool_use_id"] == "toolu_w"
    assert answer.content[0]["content"] == runs.CANCELLED_TOOL_TEXT
    # The new turn follows the answer: the cancelled call is answered on its branch.
    assert two.parent_uuid == answer.uuid
    assert two.content == [{"type": "text", "text": "two"}]
    assert reply_.content == [{"type": "text", "text": "after interrupt"}]
    await h.next_request(session.id)


async def test_a_queued_turn_is_started_once_when_two_start_it_together(
    h: Harness, model: ScriptedModel
) -> None:
    """The end of the previous run and the reaper may both start a session's queued turn
    at the same moment: one claims it, the other finds nothing to do."""
    model.script(reply("queued reply"))
    session = await h.new_session()
    queued = Run(
        id=uuid.uuid4(),
        session_id=session.id,
        kind=RunKind.TURN,
        status=RunStatus.QUEUED,
        params=RunParams(content="two"),
        usage={},
        state=RunState(),
        last_event_seq=0,
        created_at=runs.now(),
    )
    async with h.db.transaction() as db:
        db.add(queued)

    started = await asyncio.gather(
        h.supervisor.start_next_queued(session.id), h.supervisor.start_next_queued(session.id)
    )
    assert sorted(started, key=str) == sorted([queued.id, None], key=str)
    out = await h.settle(queued.id)
    assert out.run.status == RunStatus.COMPLETED
    assert texts(await h.chain(session.id)) == ["two", "queued reply"]
    assert_gap_free(out.events)
    assert out.names.count("run.started") == 1
