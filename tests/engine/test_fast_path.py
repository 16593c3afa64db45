"""The fast path of a turn on Postgres: the claim in one autocommitted statement while the
session is as it was read; the model request sent while the claim is stored, by that
statement or by the request's transaction (a post that looks first), with nothing sent
or stored before it is, and nothing at all, the model request closed, when it is not;
the views and followers of a run executing here served from memory, equal to what is
stored."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy import text as sql
from sqlalchemy.exc import DBAPIError

from app import metrics
from app.conversation import session_rows
from app.db import Base, is_transient
from app.domain import IfBusy, RunParams, RunStatus
from app.engine import events as events_module
from app.engine import runs
from app.engine.compaction.collapse import COLLAPSE_INSTRUCTION
from app.engine.events import StoredEvent
from app.errors import Conflict
from app.models import AgentSession, Collapse, Message, Run, RunEvent
from tests.engine.conftest import COLLAPSING, TENANT, Harness, assert_gap_free, summarising
from tests.engine.scripted import ScriptedModel, held, last_user_text, reply, tool_use
from tests.statements import CLAIM, wait_for_lock

LONG = " ".join(f"word{i}" for i in range(60))  # many deltas (8 characters each)


# A post that looks before it claims (`enqueue`) claims in the request's transaction.
ENQUEUE = IfBusy.ENQUEUE


class RequestFailed(Exception):
    pass


async def warm_session(h: Harness, model: ScriptedModel) -> AgentSession:
    """A session with one turn done: its view is in this process's memory, so the next
    turn calls the model while its claim commits (a cold view is read after it)."""
    session = await h.new_session()
    model.script(reply("warm"))
    await h.turn(session.id, "warm up")
    return await h.session(session.id)


async def count(h: Harness, model: type[Base], **where: object) -> int:
    table = model.__table__
    query = select(func.count()).select_from(table)
    for name, value in where.items():
        query = query.where(table.c[name] == value)  # type: ignore[attr-defined]
    async with h.db.sessionmaker() as db:
        return int(await db.scalar(query) or 0)


def subscribe(h: Harness, run_id: uuid.UUID) -> asyncio.Queue[StoredEvent | None]:
    inbox: asyncio.Queue[StoredEvent | None] = asyncio.Queue()
    h.resources.events.channels[run_id].subscribers.add(inbox)
    return inbox


async def first_events(h: Harness, run_id: uuid.UUID, n: int) -> list[str]:
    """The names of a run's first `n` events, as a follower of it gets them."""

    async def running() -> str:
        return "running"

    names: list[str] = []
    follower = h.resources.events.follow(run_id, 0, status=running)
    async for batch in follower:
        names += [event.event for event in batch]
        if len(names) >= n:
            break
    await follower.aclose()
    return names[:n]


async def served_here(h: Harness, model: ScriptedModel) -> AgentSession:
    """A session whose last turn was posted to and ended in this process: the row it
    keeps shows the session idle, so the next plain turn calls the model while its
    claim is sent."""
    session = await h.new_session()
    model.script(reply("warm"))
    out = await h.settle((await post(h, session.id, "warm up")).id)
    assert out.run.status == RunStatus.COMPLETED
    return await h.session(session.id)


async def post(h: Harness, session_id: uuid.UUID, text: str) -> Run:
    """A plain turn as the route posts it: the session row kept here or read with its
    version, claimed in one statement."""
    async with h.db.transaction() as db:
        turn = await session_rows.for_turn(db, h.resources.session_rows, TENANT, session_id)
        return await h.admission.submit(db, turn.row, RunParams(content=text), version=turn.version)


def claims(outcome: str, overlapped: bool) -> float:
    """How many one-statement claims ended so (the Prometheus counter)."""
    labels = {"outcome": outcome, "overlapped": str(overlapped).lower()}
    value = metrics.REGISTRY.get_sample_value("parley_turn_claims_total", labels)
    return value or 0.0


