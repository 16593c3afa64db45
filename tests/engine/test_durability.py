"""Runs that outlive their process, below HTTP: two harnesses on one database stand for
two processes. A shutdown hands a run over and the other resumes it from what is stored;
a process whose epoch was superseded writes nothing more; a workspace tool whose result
was recorded with its effect does not run again on resume; the LISTEN connection comes
back after the database cut it; a draining process takes no new turn."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid

import pytest
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from app.conversation import store
from app.db import Database
from app.domain import RunStatus, ToolResult
from app.engine import runs
from app.engine.events import NOTIFY_CHANNEL, EventHub
from app.engine.loop import DISCARDED_ON_RESUME
from app.errors import Unavailable
from app.models import Run
from tests.engine.conftest import Harness, MakeHarness
from tests.engine.scripted import Gate, ScriptedModel, held, reply, tool_use
from tests.statements import recorded


async def reached(gate: Gate) -> None:
    await asyncio.wait_for(gate.reached.wait(), timeout=5)


def strictly_increasing(seqs: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(seqs))


async def test_shutdown_hands_the_run_over_and_another_process_resumes_it(
    make_harness: MakeHarness,
) -> None:
    first = make_harness(ScriptedModel(), shutdown_grace_seconds=0)
    gate = held(reply("Looking.", tool_use("Glob", {"pattern": "*"}, id="toolu_open")), after=-1)
    first.model.script(gate)
    session = await first.new_session(builtin_tools=["Glob"])
    run = await first.start(session.id, "go")
    await reached(gate)
    await first.supervisor.shutdown()

    released = await first.run(run.id)
    assert released.status == RunStatus.RUNNING
    assert released.worker_id is None
    assert released.lease_expires_at <= runs.now()
    streaming = released.streaming_uuid
    before = await first.events(run.id)
    assert before[-1].seq == released.reserved_seq  # every id taken was stored

    second = make_harness(ScriptedModel())
    second.model.script(reply("Found nothing.", tool_use("Glob", {"pattern": "*"})), "Done.")
    handovers = metrics.run_takeovers.labels("handover")
    counted = handovers._value.get()
    assert await second.supervisor.take_over(run.id)
    assert handovers._value.get() == counted + 1
    out = await second.settle(run.id)

    assert out.run.status == RunStatus.COMPLETED
    assert out.run.takeovers == 1
    assert out.run.epoch == released.epoch + 1
    assert out.events[: len(before)] == before
    after = out.events[len(before) :]
    assert after[0].name == "message.discarded"
    assert after[0].data == {"uuid": str(streaming), "reason": DISCARDED_ON_RESUME}
    assert after[0].seq == before[-1].seq + 1
    assert strictly_increasing([e.seq for e in out.events])
    assert out.names[-1] == "run.completed"
    # The cut-off reply was made again, not kept half.
    chain = await second.chain(session.id)
    assert all(m.subtype != "interrupted" for m in chain)
    assert chain[-1].content == [{"type": "text", "text": "Done."}]
    await second.next_request(session.id)


async def test_a_superseded_owner_writes_nothing(make_harness: MakeHarness) -> None:
    h = make_harness(ScriptedModel())
    gate = held(reply("this reply is never stored by its first owner"), after=3)
    h.model.script(gate)
    session = await h.new_session()
    run = await h.start(session.id, "go")
    await reached(gate)
    # Another process takes the run over (a new epoch) while this one still streams.
    async with h.db.transaction() as db:
        await db.execute(update(Run).where(Run.id == run.id).values(epoch=Run.epoch + 1))
    stored = await h.events(run.id)
    messages = len(await h.chain(session.id))
    gate.release()
    task = h.launched[run.id]
    await asyncio.wait_for(task, timeout=10)

    assert (await h.run(run.id)).status == RunStatus.RUNNING  # left to its new owner
    assert len(await h.chain(session.id)) == messages
    after = await h.events(run.id)
    assert [e.seq for e in after] == [e.seq for e in stored]
    await h.abandon(run.id)


async def test_a_recorded_workspace_tool_is_not_applied_again_on_resume(
    make_harness: MakeHarness,
) -> None:
    first = make_harness(ScriptedModel(), shutdown_grace_seconds=0)
    write = tool_use("Write", {"file_path": "a.txt", "content": "new"}, id="toolu_w")
    read = tool_use("Read", {"file_path": "a.txt"}, id="toolu_r")
    gate = held("never finished", after=1)
    first.model.script(reply(write, read), gate)
    session = await first.new_session(builtin_tools=["Read", "Write"])
    run = await first.start(session.id, "go")
    await reached(gate)  # the tools ran, their results are stored; the next call hangs
    await first.supervisor.shutdown()

    # Rewind to the moment after the write committed with its record, before the result
    # message: what a crash between the two would have left.
    chain = await first.chain(session.id)
    tool_reply, results = chain[-2], chain[-1]
    assert results.role == "user"
    recorded = (await first.run(run.id)).state
    async with first.db.transaction() as db:
        await store.set_head(db, session.id, tool_reply.uuid)
        state = recorded.model_copy(
            update={"results": {"toolu_w": ToolResult(content="recorded", is_error=False)}}
        )
        await db.execute(
            update(Run).where(Run.id == run.id).values(state=state, streaming_uuid=None)
        )
    await first.put_file(session.id, "a.txt", "changed since")

    second = make_harness(ScriptedModel())
    second.model.script("All done.")
    assert await second.supervisor.take_over(run.id)
    out = await second.settle(run.id)
    assert out.run.status == RunStatus.COMPLETED
    assert await second.file(session.id, "a.txt") == b"changed since"  # Write not re-run
    new_results = (await second.chain(session.id))[-2]
    by_id = {b["tool_use_id"]: b for b in new_results.content}
    assert by_id["toolu_w"]["content"] == "recorded"
    assert "changed since" in str(by_id["toolu_r"]["content"])  # Read ran again


async def test_the_listen_connection_comes_back_after_it_is_cut(engine: AsyncEngine) -> None:
    """When the database drops the LISTEN connection (a restart), the hub listens again
    and followers hear of other processes' events again."""
    hub = EventHub(Database(engine), 0.01)
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    await hub.start_listener(dsn)
    try:
        first = hub._listener.get_server_pid()
        async with engine.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
            await conn.commit()

        for _ in range(200):  # up to 10 s
            if hub._listener is not None and hub._listener.get_server_pid() != first:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the hub did not listen again")
        run_id = uuid.uuid4()
        woken = asyncio.Event()
        hub._wakeups[run_id] = {woken}
        async with engine.connect() as conn:
            await conn.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": NOTIFY_CHANNEL, "payload": f"{run_id}:1"},
            )
            await conn.commit()
        await asyncio.wait_for(woken.wait(), timeout=10)
    finally:
        await hub.stop()


