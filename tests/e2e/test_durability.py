"""End to end, with faults as they happen: the owner of streaming runs is killed (-9) or
stopped (SIGTERM) and another process resumes its runs; the database goes away across a
step; a cancel is posted to a replica that does not run the turn.

What a client may rely on (docs/api.md): ids only grow and are never given to two events,
a stream ends with the terminal event, every message whose deltas it showed is either
completed or discarded, and what a follower reads equals the stored log."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import fresh_database
from tests.e2e.processes import Fake, Service
from tests.fake_anthropic import items
from tests.pg_cluster import Cluster
from tests.runs.helpers import Event, names, stream

pytestmark = pytest.mark.e2e

SEED = 20261201
KILLED_RUNS = 20  # streaming (most of them) when their owner is killed at a seeded point
HANDED_OVER_RUNS = 10  # per round, two rounds
REPLICA_ENV = {
    "PARLEY_RUN_LEASE_SECONDS": "2",
    "PARLEY_REAPER_INTERVAL_SECONDS": "0.3",
    "PARLEY_SHUTDOWN_GRACE_SECONDS": "0.2",
}


class Replicas:
    """Service processes on the test database, shared by this module's tests (starting
    one is slow): a test takes two live ones; those it stopped are replaced next time."""

    def __init__(self, database_url: str, fake: Fake) -> None:
        self.database_url = database_url
        self.fake = fake
        self.all: list[Service] = []

    def two(self) -> tuple[Service, Service]:
        alive = [s for s in self.all if s.proc.poll() is None]
        while len(alive) < 2:
            alive.append(Service(self.database_url, self.fake.url, **REPLICA_ENV))
            self.all.append(alive[-1])
        return alive[0], alive[1]

    def stop(self) -> None:
        for service in self.all:
            service.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def replicas(fake_process: Fake) -> Iterator[Replicas]:
    # A database of their own: the replicas resume any ownerless run they find, and runs
    # other tests left behind must stay out of their way (and out of the fake's script).
    with fresh_database() as url:
        pool = Replicas(url, fake_process)
        yield pool
        pool.stop()


@pytest.fixture
def slow_stream(fake_process: Fake) -> Iterator[None]:
    fake_process.control("POST", "reset")
    fake_process.control("POST", "config", {"chunk_delay": 0.04, "text_chunk_chars": 2})
    yield
    fake_process.control("POST", "config", {"chunk_delay": 0, "text_chunk_chars": 16})


async def follow(
    client: httpx.AsyncClient, sid: str, run_id: str, last: str | None = None
) -> list[Event]:
    headers = {"Last-Event-ID": last} if last else {}
    return await stream(client, "GET", f"/sessions/{sid}/runs/{run_id}/events", headers=headers)


async def follow_until_cut(
    client: httpx.AsyncClient, sid: str, run_id: str, seen: list[Event] | None = None
) -> list[Event]:
    """Follow a run, adding to `seen` as events arrive, until its stream ends or is cut
    (by a crash, or by the server telling us to reconnect)."""
    seen = [] if seen is None else seen
    with contextlib.suppress(httpx.HTTPError):
        async with client.stream("GET", f"/sessions/{sid}/runs/{run_id}/events") as response:
            event: dict[str, str] = {}
            async for line in response.aiter_lines():
                if not line:
                    if "event" in event:
                        seen.append(Event(event.get("id", ""), event["event"], event["data"]))
                    event = {}
                elif not line.startswith(":"):
                    key, _, value = line.partition(": ")
                    event[key] = value
    return seen


async def until_deltas(seen: list[Event], count: int) -> None:
    for _ in range(600):  # up to 30 s
        if sum(e.event == "text.delta" for e in seen) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the reply did not stream")


def check_client_view(seen: list[Event], terminal: str) -> None:
    """What one client saw, across reconnects: ids grow and none repeats, the stream ends
    with the terminal event, every message it saw deltas of was completed or discarded."""
    ids = [int(e.id) for e in seen]
    assert ids == sorted(set(ids)), ids
    assert names(seen)[-1] == terminal
    streamed = {e.json["message_uuid"] for e in seen if e.event == "text.delta"}
    settled = {
        e.json["uuid"] for e in seen if e.event in ("message.completed", "message.discarded")
    }
    assert streamed <= settled


def final_text(events: list[Event]) -> str:
    """The text of the last assistant message completed in the log."""
    done = [e.json for e in events if e.event == "message.completed"]
    reply = next(m for m in reversed(done) if m["role"] == "assistant")
    return "".join(b["text"] for b in reply["content"] if b["type"] == "text")


async def post_runs(
    client: httpx.AsyncClient, prompts: list[str], rng: random.Random
) -> list[tuple[str, str]]:
    """Post the turns at once, each after a seeded pause (so a fault lands at a different
    point of each); their (session, run) ids."""

    async def post(prompt: str, pause: float) -> tuple[str, str]:
        await asyncio.sleep(pause)
        sid = (await client.post("/sessions", json={})).json()["id"]
        posted = await client.post(
            f"/sessions/{sid}/messages", json={"content": prompt, "background": True}
        )
        assert posted.status_code == 202, posted.text
        return sid, posted.json()["id"]

    pauses = [rng.uniform(0, 0.4) for _ in prompts]
    return list(await asyncio.gather(*(post(p, d) for p, d in zip(prompts, pauses, strict=True))))


async def check_resumed(
    survivor: httpx.AsyncClient, runs: list[tuple[str, str]], prompts: list[str], followed: Any
) -> None:
    for (sid, run_id), prompt, seen in zip(runs, prompts, followed, strict=True):
        check_client_view(seen, "run.completed")
        stored = await follow(survivor, sid, run_id)
        # The follower on the survivor read exactly the stored log.
        assert [(e.id, e.event, e.data) for e in seen] == [(e.id, e.event, e.data) for e in stored]
        assert final_text(stored) == f"Fake reply to: {prompt[:80]}"
        run = (await survivor.get(f"/sessions/{sid}/runs/{run_id}")).json()
        assert run["status"] == "completed"


async def test_kill_9_of_the_owner_resumes_every_run(replicas: Replicas, slow_stream: None) -> None:
    rng = random.Random(SEED)
    owner, survivor = replicas.two()
    prompts = [f"run {i} " + "words " * rng.randint(3, 10) for i in range(KILLED_RUNS)]
    async with owner.client() as o, survivor.client() as s:
        runs = await post_runs(o, prompts, rng)
        followers = [asyncio.create_task(follow(s, sid, rid)) for sid, rid in runs]
        # One client follows on the owner: cut by the crash, it reconnects to the
        # survivor with the last id it saw.
        cut = asyncio.create_task(follow_until_cut(o, *runs[-1]))
        await asyncio.sleep(rng.uniform(0.1, 0.5))
        owner.signal(signal.SIGKILL)
        owner.wait()
        followed = await asyncio.wait_for(asyncio.gather(*followers), timeout=60)
        seen = await asyncio.wait_for(cut, timeout=10)
        rest = await follow(s, *runs[-1], last=seen[-1].id if seen else None)
        check_client_view(seen + rest, "run.completed")
        await check_resumed(s, runs, prompts, followed)
        # The kill cut most replies mid-stream (resumed, they withdrew and made them again).
        cut_off = sum("message.discarded" in names(events) for events in followed)
        assert cut_off >= len(runs) // 2


async def test_sigterm_hands_runs_over_to_the_other_replica(
    replicas: Replicas, slow_stream: None
) -> None:
    """A rolling restart: each replica in turn gets SIGTERM while it streams turns; the
    other resumes them at once and every turn completes."""
    rng = random.Random(SEED + 1)
    for round_ in range(2):
        leaving, staying = replicas.two()  # the one stopped before is replaced
        prompts = [f"deploy {round_} turn {i} " + "words " * 12 for i in range(HANDED_OVER_RUNS)]
        async with leaving.client() as o, staying.client() as s:
            runs = await post_runs(o, prompts, rng)
            followers = [asyncio.create_task(follow(s, sid, rid)) for sid, rid in runs]
            told = asyncio.create_task(follow_until_cut(o, *runs[-1]))
            await asyncio.sleep(0.3)
            leaving.signal(signal.SIGTERM)
            followed = await asyncio.wait_for(asyncio.gather(*followers), timeout=60)
            seen = await asyncio.wait_for(told, timeout=30)
            leaving.wait()
            # A follower on the leaving replica is told to reconnect (no id), and does.
            assert seen[-1].event == "error"
            assert seen[-1].json["type"] == "unavailable"
            kept = [e for e in seen if e.id]
            rest = await follow(s, *runs[-1], last=kept[-1].id if kept else None)
            check_client_view(kept + rest, "run.completed")
            await check_resumed(s, runs, prompts, followed)
            # Handed over mid-reply (most of them): the reply was made again.
            cut_off = sum("message.discarded" in names(events) for events in followed)
            assert cut_off >= len(runs) // 2


async def test_database_outage_across_a_step_keeps_the_reply(fake_process: Fake) -> None:
    fake_process.control("POST", "reset")
    fake_process.control("POST", "config", {"chunk_delay": 0.05, "text_chunk_chars": 3})
    server = None
    try:
        with Cluster() as cluster:
            server = Service(cluster.url, fake_process.url)
            reply = "a reply that is streamed while the database is away, and is kept " * 2
            fake_process.script(items.message(reply))
            async with server.client() as c:
                sid = (await c.post("/sessions", json={})).json()["id"]
                run = (
                    await c.post(
                        f"/sessions/{sid}/messages", json={"content": "x", "background": True}
                    )
                ).json()
                seen: list[Event] = []
                follower = asyncio.create_task(follow_until_cut(c, sid, run["id"], seen))
                await until_deltas(seen, 3)  # the reply is streaming
                # A fast shutdown: sessions are cut mid-use. (Not kill -9: the test cluster
                # runs with synchronous_commit off, so a crash may lose acknowledged commits.)
                cluster.stop()
                await asyncio.sleep(3)  # the reply ends (in ~2 s); storing it is retried
                cluster.start()
                await asyncio.wait_for(follower, timeout=60)
                check_client_view(seen, "run.completed")
                assert final_text(seen) == reply
                stored = await follow(c, sid, run["id"])
                assert [(e.id, e.data) for e in stored] == [(e.id, e.data) for e in seen]
                messages = (await c.get(f"/sessions/{sid}/messages")).json()["data"]
                assert [m["role"] for m in messages] == ["user", "assistant"]
    finally:
        fake_process.control("POST", "config", {"chunk_delay": 0, "text_chunk_chars": 16})
        if server is not None:
            server.stop(signal.SIGKILL)


async def test_cancel_posted_to_another_replica_stops_the_owner(
    replicas: Replicas, fake_process: Fake
) -> None:
    fake_process.control("POST", "reset")
    fake_process.control("POST", "config", {"chunk_delay": 0.05, "text_chunk_chars": 2})
    owner, other = replicas.two()
    try:
        fake_process.script(items.message("a slow reply that another replica cancels " * 3))
        async with owner.client() as o, other.client() as b:
            sid = (await o.post("/sessions", json={})).json()["id"]
            run = (
                await o.post(f"/sessions/{sid}/messages", json={"content": "x", "background": True})
            ).json()
            on_owner = asyncio.create_task(follow(o, sid, run["id"]))
            on_other = asyncio.create_task(follow(b, sid, run["id"]))
            await stream(b, "GET", f"/sessions/{sid}/runs/{run['id']}/events", limit=6)
            cancelled = await b.post(f"/sessions/{sid}/runs/{run['id']}/cancel")
            assert cancelled.json()["status"] == "cancelled"
            for seen in await asyncio.wait_for(asyncio.gather(on_owner, on_other), timeout=30):
                check_client_view(seen, "run.cancelled")
            seen = on_owner.result()
            shown = "".join(e.json["text"] for e in seen if e.event == "text.delta")
            messages = (await b.get(f"/sessions/{sid}/messages")).json()["data"]
            partial = messages[-1]
            assert partial["role"] == "assistant"
            assert partial["subtype"] == "interrupted"
            assert partial["content"][0]["text"] == shown  # every delta shown was kept
            assert 0 < len(shown) < len("a slow reply that another replica cancels " * 3)
    finally:
        fake_process.control("POST", "config", {"chunk_delay": 0, "text_chunk_chars": 16})