async def terminate_waiting_claim(h: Harness) -> None:
    """Terminate the backend whose claim statement waits for a row lock (once it does)."""
    await wait_for_lock(h.db.engine, CLAIM)
    terminate = sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND query LIKE :q"
    )
    async with h.db.sessionmaker() as db:
        assert (await db.execute(terminate, {"q": CLAIM})).scalars().all() == [True]


def drain(inbox: asyncio.Queue[StoredEvent | None]) -> list[StoredEvent | None]:
    found = []
    while not inbox.empty():
        found.append(inbox.get_nowait())
    return found


async def test_a_claim_that_rolls_back_stops_its_run_before_it_sends_or_stores(
    h: Harness, model: ScriptedModel
) -> None:
    session = await warm_session(h, model)
    gate = held(LONG, after=6)
    model.script(gate)
    before = await count(h, Message, session_id=session.id)
    seen: dict[str, Any] = {}

    async def post_then_fail() -> None:
        async with h.db.transaction() as db:
            row = await db.get(AgentSession, session.id)
            assert row is not None
            run = await h.admission.submit(db, row, RunParams(content="hi"), if_busy=ENQUEUE)
            seen["run"], seen["inbox"] = run.id, subscribe(h, run.id)
            # The model is streaming while the claim is not committed yet.
            await asyncio.wait_for(gate.reached.wait(), 10)
            assert h.resources.events.channels[run.id].unwritten, "deltas were taken"
            raise RequestFailed  # the request fails before its commit

    with pytest.raises(RequestFailed):
        await post_then_fail()
    launched, inbox = seen["run"], seen["inbox"]
    await asyncio.wait_for(gate.abandoned.wait(), 10)  # the model request was closed
    await asyncio.wait_for(h.supervisor.wait_settled(launched, poll_seconds=0.02), 10)
    assert launched not in h.supervisor.tasks
    assert launched not in h.resources.events.channels
    assert [e for e in drain(inbox) if e is not None] == [], "nothing was sent"
    assert await count(h, Run, id=launched) == 0
    assert await count(h, RunEvent, run_id=launched) == 0
    assert await count(h, Message, session_id=session.id) == before
    assert (await h.session(session.id)).head_uuid == session.head_uuid

    # The session is free: the next turn runs as usual.
    model.script(reply("after the failure"))
    out = await h.settle((await h.start(session.id, "again")).id)
    assert out.run.status == RunStatus.COMPLETED
    assert out.text == "after the failure"


async def test_a_one_statement_claim_is_stored_and_sent_before_the_request_commits(
    h: Harness, model: ScriptedModel
) -> None:
    session = await warm_session(h, model)
    gate = held(LONG, after=6)
    model.script(gate)
    seen: dict[str, Any] = {}

    async def post_then_fail() -> None:
        async with h.db.transaction() as db:
            row = await db.get(AgentSession, session.id)
            assert row is not None
            run = await h.admission.submit(db, row, RunParams(content="hi"))
            seen["run"] = run.id
            # Its own statement, committed: other connections see the turn already.
            assert await count(h, Run, id=run.id) == 1
            await asyncio.wait_for(gate.reached.wait(), 10)
            names = await asyncio.wait_for(first_events(h, run.id, 4), 10)
            assert names == ["run.started", "message.completed", "message.started", "text.delta"]
            raise RequestFailed  # what the request does after cannot undo the turn

    with pytest.raises(RequestFailed):
        await post_then_fail()
    gate.release()
    out = await h.settle(seen["run"])
    assert out.run.status == RunStatus.COMPLETED
    assert out.text == LONG
    assert_gap_free(out.events)


