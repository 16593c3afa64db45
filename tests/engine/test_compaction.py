"""The compaction layers in real runs below HTTP: micro-compaction, auto-compaction across a
small threshold, reactive compaction, the manual compaction run, the circuit breaker and
context collapse."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

from app.context.summary_prompt import SUMMARY_MARKER
from app.context.types import CLEARED_TOOL_RESULT, COMPACT_BOUNDARY, COMPACT_SUMMARY
from app.conversation import context_report, marks, sessions
from app.conversation.views import ChainCache, load_view
from app.domain import RunKind, RunStatus
from app.engine.compaction.collapse import COLLAPSE_INSTRUCTION, collapse_spans
from app.engine.compaction.layers import MAX_CONSECUTIVE_FAILURES
from app.schemas import ContextOut
from tests.engine.conftest import COLLAPSING, Harness, assert_gap_free, summarising
from tests.engine.scripted import (
    Item,
    bad_request,
    held,
    last_user_text,
    prompt_too_long,
    reply,
    tool_use,
)

SUMMARY = (
    "<analysis>scratch thoughts</analysis>\n<summary>\n1. Primary Request and Intent: read files\n"
    "2. Key Technical Concepts: none\n3. Files and Code Sections: f.txt\n"
    "4. Errors and fixes: none\n"
    "5. Problem Solving: n/a\n6. All user messages: many\n7. Pending Tasks: none\n"
    "8. Current Work: reading\n9. Optional Next Step: continue\n</summary>"
)


def is_summary_request(body: dict[str, Any]) -> bool:
    return SUMMARY_MARKER in last_user_text(body)


def agent(body: dict[str, Any]) -> Item:
    """Summaries when asked; otherwise read a file, then answer (also when the request
    ends with a summary: the reading was done before the compaction)."""
    if is_summary_request(body):
        return reply(SUMMARY)
    last = body["messages"][-1]["content"]
    if any(b.get("type") == "tool_result" for b in last) or "Primary Request" in str(last):
        return reply("I read it.")
    return reply(tool_use("Read", {"file_path": f"f{len(body['messages']) % 3}.txt"}))


async def seed_files(h: Harness, session_id: Any, size: int = 6000) -> None:
    for i in range(3):
        line = f"line {i} " + "x" * 60 + "\n"
        await h.put_file(session_id, f"f{i}.txt", line * (size // len(line)))


def result_contents(body: dict[str, Any]) -> list[Any]:
    return [
        b.get("content")
        for m in body["messages"]
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]


def first_text(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"][0]["text"])


async def report(h: Harness, session_id: Any) -> ContextOut:
    session = await h.session(session_id)
    async with h.db.sessionmaker() as db:
        return await context_report.context_report(db, session, h.settings, ChainCache(0))


async def test_micro_compaction_clears_old_results_in_requests(h: Harness) -> None:
    h.model.responder = agent
    session = await h.new_session(
        builtin_tools=["Read"],
        compaction={"keep_recent_tool_results": 2, "micro_batch_tokens": 1000, "auto": False},
    )
    await seed_files(h, session.id)
    for i in range(6):
        assert (await h.turn(session.id, f"turn {i}")).run.status == RunStatus.COMPLETED
    cleared = [
        [content == CLEARED_TOOL_RESULT for content in result_contents(body)]
        for body in h.model.requests
    ]
    assert not any(cleared[0])
    final = cleared[-1]
    assert final.count(True) >= 3
    assert final[-2:] == [False, False]  # the newest two are never cleared
    # Monotone: once cleared in a request, a result stays cleared in later ones.
    for before, after in itertools.pairwise(cleared):
        assert all(a for b, a in zip(before, after, strict=False) if b)
    # A projection: the model's view shows the placeholder, the history keeps the text.
    view = await h.view(session.id)
    shown = [b.get("content") for n in view.projected for b in n.content if "tool_use_id" in b]
    assert CLEARED_TOOL_RESULT in shown
    stored = [
        b.get("content")
        for m in await h.chain(session.id)
        for b in m.content
        if b.get("type") == "tool_result"
    ]
    assert CLEARED_TOOL_RESULT not in stored
    assert len(stored) == 6


async def test_micro_watermark_applies_to_the_request_that_moves_it(h: Harness) -> None:
    """Every request keeps at most `keep_recent` results uncleared: a watermark moved
    before a request is in that request, not the next one."""
    h.model.responder = agent
    session = await h.new_session(
        builtin_tools=["Read"],
        compaction={"keep_recent_tool_results": 2, "micro_batch_tokens": 1, "auto": False},
    )
    await seed_files(h, session.id)
    moved = []
    for i in range(5):
        await h.turn(session.id, f"turn {i}")
        moved.append((await h.view(session.id)).watermark)
    assert len(h.model.requests) == 10
    for body in h.model.requests:
        results = result_contents(body)
        uncleared = [c for c in results if c != CLEARED_TOOL_RESULT]
        assert len(uncleared) <= 2, (len(results), len(uncleared))
    assert moved[:2] == [None, None]  # nothing to clear while two results or fewer
    positions = [m for m in moved[2:] if m is not None]
    assert len(positions) == 3
    assert positions == sorted(positions)  # it only ever moves forward
    assert positions[-1] > positions[0]


def chatty(body: dict[str, Any]) -> Item:
    """Summaries when asked; otherwise a long answer and no tools."""
    return reply(SUMMARY) if is_summary_request(body) else reply("word " * 300)


def question(i: int) -> str:
    return f"question {i}: " + "please explain this in detail " * 10


async def test_auto_compaction_across_a_small_threshold(h: Harness) -> None:
    h.model.responder = chatty
    session = await h.new_session(compaction={"threshold_tokens": 3000, "micro": False})
    for i in range(15):
        out = await h.turn(session.id, question(i))
        assert out.run.status == RunStatus.COMPLETED, out.run.error
        if "compaction.completed" in out.names:
            break
    else:
        raise AssertionError("no auto-compaction in 15 turns")
    assert_gap_free(out.events)

    # Reported in order: started, the rows it stored, completed, then the model call.
    names = out.names
    started, completed = names.index("compaction.started"), names.index("compaction.completed")
    assert names[:2] == ["run.started", "message.completed"]  # the claim: the user's turn
    assert names[2] == "compaction.started"  # before the turn's first request
    assert names[completed + 1] == "message.started"
    [begun] = out.of("compaction.started")
    [done] = out.of("compaction.completed")
    assert begun["trigger"] == "auto"
    assert begun["pre_tokens"] == done["pre_tokens"] > 3000
    assert done["post_tokens"] < done["pre_tokens"]

    # What it stored: a boundary, the summary, then copies of the kept rows.
    user, boundary, summary, *copies, answer = out.messages
    assert user.content[0]["text"] == question(i)
    assert (boundary.subtype, boundary.parent_uuid) == (COMPACT_BOUNDARY, None)
    # It covers everything before the first kept message, which it copied.
    originals = [await h.message(session.id, copy.copied_from) for copy in copies]
    first_kept = originals[0]
    assert boundary.logical_parent_uuid == first_kept.parent_uuid
    assert boundary.metadata["covered"]["last_uuid"] == str(first_kept.parent_uuid)
    assert boundary.metadata["trigger"] == "auto"
    assert boundary.metadata["kept"] == len(copies) > 0
    assert (summary.subtype, summary.parent_uuid) == (COMPACT_SUMMARY, boundary.uuid)
    assert [str(boundary.uuid), str(summary.uuid)] == [
        done["boundary_uuid"],
        done["summary_uuid"],
    ]
    summary_text = summary.content[0]["text"]
    assert "Primary Request and Intent" in summary_text
    assert "scratch thoughts" not in summary_text
    assert copies[-1].copied_from == user.uuid  # the new question is kept verbatim
    for copy, original in zip(copies, originals, strict=True):
        assert (copy.role, copy.content) == (original.role, original.content)
    # The originals stay where they were (nothing re-parented): on the old branch.
    assert originals[-1].uuid not in {m.uuid for m in await h.chain(session.id, full=True)}
    assert answer.parent_uuid == copies[-1].uuid
    # Only the new rows are reported; the copies are not reported again.
    reported = [e for e in out.events[started:completed] if e.name == "message.completed"]
    assert [e.data["uuid"] for e in reported] == [str(boundary.uuid), str(summary.uuid)]

    # The summary was asked for; the next request starts at the summary.
    summary_request, after = h.model.requests[-2:]
    assert is_summary_request(summary_request)
    [merged] = after["messages"]  # the summary, then the kept question (one user turn)
    assert [b["text"] for b in merged["content"]] == [summary_text, question(i)]
    view = await h.view(session.id)
    assert view.records[0].uuid == summary.uuid
    await h.next_request(session.id)


async def test_auto_compaction_repeatedly_keeps_the_session_working(h: Harness) -> None:
    h.model.responder = agent
    session = await h.new_session(
        builtin_tools=["Read"], compaction={"threshold_tokens": 6000, "micro": False}
    )
    await seed_files(h, session.id)
    total = 0
    for i in range(10):
        out = await h.turn(session.id, f"please read file number {i}")
        assert out.run.status == RunStatus.COMPLETED, out.run.error
        assert_gap_free(out.events)
        total += out.names.count("compaction.completed")
        for done in out.of("compaction.completed"):
            assert done["post_tokens"] < done["pre_tokens"]
    assert total >= 2
    # The history is whole across the boundaries; the model's view starts at the last.
    full = await h.chain(session.id, full=True)
    assert full[0].content[0]["text"] == "please read file number 0"
    boundaries = [m for m in full if m.subtype == COMPACT_BOUNDARY]
    assert len(boundaries) == total
    # The file being read when it compacted was re-attached.
    assert all(b.metadata["files"] >= 1 for b in boundaries)
    attached = [m.content[0]["text"] for m in full if m.type == "attachment"]
    assert attached
    assert all(text.startswith("Contents of f") and "line " in text for text in attached)
    view = await h.view(session.id)
    assert view.records[0].subtype == COMPACT_SUMMARY
    context = await report(h, session.id)
    assert context.last_compaction is not None
    assert context.last_compaction["trigger"] == "auto"
    assert context.estimated_tokens < 6000 * 1.5
    await h.next_request(session.id)


async def test_reactive_compaction_after_prompt_too_long(h: Harness) -> None:
    h.model.responder = agent
    session = await h.new_session(builtin_tools=["Read"], compaction={"auto": False})
    await seed_files(h, session.id, size=9000)
    for i in range(4):
        await h.turn(session.id, f"turn {i}")
    h.model.script(prompt_too_long(tokens=7000, maximum=6000))
    before = len(h.model.requests)
    out = await h.turn(session.id, "one more")

    assert out.run.status == RunStatus.COMPLETED, out.run.error
    assert_gap_free(out.events)
    [started] = out.of("compaction.started")
    assert started == {"trigger": "reactive", "pre_tokens": 7000}
    names = out.names
    assert names.index("compaction.started") < names.index("compaction.completed")
    rejected, summary_request, retried, *_ = h.model.requests[before:]
    assert not is_summary_request(rejected)
    assert is_summary_request(summary_request)
    summary = next(m for m in out.messages if m.subtype == COMPACT_SUMMARY)
    assert first_text(retried) == summary.content[0]["text"]
    assert len(str(retried)) < len(str(rejected))
    boundary = next(m for m in out.messages if m.subtype == COMPACT_BOUNDARY)
    assert boundary.metadata["trigger"] == "reactive"
    await h.next_request(session.id)


async def test_prompt_still_too_long_after_compaction_fails_the_run(h: Harness) -> None:
    h.model.responder = agent
    session = await h.new_session(builtin_tools=["Read"], compaction={"auto": False})
    await seed_files(h, session.id)
    for i in range(3):
        await h.turn(session.id, f"turn {i}")
    h.model.script(prompt_too_long(7000, 6000))  # then the summary (the responder)
    h.model.responder = lambda body: (
        reply(SUMMARY) if is_summary_request(body) else prompt_too_long(5000, 4000)
    )
    out = await h.turn(session.id, "one more")
    assert out.run.status == RunStatus.FAILED
    assert out.run.error["type"] == "context_overflow"
    assert out.names.count("compaction.completed") == 1  # compacted once, not again
    await h.next_request(session.id)


async def test_manual_compaction_run(h: Harness) -> None:
    h.model.responder = agent
    session = await h.new_session(builtin_tools=["Read"])
    await seed_files(h, session.id)
    for i in range(8):
        await h.turn(session.id, f"turn {i}")
    before = await h.chain(session.id)

    out = await h.compact(session.id, "focus on file names")
    run = out.run
    assert (run.kind, run.status) == (RunKind.COMPACT, RunStatus.COMPLETED)
    result = run.state.compaction
    assert result is not None
    assert result.trigger == "manual"
    assert result.messages_compacted > 0
    assert result.post_tokens < result.pre_tokens
    assert result.tokens_saved == result.pre_tokens - result.post_tokens
    assert "Primary Request" in result.summary
    assert "focus on file names" in last_user_text(h.model.requests[-1])
    assert_gap_free(out.events)
    assert out.names[0] == "run.started"
    assert out.names[1] == "compaction.started"
    assert out.names[-2:] == ["compaction.completed", "run.completed"]
    boundary = out.messages[0]
    assert boundary.uuid == result.boundary_uuid
    assert boundary.subtype == COMPACT_BOUNDARY
    assert boundary.metadata["trigger"] == "manual"
    assert boundary.metadata["instructions"] == "focus on file names"
    assert boundary.metadata["covered"]["messages"] == result.messages_compacted
    assert boundary.metadata["covered"]["first_uuid"] == str(before[0].uuid)
    # Nothing was rewritten: the full history still holds every covered message.
    covered = result.messages_compacted
    full = await h.chain(session.id, full=True)
    assert [m.uuid for m in full[:covered]] == [m.uuid for m in before[:covered]]
    assert full[covered].uuid == boundary.uuid
    # The next turn goes on from the summary.
    after = await h.turn(session.id, "go on")
    assert after.run.status == RunStatus.COMPLETED
    summary = next(m for m in out.messages if m.subtype == COMPACT_SUMMARY)
    assert first_text(h.model.requests[-2]) == summary.content[0]["text"]
    await h.next_request(session.id)


async def test_manual_compaction_with_nothing_to_compact_fails(h: Harness) -> None:
    session = await h.new_session()
    out = await h.compact(session.id)
    assert out.run.status == RunStatus.FAILED
    assert out.run.error["type"] == "nothing_to_compact"
    assert h.model.requests == []
    assert await h.chain(session.id) == []


async def test_auto_compaction_pauses_after_three_failures(h: Harness) -> None:
    """Failed auto-compactions let the turn go on while the request fits; after three in
    a row the session stops trying until a compaction succeeds."""
    allowed = False

    def responder(body: dict[str, Any]) -> Item:
        if is_summary_request(body) and not allowed:
            return bad_request("summary refused for this test")
        return agent(body)

    h.model.responder = responder
    session = await h.new_session(
        builtin_tools=["Read"], compaction={"threshold_tokens": 3000, "micro": False}
    )
    await seed_files(h, session.id)
    for i in range(6):
        out = await h.turn(session.id, f"t{i}")
        assert out.run.status == RunStatus.COMPLETED  # the 1M window still fits
    attempts = [b for b in h.model.requests if is_summary_request(b)]
    assert len(attempts) == MAX_CONSECUTIVE_FAILURES
    assert (await h.session(session.id)).compact_failures == MAX_CONSECUTIVE_FAILURES
    assert not [m for m in await h.chain(session.id) if m.subtype == COMPACT_BOUNDARY]

    allowed = True
    assert (await h.compact(session.id)).run.status == RunStatus.COMPLETED
    assert (await h.session(session.id)).compact_failures == 0
    for text in ("again", "and again"):
        assert (await h.turn(session.id, text)).run.status == RunStatus.COMPLETED
    attempts = [b for b in h.model.requests if is_summary_request(b)]
    assert len(attempts) > MAX_CONSECUTIVE_FAILURES + 1  # the manual one, then auto again


async def test_context_collapse_projects_finished_spans(h: Harness) -> None:
    def responder(body: dict[str, Any]) -> Item:
        if COLLAPSE_INSTRUCTION in last_user_text(body):
            return reply("Read a file and reported on it.")
        return agent(body)

    h.model.responder = responder
    session = await h.new_session(
        builtin_tools=["Read"],
        compaction=COLLAPSING,
    )
    await seed_files(h, session.id)
    summarised = 0
    for i in range(8):
        assert (await h.turn(session.id, f"turn {i}")).run.status == RunStatus.COMPLETED
        summarised += await collapse_spans(h.resources, session.id)  # as after each run
    assert summarised > 0
    assert [b for b in h.model.requests if COLLAPSE_INSTRUCTION in last_user_text(b)]
    shown = [
        b for b in h.model.requests if "[Summary of earlier work: Read a file" in str(b["messages"])
    ]
    assert shown, "a collapsed span should have been sent in place of its messages"
    view = await h.view(session.id)
    collapsed = [n for n in view.projected if n.subtype == "collapsed"]
    assert collapsed
    assert collapsed[0].content[0]["text"].startswith("[Summary of earlier work")
    full = await h.chain(session.id)
    assert not [m for m in full if m.subtype in ("collapsed", COMPACT_BOUNDARY)]
    assert len(full) > len(view.projected)
    await h.next_request(session.id)


async def test_a_run_ending_while_its_sessions_collapse_works_starts_no_second_one(
    h: Harness,
) -> None:
    """The collapse after a run is still waiting for its summary when the next run
    ends: that run's check is left out (it would summarise the same turn again), so
    each span is summarised once; the run after checks again."""
    collapsing = held("Talked at length.", after=1)
    h.model.responder = summarising(collapsing)
    session = await h.new_session(compaction=COLLAPSING)
    for i in range(4):  # the third run's end starts a collapse of the first turn
        run = await h.start(session.id, f"note {i}: " + "remember this " * 800)
        await h.supervisor.wait_settled(run.id, poll_seconds=0.02)
        if i == 2:
            await asyncio.wait_for(collapsing.reached.wait(), 10)
    collapsing.release()
    await h.settle(run.id)  # and the collapse: done
    await h.settle((await h.start(session.id, "and the last one")).id)
    summaries = [b for b in h.model.requests if COLLAPSE_INSTRUCTION in last_user_text(b)]
    async with h.db.sessionmaker() as db:
        starts = [c.start_uuid for c in (await marks.load(db, session.id)).collapses]
    assert len(summaries) == len(starts) == len(set(starts)) == 3  # turns 1, then 2 and 3


async def test_collapse_check_after_a_run_is_decided_from_its_last_reply(h: Harness) -> None:
    """A run that ends on a reply knows the view's size from its usage: below half of
    the collapse point the supervisor loads nothing; past it, the check runs."""
    session = await h.new_session(compaction={"threshold_tokens": 40_000, "collapse_at": 0.5})
    h.model.script(reply("short", usage={"input_tokens": 200}))
    run, claimed = await h.claim(session.id, "hi")
    runner = await h.execute(run, claimed)
    assert runner is not None
    assert not runner.may_collapse()

    h.model.script(reply("long", usage={"input_tokens": 9_000, "output_tokens": 1_500}))
    run, claimed = await h.claim(session.id, "more")
    runner = await h.execute(run, claimed)
    assert runner is not None
    assert runner.may_collapse()


async def test_marks_are_cached_with_the_version_that_every_writer_bumps(h: Harness) -> None:
    """The view cache keeps the marks it read with the session's `marks_version`; a
    writer of marks bumps it, so the next view at the row's version reads them again."""
    session = await h.new_session()
    for text in ("one", "two"):
        h.model.script(reply(f"answer {text}"))
        await h.turn(session.id, text)
    session = await h.session(session.id)
    views = ChainCache()
    config = sessions.config_of(session, h.settings)
    version = session.marks_version
    async with h.db.sessionmaker() as db:
        first = await load_view(
            db, views, session.id, session.head_uuid, config.compactable, marks_version=version
        )
    assert first.snipped == set()
    assert views.marks_at(session.id, version) is not None
    snipped = [uuid.UUID(first.nodes[0].uuid), uuid.UUID(first.nodes[1].uuid)]
    async with h.db.transaction() as db:
        await marks.add_snips(db, session.id, snipped)
    session = await h.session(session.id)
    assert session.marks_version == version + 1
    async with h.db.sessionmaker() as db:
        again = await load_view(
            db,
            views,
            session.id,
            session.head_uuid,
            config.compactable,
            marks_version=session.marks_version,
        )
    assert again.snipped == {str(u) for u in snipped}
    assert str(snipped[0]) not in {node.uuid for node in again.projected}