async def test_a_draining_process_takes_no_turn(make_harness: MakeHarness) -> None:
    """After SIGTERM a process stores no new turn (503): the client posts to another."""
    h = make_harness(ScriptedModel())
    session = await h.new_session()
    h.supervisor.shutting_down.set()
    with pytest.raises(Unavailable):
        await h.start(session.id, "go")
    assert await h.chain(session.id) == []
    assert await h.active_run(session.id) is None


async def test_one_flush_stores_the_deltas_of_every_run_each_fenced(h: Harness) -> None:
    """A flush window stores the deltas of all of a process's runs in one statement; a
    run another process took over meanwhile (a new epoch) stores nothing and is lost."""
    hub = EventHub(h.db, flush_seconds=3600)  # flushed by hand below
    claimed = []
    for name in ("a", "b", "c"):
        session = await h.new_session()
        run, _ = await h.claim(session.id, name)
        hub.open(run.id, max(run.last_event_seq, run.reserved_seq), run.epoch)
        await hub.reserve(run.id)
        for i in range(3):
            hub.emit_nowait(run.id, "text.delta", {"text": f"{name}{i}"})
        claimed.append(run)
    taken = claimed[1]
    async with h.db.transaction() as db:
        await db.execute(update(Run).where(Run.id == taken.id).values(epoch=Run.epoch + 1))

    with recorded(h.db) as statements:
        await hub._flush_batch()
    if not h.db.is_sqlite:
        assert len(statements) == 1
    for name, run in zip("abc", claimed, strict=True):
        stored = [e for e in await hub.stored(run.id, 0) if e.event == "text.delta"]
        channel = hub.channels[run.id]
        if run is taken:
            assert stored == []
            assert channel.lost
        else:
            assert [json.loads(e.data)["text"] for e in stored] == [f"{name}{i}" for i in range(3)]
            assert channel.unwritten == []
            assert (await h.run(run.id)).last_event_seq == stored[-1].seq
    for run in claimed:
        channel = hub.channels.pop(run.id)
        channel.lost = True
    await h.abandon(*(run.id for run in claimed))