async def test_a_pending_claim_holds_its_events_until_it_commits(
    h: Harness, model: ScriptedModel
) -> None:
    session = await warm_session(h, model)
    gate = held(LONG, after=6)
    model.script(gate)

    async with h.db.transaction() as db:
        row = await db.get(AgentSession, session.id)
        assert row is not None
        run = await h.admission.submit(db, row, RunParams(content="hi"), if_busy=ENQUEUE)
        inbox = subscribe(h, run.id)
        await asyncio.wait_for(gate.reached.wait(), 10)
        assert drain(inbox) == [], "no delta is sent before the claim is stored"
        assert await count(h, Run, id=run.id) == 0  # not visible outside the transaction
    sent = drain(inbox)  # released by the commit
    assert sent, "the held deltas are sent once the claim is stored"
    gate.release()
    out = await h.settle(run.id)

    assert out.run.status == RunStatus.COMPLETED
    assert out.text == LONG
    assert_gap_free(out.events)
    stored = {e.seq: (e.name, e.data) for e in out.events}
    for event in sent:
        assert event is not None
        assert stored[event.seq] == (event.event, json.loads(event.data))


async def test_a_stale_session_is_claimed_after_looking(h: Harness, model: ScriptedModel) -> None:
    session = await h.new_session()
    async with h.db.sessionmaker() as db:
        stale = await db.get(AgentSession, session.id)
    assert stale is not None
    model.script(reply("first answer"))
    first = await h.turn(session.id, "first")
    messages = await count(h, Message, session_id=session.id)

    async with h.db.transaction() as db:
        db.add(stale)
        run = h.admission._new_run(stale, runs.RunKind.TURN, RunParams(content="x"), None, "")
        claimed = await runs.claim_at_once(db, h.db, stale, run, worker_id="w", lease_seconds=10.0)
        assert claimed is None, "the guard saw the session move"
    assert await count(h, Message, session_id=session.id) == messages
    assert await count(h, Run, id=run.id) == 0

    # Through admission the same stale read is claimed under the current head.
    model.script(reply("second answer"))
    async with h.db.transaction() as db:
        db.add(stale)
        second = await h.admission.submit(db, stale, RunParams(content="second"))
    out = await h.settle(second.id)
    assert out.run.status == RunStatus.COMPLETED
    user = out.messages[0]
    assert user.parent_uuid == first.messages[-1].uuid


async def test_the_view_kept_in_memory_is_the_stored_chain(
    h: Harness, model: ScriptedModel
) -> None:
    model.script(
        reply("one"),
        reply(tool_use("Write", {"path": "a.txt", "content": "x"}, id="toolu_1")),
        reply("two"),
        reply("three"),
    )
    session = await h.new_session()
    for text in ("first", "second", "third"):
        out = await h.settle((await h.start(session.id, text)).id)
        assert out.run.status == RunStatus.COMPLETED
        head = (await h.session(session.id)).head_uuid
        kept = h.resources.views.peek(session.id, head)
        assert kept is not None, "the view at the head is in memory"
        stored = await h.chain(session.id, full=False)
        assert [r.uuid for r in kept] == [r.uuid for r in stored]
        assert [r.content for r in kept] == [r.content for r in stored]


async def test_a_follower_of_a_run_here_sees_the_stored_log(
    h: Harness, model: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events_module, "RECENT_EVENTS", 8)  # memory keeps few: table too
    gate = held(LONG, after=-1)
    model.script(gate)
    session = await h.new_session()
    run = await h.start(session.id, "hi")
    await asyncio.wait_for(gate.reached.wait(), 10)

    async def status() -> str | None:
        async with h.db.sessionmaker() as db:
            return await runs.status_of(db, run.id)

    async def follow(after: int) -> list[StoredEvent]:
        return [
            e
            async for batch in h.resources.events.follow(run.id, after, status=status)
            for e in batch
        ]

    followers = [asyncio.create_task(follow(after)) for after in (0, 3, 20)]
    await asyncio.sleep(0.05)
    gate.release()
    out = await h.settle(run.id)
    stored = [(e.seq, e.name, e.data) for e in out.events]
    for after, task in zip((0, 3, 20), followers, strict=True):
        seen = [(e.seq, e.event, json.loads(e.data)) for e in await task]
        assert seen == [s for s in stored if s[0] > after]


