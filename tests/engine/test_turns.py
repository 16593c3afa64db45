"""The turn loop below HTTP: replies, built-in tools, client tools, output limits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.domain import RunStatus
from app.engine import tool_calls
from app.engine.loop import CONTINUE_TEXT
from app.engine.tool_calls import TRUNCATED_TOOL_TEXT
from app.errors import Conflict, Invalid
from tests.engine.conftest import Harness, MakeHarness, assert_gap_free
from tests.engine.scripted import (
    ScriptedModel,
    cut_tool_use,
    reply,
    thinking,
    tool_use,
)

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def blocks(record: Any, kind: str) -> list[dict[str, Any]]:
    return [b for b in record.content if b.get("type") == kind]


async def test_plain_reply(h: Harness, model: ScriptedModel) -> None:
    model.script(reply("Hello there, how can I help?", usage={"input_tokens": 12}))
    session = await h.new_session(system="be brief")
    out = await h.turn(session.id, "hi")

    assert out.run.status == RunStatus.COMPLETED
    assert out.run.error is None
    assert_gap_free(out.events)
    assert out.names[:3] == ["run.started", "message.completed", "message.started"]
    assert out.names[-2:] == ["message.completed", "run.completed"]
    assert out.text == "Hello there, how can I help?"
    user, answer = out.messages
    assert (user.role, user.content) == ("user", [{"type": "text", "text": "hi"}])
    assert answer.role == "assistant"
    assert answer.parent_uuid == user.uuid
    assert answer.content == [{"type": "text", "text": "Hello there, how can I help?"}]
    assert answer.stop_reason == "end_turn"
    # The streamed message is stored under the uuid the deltas announced.
    assert {d["message_uuid"] for d in out.of("text.delta")} == {str(answer.uuid)}
    assert out.of("message.started")[0]["uuid"] == str(answer.uuid)
    # Usage lands on the message, the run and the session.
    assert answer.usage is not None
    assert answer.usage["input_tokens"] == 12
    assert out.run.usage["input_tokens"] == 12
    # The final event reports the run as stored, its last reply's usage included.
    assert out.of("run.completed")[0]["usage"] == out.run.usage
    stored = await h.session(session.id)
    assert stored.input_tokens == 12
    assert stored.output_tokens == answer.usage["output_tokens"] > 0
    assert stored.head_uuid == answer.uuid
    assert await h.active_run(session.id) is None
    # What the model was sent.
    [body] = model.requests
    assert body["system"][0]["text"] == "be brief"
    assert body["messages"][-1]["role"] == "user"
    assert out.run.state.model_calls == 1


@pytest.fixture
def in_flight(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Each built-in call with how many built-in calls were running when it started
    (each call lingers a little, so overlapping calls are seen overlapping)."""
    seen: list[tuple[str, int]] = []
    running = 0
    real = tool_calls.run_builtin

    async def counting(name: str, input: dict[str, Any], workspace: Any) -> Any:
        nonlocal running
        running += 1
        seen.append((name, running))
        try:
            await asyncio.sleep(0.02)
            return await real(name, input, workspace)
        finally:
            running -= 1

    monkeypatch.setattr(tool_calls, "run_builtin", counting)
    return seen


