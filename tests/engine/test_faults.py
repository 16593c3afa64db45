"""Model faults below HTTP: retries, broken streams, exhausted retries; and the event log
(gap-free ids, each step's events committed with its rows)."""

from __future__ import annotations

import uuid
from typing import Any

from app.domain import RunStatus
from app.models import Message, Run, RunEvent
from tests.engine.conftest import Harness, assert_gap_free
from tests.engine.scripted import (
    ScriptedModel,
    bad_request,
    broken,
    overloaded,
    rate_limited,
    reply,
    server_error,
    tool_use,
)


async def test_429_529_and_500_are_retried(h: Harness, model: ScriptedModel) -> None:
    model.script(rate_limited(retry_after=0.01), overloaded(), server_error(), reply("made it"))
    session = await h.new_session()
    out = await h.turn(session.id, "hi")
    assert out.run.status == RunStatus.COMPLETED
    assert len(model.requests) == 4
    assert model.requests[0] == model.requests[3]  # the same request, retried
    assert out.text == "made it"
    # Nothing was shown for attempts that failed before their first event.
    assert "message.discarded" not in out.names
    assert out.names.count("message.started") == 1
    assert out.run.state.model_calls == 4
    assert [m.role for m in out.messages] == ["user", "assistant"]


async def test_stream_broken_midway_is_discarded_and_retried(
    h: Harness, model: ScriptedModel
) -> None:
    model.script(
        broken("partial text that will be lost", after=3),
        broken("also lost", after=2, error=overloaded()),
        reply("the whole reply"),
    )
    session = await h.new_session()
    out = await h.turn(session.id, "hi")
    assert out.run.status == RunStatus.COMPLETED
    assert_gap_free(out.events)
    started = [e["uuid"] for e in out.of("message.started")]
    discarded = out.of("message.discarded")
    assert len(started) == 3
    assert [d["uuid"] for d in discarded] == started[:2]
    assert discarded[1]["reason"] == "Overloaded"
    # Each discard follows the deltas it withdraws, before the retry starts.
    first_discard = out.names.index("message.discarded")
    assert out.names[first_discard - 2 : first_discard] == ["text.delta", "text.delta"]
    assert out.names[first_discard + 1] == "message.started"
    assert [m.role for m in out.messages] == ["user", "assistant"]
    assert out.messages[1].content == [{"type": "text", "text": "the whole reply"}]
    assert str(out.messages[1].uuid) == started[2]


async def test_retries_exhausted_fail_the_run_keeping_the_turn(
    h: Harness, model: ScriptedModel
) -> None:
    model.script(*[overloaded() for _ in range(h.settings.max_retries + 1)])
    session = await h.new_session()
    out = await h.turn(session.id, "keep me")
    assert out.run.status == RunStatus.FAILED
    assert out.run.error == {
        "type": "upstream_error",
        "message": "The model API failed (overloaded): Overloaded",
        "request_id": "req_529",
    }
    assert out.names[-1] == "run.failed"
    assert len(model.requests) == 1 + h.settings.max_retries
    assert [m.content[0]["text"] for m in await h.chain(session.id)] == ["keep me"]
    assert await h.active_run(session.id) is None
    # The session goes on: the next turn carries the kept message too.
    model.script(reply("answered"))
    again = await h.turn(session.id, "retry")
    assert again.run.status == RunStatus.COMPLETED
    [merged] = model.requests[-1]["messages"]  # both user turns, merged into one
    assert [b["text"] for b in merged["content"]] == ["keep me", "retry"]


async def test_bad_request_is_not_retried(h: Harness, model: ScriptedModel) -> None:
    model.script(bad_request("messages: something is off"), reply("unused"))
    session = await h.new_session()
    out = await h.turn(session.id, "x")
    assert out.run.status == RunStatus.FAILED
    # A refusal of the request itself: the turn is taken off the chain (tests/runs).
    assert out.run.error["type"] == "request_refused"
    assert "something is off" in out.run.error["message"]
    assert len(model.requests) == 1
    assert model.left == 1


async def test_event_ids_are_gap_free_and_committed_with_their_rows(
    h: Harness, model: ScriptedModel
) -> None:
    model.script(
        broken("lost", after=2),
        reply("Reading.", tool_use("Glob", {"pattern": "*"})),
        reply("Done."),
    )
    session = await h.new_session(builtin_tools=["Glob"])
    out = await h.turn(session.id, "go")
    assert out.run.status == RunStatus.COMPLETED
    assert_gap_free(out.events)
    assert out.run.last_event_seq == out.events[-1].seq

    async def written_with(event: Any) -> str:
        return await h.xmin(RunEvent, run_id=out.run.id, seq=event.seq)

    # Every message the run stored is reported once, by an event written in the very
    # transaction that wrote the message.
    completed = [e for e in out.events if e.name == "message.completed"]
    assert [e.data["uuid"] for e in completed] == [str(m.uuid) for m in out.messages]
    for event in completed:
        message_tx = await h.xmin(Message, uuid=uuid.UUID(event.data["uuid"]))
        assert await written_with(event) == message_tx, event
    # Tool results are reported in the step that stores them.
    for event in (e for e in out.events if e.name == "tool_result"):
        message_tx = await h.xmin(Message, uuid=uuid.UUID(event.data["message_uuid"]))
        assert await written_with(event) == message_tx
    # The claim wrote the run row, the user message and `run.started` together; the
    # end wrote the final status and `run.completed` together.
    assert await written_with(out.events[0]) == await written_with(out.events[1])
    assert await written_with(out.events[-1]) == await h.xmin(Run, id=out.run.id)
    # The whole log is the same on a second read (it is stored, not rebuilt).
    assert await h.events(out.run.id) == out.events