async def test_a_follower_gets_the_events_at_hand_in_one_batch(
    h: Harness, model: ScriptedModel
) -> None:
    """A stream writes each batch at once: a client catching up gets one write."""
    model.script(reply(LONG))
    session = await h.new_session()
    out = await h.settle((await h.start(session.id, "hi")).id)

    async def ended() -> str:
        return "completed"

    batches = [b async for b in h.resources.events.follow(out.run.id, 0, status=ended)]
    assert [[e.seq for e in batch] for batch in batches] == [[e.seq for e in out.events]]
    assert batches[0][-1].event == "run.completed"


async def test_a_one_statement_claim_losing_to_a_committing_claim_is_a_conflict(
    h: Harness, model: ScriptedModel
) -> None:
    """A compaction claimed with the session's head unchanged commits while the turn's
    statement waits for the session row: the turn's guard still holds on the new row,
    its snapshot cannot see the new run, and the one-active-run index refuses it: 409,
    and nothing of the turn is stored."""
    session = await warm_session(h, model)
    messages = await count(h, Message, session_id=session.id)
    async with h.db.sessionmaker() as first, h.db.sessionmaker() as second:
        compacting = await first.get(AgentSession, session.id)
        posting = await second.get(AgentSession, session.id)
        assert compacting is not None
        assert posting is not None
        compaction = h.admission._new_run(compacting, runs.RunKind.COMPACT, RunParams(), None, "")
        await runs.claim(first, compacting, compaction, worker_id="a", lease_seconds=10.0)
        turn = h.admission._new_run(posting, runs.RunKind.TURN, RunParams(content="x"), None, "")
        racing = asyncio.create_task(
            runs.claim_at_once(second, h.db, posting, turn, worker_id="b", lease_seconds=10.0)
        )
        await asyncio.sleep(0.3)  # the statement waits for the session row
        assert not racing.done()
        await first.commit()
        with pytest.raises(Conflict):
            await racing
    assert await count(h, Run, id=turn.id) == 0
    assert await count(h, Message, session_id=session.id) == messages
    active = await h.active_run(session.id)
    assert active is not None
    assert active.id == compaction.id
    await h.abandon(compaction.id)  # claimed here, executed by nobody


async def test_a_follower_is_sent_each_delta_before_a_buffered_stream_is_read_on(
    h: Harness, model: ScriptedModel
) -> None:
    """Model events that arrive together (read from a buffer, with no wait between
    them) do not hold a follower back until the last is read."""
    gate = held(LONG, after=1)  # after the gate, every event at once
    model.script(gate)
    read = 0
    scripted = model.stream

    async def counted(body: dict[str, Any]) -> Any:
        nonlocal read
        async for event in scripted(body):
            read += 1
            yield event

    model.stream = counted  # type: ignore[method-assign]
    session = await h.new_session()
    run = await h.start(session.id, "hi")
    await asyncio.wait_for(gate.reached.wait(), 10)
    inbox = subscribe(h, run.id)
    heard_at: list[int] = []

    async def follow() -> None:
        while (event := await inbox.get()) is not None:
            if event.event == "text.delta":
                heard_at.append(read)

    follower = asyncio.create_task(follow())
    gate.release()
    out = await h.settle(run.id)
    await asyncio.wait_for(follower, 10)
    assert out.run.status == RunStatus.COMPLETED
    deltas = len(out.of("text.delta"))
    assert len(heard_at) == deltas > 2
    assert heard_at[0] < read, "the first delta went out before the stream was read"
    assert heard_at == sorted(set(heard_at)), "each delta before the next was read"