async def test_multi_tool_turn_with_builtin_tools(
    h: Harness, model: ScriptedModel, in_flight: list[tuple[str, int]]
) -> None:
    model.script(
        reply(
            "I'll write, then edit.",
            tool_use("Write", {"file_path": "notes/a.txt", "content": "alpha\nbeta\n"}),
            tool_use(
                "Edit", {"file_path": "notes/a.txt", "old_string": "beta", "new_string": "gamma"}
            ),
        ),
        reply(
            tool_use("Read", {"file_path": "notes/a.txt"}),
            tool_use("Grep", {"pattern": "gamma", "output_mode": "content"}),
            tool_use("Glob", {"pattern": "**/*.txt"}),
            tool_use("Write", {"file_path": "notes/b.txt", "content": "second\n"}),
            tool_use("Read", {"file_path": "notes/b.txt"}),
        ),
        reply("Done: a.txt has alpha and gamma."),
    )
    session = await h.new_session(builtin_tools=["Read", "Write", "Edit", "Glob", "Grep"])
    await h.put_file(session.id, "seed.txt", "seeded\n")
    out = await h.turn(session.id, "write a file")

    assert out.run.status == RunStatus.COMPLETED
    assert_gap_free(out.events)
    assert out.names.count("message.started") == 3
    assert out.names.count("tool_use") == 7
    assert out.text == "I'll write, then edit.Done: a.txt has alpha and gamma."
    roles = [m.role for m in out.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    # Results answer the uses in order, each with what the tool really did.
    first, second = out.messages[2], out.messages[4]
    uses = blocks(out.messages[3], "tool_use")
    results = blocks(second, "tool_result")
    assert [r["tool_use_id"] for r in results] == [u["id"] for u in uses]
    assert not any(r["is_error"] for r in blocks(first, "tool_result") + results), results
    read_a, grep, glob, _write_b, read_b = (r["content"] for r in results)
    assert "1\talpha" in read_a
    assert "2\tgamma" in read_a
    assert "notes/a.txt:2:gamma" in grep
    assert glob.split("\n") == ["notes/a.txt", "seed.txt"]  # before b.txt was written
    assert "1\tsecond" in read_b  # ran after the Write before it
    assert await h.file(session.id, "notes/a.txt") == b"alpha\ngamma\n"
    # Consecutive read-only tools ran together; a writing tool alone, in order.
    assert in_flight == [
        ("Write", 1),
        ("Edit", 1),
        ("Read", 1),
        ("Grep", 2),
        ("Glob", 3),
        ("Write", 1),
        ("Read", 1),
    ]
    # tool_result events report each result, then the message holding them.
    assert [e["tool_use_id"] for e in out.of("tool_result")][-5:] == [u["id"] for u in uses]
    # The last request answered all five uses in one message.
    last = model.requests[-1]["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result"] * 5
    stored = await h.session(session.id)
    assert stored.output_tokens == sum(
        m.usage["output_tokens"] for m in out.messages if m.usage is not None
    )
    await h.next_request(session.id)


async def test_unknown_tool_gets_an_error_result(h: Harness, model: ScriptedModel) -> None:
    model.script(reply(tool_use("Bash", {"command": "ls"})), reply("ok, no bash"))
    session = await h.new_session(builtin_tools=["Read"])
    out = await h.turn(session.id, "run ls")
    assert out.run.status == RunStatus.COMPLETED
    [result] = out.of("tool_result")
    assert result["is_error"] is True
    assert "Bash" in result["content"]


async def test_thinking_blocks_round_trip_verbatim(h: Harness, model: ScriptedModel) -> None:
    model.script(
        reply(thinking("let me think", "sig-1"), tool_use("Glob", {"pattern": "*"})),
        reply(thinking("done thinking", "sig-2"), "answer"),
    )
    session = await h.new_session(
        builtin_tools=["Glob"],
        model="claude-opus-4-5",
        thinking={"type": "enabled", "budget_tokens": 2048},
        max_tokens=8000,
    )
    out = await h.turn(session.id, "think")
    assert out.run.status == RunStatus.COMPLETED
    assert "".join(d["thinking"] for d in out.of("thinking.delta")) == ("let me thinkdone thinking")
    second = model.requests[1]
    assert second["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert second["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "let me think",
        "signature": "sig-1",
    }


async def test_client_tool_pauses_and_resumes(h: Harness, model: ScriptedModel) -> None:
    model.script(
        reply(
            tool_use("get_weather", {"city": "Oslo"}, id="toolu_client"),
            tool_use("Glob", {"pattern": "*"}, id="toolu_builtin"),
        ),
        reply("It is sunny in Oslo."),
    )
    session = await h.new_session(tools=[WEATHER], builtin_tools=["Glob"])
    await h.put_file(session.id, "a.txt", "a")
    paused = await h.turn(session.id, "weather?")

    run = paused.run
    assert run.status == RunStatus.REQUIRES_ACTION
    assert paused.names[-1] == "run.requires_action"
    assert run.required_action == {
        "type": "tool_results",
        "tool_uses": [{"id": "toolu_client", "name": "get_weather", "input": {"city": "Oslo"}}],
    }
    # The built-in tool ran before the pause; its result waits on the run.
    assert set(run.state.results) == {"toolu_builtin"}
    assert run.state.results["toolu_builtin"].content == "a.txt"
    assert (await h.active_run(session.id)).id == run.id  # the session stays held
    assert [m.role for m in paused.messages] == ["user", "assistant"]  # no result stored yet

    with pytest.raises(Invalid):
        await h.submit_tool_results(run.id, [{"tool_use_id": "nope", "content": "x"}])
    assert (await h.run(run.id)).status == RunStatus.REQUIRES_ACTION

    done = await h.submit_tool_results(
        run.id, [{"tool_use_id": "toolu_client", "content": "sunny, 21C"}]
    )
    assert done.run.status == RunStatus.COMPLETED
    assert done.run.state.results == {}
    assert done.run.required_action is None
    assert_gap_free(done.events)
    resumed = done.events[len(paused.events) :]
    assert [e.name for e in resumed][:3] == ["tool_result", "tool_result", "message.completed"]
    results = blocks(done.messages[2], "tool_result")
    assert [(r["tool_use_id"], r["content"]) for r in results] == [
        ("toolu_client", "sunny, 21C"),
        ("toolu_builtin", "a.txt"),
    ]
    sent = model.requests[-1]["messages"][-1]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in sent] == [
        ("tool_result", "toolu_client"),
        ("tool_result", "toolu_builtin"),
    ]
    assert done.messages[-1].content == [{"type": "text", "text": "It is sunny in Oslo."}]
    with pytest.raises(Conflict):
        await h.submit_tool_results(run.id, [{"tool_use_id": "toolu_client"}])
    await h.next_request(session.id)


async def test_max_tokens_is_continued(h: Harness, model: ScriptedModel) -> None:
    model.script(
        reply("part one, ", stop_reason="max_tokens"),
        reply("part two.", stop_reason="end_turn"),
    )
    session = await h.new_session()
    out = await h.turn(session.id, "x")
    assert out.run.status == RunStatus.COMPLETED
    assert [(m.role, m.is_meta) for m in out.messages] == [
        ("user", False),
        ("assistant", False),
        ("user", True),
        ("assistant", False),
    ]
    assert out.messages[2].content == [{"type": "text", "text": CONTINUE_TEXT}]
    continued = model.requests[1]["messages"]
    assert continued[-1]["role"] == "user"
    assert CONTINUE_TEXT in str(continued[-1]["content"])
    await h.next_request(session.id)


async def test_max_tokens_continuations_are_bounded(
    make_harness: MakeHarness, model: ScriptedModel
) -> None:
    h = make_harness(model, max_continuations=2)
    model.script(*[reply(f"chunk {i} ", stop_reason="max_tokens") for i in range(5)])
    session = await h.new_session()
    out = await h.turn(session.id, "x")
    assert out.run.status == RunStatus.COMPLETED
    assert out.messages[-1].stop_reason == "max_tokens"
    assert len(model.requests) == 3  # the reply and two continuations
    assert model.left == 2


async def test_tool_use_cut_off_by_max_tokens_gets_an_error_result(
    h: Harness, model: ScriptedModel
) -> None:
    model.script(
        reply(
            "Writing it now.",
            cut_tool_use("Write", id="toolu_cut"),
            stop_reason="max_tokens",
        ),
        reply("I'll write a shorter file."),
    )
    session = await h.new_session(builtin_tools=["Write"])
    out = await h.turn(session.id, "write a big file")
    assert out.run.status == RunStatus.COMPLETED
    assert "tool_use" not in out.names  # never announced as ready
    assistant, result = out.messages[1], out.messages[2]
    assert blocks(assistant, "tool_use") == [
        {"type": "tool_use", "id": "toolu_cut", "name": "Write", "input": {}}
    ]
    assert blocks(result, "tool_result") == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_cut",
            "content": TRUNCATED_TOOL_TEXT,
            "is_error": True,
        }
    ]
    assert await h.files(session.id) == []  # the Write did not run
    assert len(model.requests) == 2  # answered with the error, not continued
    assert all(not m.is_meta for m in out.messages)
    await h.next_request(session.id)


async def test_model_call_limit_ends_a_runaway_loop(make_harness: MakeHarness) -> None:
    model = ScriptedModel(responder=lambda body: reply(tool_use("Glob", {"pattern": "*"})))
    h = make_harness(model, max_model_calls_per_run=3)
    session = await h.new_session(builtin_tools=["Glob"])
    out = await h.turn(session.id, "loop")
    assert out.run.status == RunStatus.FAILED
    assert out.run.error["type"] == "model_call_limit"
    assert "3 model calls" in out.run.error["message"]
    assert len(model.requests) == 3
    assert out.run.state.model_calls == 3
    assert out.names[-1] == "run.failed"
    assert [m.role for m in out.messages][-1] == "user"  # the last tool uses are answered
    await h.next_request(session.id)