async def test_a_plain_turn_calls_the_model_while_its_claim_is_sent(
    h: Harness, model: ScriptedModel
) -> None:
    """The claim's statement waits for the session row (held by another transaction):
    the model is already streaming, and nothing is sent or visible until it is stored."""
    session = await served_here(h, model)
    gate = held(LONG, after=6)
    model.script(gate)
    stored_early = claims("stored", True)
    async with h.db.sessionmaker() as other:
        await other.get(AgentSession, session.id, with_for_update=True)
        posting = asyncio.create_task(post(h, session.id, "hi"))
        await asyncio.wait_for(gate.reached.wait(), 10)
        assert not posting.done(), "the claim is still waiting for the row"
        [run_id] = [r for r in h.resources.events.channels if r in h.supervisor.tasks]
        inbox = subscribe(h, run_id)
        assert drain(inbox) == [], "nothing is sent before the claim is stored"
        assert await count(h, Run, id=run_id) == 0
        await other.commit()  # the row is free: the claim is stored
    run = await asyncio.wait_for(posting, 10)
    assert run.id == run_id
    assert claims("stored", True) == stored_early + 1
    sent = drain(inbox)
    assert [e.event for e in sent if e is not None][:1] == ["message.started"]
    gate.release()
    out = await h.settle(run.id)
    assert out.run.status == RunStatus.COMPLETED
    assert out.text == LONG
    assert_gap_free(out.events)
    assert len(model.requests) == 2  # the warm-up's and this turn's


async def test_a_claim_whose_guard_fails_closes_its_model_request(
    h: Harness, model: ScriptedModel
) -> None:
    """The session row changes (a PATCH through another replica) while the claim waits
    for it: the guard fails, the model request already streaming is closed, nothing of
    that run is stored or sent, and the turn is claimed the careful way, from the row as
    it is now, as another run. The session counts as shared from then on: its turns are
    claimed before their model request starts."""
    session = await served_here(h, model)
    gate = held(LONG, after=6)
    model.script(gate, reply("from the new settings"))
    before = await count(h, Message, session_id=session.id)
    aborted = claims("guard_failed", True)
    async with h.db.sessionmaker() as other:
        row = await other.get(AgentSession, session.id, with_for_update=True)
        assert row is not None
        posting = asyncio.create_task(post(h, session.id, "hi"))
        await asyncio.wait_for(gate.reached.wait(), 10)
        [early] = [r for r in h.resources.events.channels if r in h.supervisor.tasks]
        inbox = subscribe(h, early)
        row.system = "New rules."
        await other.commit()
    run = await asyncio.wait_for(posting, 10)
    await asyncio.wait_for(gate.abandoned.wait(), 10)  # the model request was closed
    assert run.id != early
    assert claims("guard_failed", True) == aborted + 1
    assert [e for e in drain(inbox) if e is not None] == [], "nothing of it was sent"
    assert await count(h, Run, id=early) == 0
    assert await count(h, RunEvent, run_id=early) == 0

    out = await h.settle(run.id)
    assert out.run.status == RunStatus.COMPLETED
    assert out.text == "from the new settings"
    assert model.requests[-1]["system"][0]["text"] == "New rules."
    assert await count(h, Message, session_id=session.id) == before + 2
    assert_gap_free(out.events)

    # Shared now: the next turn's model request waits for its claim.
    assert h.resources.session_rows.shared(session.id)
    model.script(reply("later"))
    stored_late = claims("stored", False)
    out = await h.settle((await post(h, session.id, "again")).id)
    assert out.text == "later"
    assert claims("stored", False) == stored_late + 1


async def test_a_turn_to_a_session_running_here_starts_no_model_request(
    h: Harness, model: ScriptedModel
) -> None:
    """A run of the session executes here: its guard would fail, so a second post is
    claimed (and refused) before any model request."""
    session = await served_here(h, model)
    gate = held(LONG, after=2)
    model.script(gate)
    first = await post(h, session.id, "first")
    await asyncio.wait_for(gate.reached.wait(), 10)
    calls = len(model.requests)
    with pytest.raises(Conflict):
        await post(h, session.id, "second")
    assert len(model.requests) == calls
    gate.release()
    assert (await h.settle(first.id)).run.status == RunStatus.COMPLETED


async def test_a_claim_lost_with_its_connection_closes_its_model_request(
    h: Harness, model: ScriptedModel
) -> None:
    """The claim's connection dies while its statement waits (its backend terminated):
    whether it was stored is unknown, so the run launched meanwhile is stopped (its
    model request closed) and the post fails as the database did; nothing was stored,
    and the next turn runs as usual."""
    session = await served_here(h, model)
    gate = held(LONG, after=2)
    model.script(gate)
    messages = await count(h, Message, session_id=session.id)
    async with h.db.sessionmaker() as other:
        await other.get(AgentSession, session.id, with_for_update=True)
        posting = asyncio.create_task(post(h, session.id, "hi"))
        await asyncio.wait_for(gate.reached.wait(), 10)
        [early] = [r for r in h.resources.events.channels if r in h.supervisor.tasks]
        await terminate_waiting_claim(h)
        with pytest.raises(DBAPIError) as failed:
            await asyncio.wait_for(posting, 10)
        assert is_transient(failed.value)
        await other.rollback()
    await asyncio.wait_for(gate.abandoned.wait(), 10)
    await asyncio.wait_for(h.supervisor.wait_settled(early, poll_seconds=0.02), 10)
    assert early not in h.resources.events.channels
    assert await count(h, Run, id=early) == 0
    assert await count(h, Message, session_id=session.id) == messages

    model.script(reply("after the outage"))
    out = await h.settle((await post(h, session.id, "again")).id)
    assert out.text == "after the outage"


async def test_a_turn_posted_while_a_collapse_writes_waits_for_its_claim(
    h: Harness, model: ScriptedModel
) -> None:
    """The collapse after a run charges its summary's usage to the session row in the
    background. A turn posted meanwhile would fail its guard on that write, so its model
    request waits for its claim: the guard fails before any request is sent, the turn
    is claimed the careful way, and every model request made is one the session pays."""
    collapsing = held("Talked at length.", after=1)
    model.responder = summarising(collapsing)
    session = await h.new_session(compaction=COLLAPSING)
    for i in range(3):  # the third run's end starts a collapse of the first turn
        run = await post(h, session.id, f"note {i}: " + "remember this " * 800)
        await h.supervisor.wait_settled(run.id, poll_seconds=0.02)
    await asyncio.wait_for(collapsing.reached.wait(), 10)
    turns = [b for b in model.requests if COLLAPSE_INSTRUCTION not in last_user_text(b)]
    wasted = claims("guard_failed", True)
    async with h.db.sessionmaker() as other:
        await other.get(AgentSession, session.id, with_for_update=True)
        collapsing.release()  # its usage waits for the row
        await wait_for_lock(h.db.engine, "UPDATE agent_sessions%")
        posting = asyncio.create_task(post(h, session.id, "and now?"))
        await wait_for_lock(h.db.engine, CLAIM)  # queued behind the collapse's write
        await other.commit()
    out = await h.settle((await asyncio.wait_for(posting, 10)).id)
    assert out.run.status == RunStatus.COMPLETED
    assert claims("guard_failed", True) == wasted
    after = [b for b in model.requests if COLLAPSE_INSTRUCTION not in last_user_text(b)]
    assert after[: len(turns)] == turns
    assert [last_user_text(b) for b in after[len(turns) :]] == ["and now?"]


async def test_a_turn_after_a_collapse_was_stored_reads_the_row_it_changed(
    h: Harness, model: ScriptedModel
) -> None:
    """Storing a collapse changes the session row (its marks version): the row kept by
    the run before is forgotten, so the next turn is claimed from the row as it is, with
    no model request wasted on a guard that fails."""
    model.responder = summarising()
    session = await h.new_session(compaction=COLLAPSING)
    wasted = claims("guard_failed", True)
    for i in range(5):  # from the third run's end on, each collapses a turn (settled: done)
        out = await h.settle((await post(h, session.id, f"note {i}: " + "remember " * 1600)).id)
        assert out.run.status == RunStatus.COMPLETED
    assert await count(h, Collapse, session_id=session.id) == 3
    assert claims("guard_failed", True) == wasted
    turns = [b for b in model.requests if COLLAPSE_INSTRUCTION not in last_user_text(b)]
    assert len(turns) == 5
