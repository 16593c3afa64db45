"""Fixtures for engine tests: the turn loop and compaction on the test database with a
scripted model, no HTTP and no server.

`Resources` are built as `Runtime` builds them, except that the model is a
`ScriptedModel` and the database is the run's test database (its shared engine). These
tests commit for real, each on its own sessions (a new agent session per test).

A `Harness` claims turns as admission does and runs them either in the test's own task
(`turn`: `runs.claim` then `loop.execute`) or as the service does (`start`: `Admission`
stores and claims, the `Supervisor` launches after the commit; `settle` waits).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
from sqlalchemy import Table, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.context.normalize import validate_api_messages
from app.conversation import context_report, sessions, store
from app.conversation.files import DbWorkspace
from app.conversation.records import MessageRecord
from app.conversation.views import ChainCache, ChainView, load_view
from app.db import Base, Database
from app.domain import IfBusy, RunKind, RunParams, RunState, RunStatus
from app.engine import runs
from app.engine.admission import Admission
from app.engine.compaction.collapse import COLLAPSE_INSTRUCTION
from app.engine.events import EventHub
from app.engine.llm.retrying import RetryPolicy
from app.engine.loop import TurnRunner, execute
from app.engine.resources import Resources
from app.engine.supervisor import Supervisor
from app.models import AgentSession, Run
from app.schemas import SessionCreate, ToolResultIn, ToolResultsIn
from tests.conftest import make_settings
from tests.engine.scripted import Item, Responder, ScriptedModel, last_user_text, reply

TENANT = "tenant-a"

# Compaction settings under which long turns ("remember this " * 800: some 2,800 tokens)
# are collapsed: from the third run's end on, each run's collapse summarises a turn.
COLLAPSING = {"threshold_tokens": 40_000, "collapse_at": 0.25, "micro": False}


def summarising(*first: Item) -> Responder:
    """Collapse requests get `first` (in order), then a short summary; turns, "noted"."""
    queue = list(first)

    def respond(body: dict[str, Any]) -> Item:
        if COLLAPSE_INSTRUCTION in last_user_text(body):
            return queue.pop(0) if queue else reply("Talked some more.")
        return reply("noted")

    return respond


@dataclass(frozen=True)
class Event:
    """A stored run event, its data parsed."""

    seq: int
    name: str
    data: Any


@dataclass
class Outcome:
    """A settled run, the messages it stored and its stored events."""

    run: Run
    messages: list[MessageRecord]
    events: list[Event]

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.events]

    def of(self, name: str) -> list[Any]:
        return [e.data for e in self.events if e.name == name]

    @property
    def text(self) -> str:
        return "".join(d["text"] for d in self.of("text.delta"))


def assert_gap_free(events: list[Event], start: int = 1) -> None:
    assert [e.seq for e in events] == list(range(start, start + len(events)))


class Harness:
    def __init__(self, resources: Resources, model: ScriptedModel) -> None:
        self.resources = resources
        self.model = model
        self.supervisor = Supervisor(resources)
        self.admission = Admission(resources, self.supervisor)
        self.cancel_reasons: dict[uuid.UUID, str] = {}
        self.claims: dict[uuid.UUID, runs.Claimed] = {}  # what `claim` stored, by run
        # The task the supervisor last launched for each run, to wait for what it does
        # after the run settles (start a queued turn, schedule context collapse).
        self.launched: dict[uuid.UUID, asyncio.Task[None]] = {}
        launch = self.supervisor.launch

        def launching(
            run: Run,
            session: AgentSession | None = None,
            claimed: runs.Claimed | None = None,
            *,
            pending: bool = False,
        ) -> None:
            launch(run, session, claimed, pending=pending)
            task = self.supervisor.tasks.get(run.id)
            if task is not None:
                self.launched[run.id] = task

        self.supervisor.launch = launching  # type: ignore[method-assign]

    @property
    def settings(self) -> Settings:
        return self.resources.settings

    @property
    def db(self) -> Database:
        return self.resources.db

    async def close(self) -> None:
        await self.supervisor.shutdown()
        await self.resources.events.stop()

    # --- sessions ----------------------------------------------------------------------

    async def new_session(self, **fields: Any) -> AgentSession:
        async with self.db.transaction() as db:
            return await sessions.create(db, TENANT, SessionCreate(**fields), self.settings)

    async def session(self, session_id: uuid.UUID) -> AgentSession:
        async with self.db.sessionmaker() as db:
            session = await db.get(AgentSession, session_id)
        assert session is not None
        return session

    async def put_file(self, session_id: uuid.UUID, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        async with self.db.transaction() as db:
            await DbWorkspace(db, session_id).put(path, data)

    async def file(self, session_id: uuid.UUID, path: str) -> bytes | None:
        async with self.db.sessionmaker() as db:
            return await DbWorkspace(db, session_id).read(path)

    async def files(self, session_id: uuid.UUID) -> list[str]:
        async with self.db.sessionmaker() as db:
            return await DbWorkspace(db, session_id).list_paths()

    # --- running turns -------------------------------------------------------------------

    async def claim(
        self,
        session_id: uuid.UUID,
        content: str | list[dict[str, Any]] | None = None,
        *,
        kind: RunKind = RunKind.TURN,
        instructions: str | None = None,
    ) -> tuple[Run, AgentSession]:
        """Store the turn and claim the session, as admission does (no launch)."""
        async with self.db.transaction() as db:
            session = await db.get(AgentSession, session_id)
            assert session is not None
            run = Run(
                id=uuid.uuid4(),
                session_id=session_id,
                kind=kind,
                status=RunStatus.QUEUED,
                params=RunParams(content=content, instructions=instructions),
                usage={},
                state=RunState(),
                last_event_seq=0,
                created_at=runs.now(),
            )
            self.claims[run.id] = await runs.claim(
                db,
                session,
                run,
                worker_id=self.resources.worker_id,
                lease_seconds=self.settings.run_lease_seconds,
            )
        return run, session

    async def execute(self, run: Run, session: AgentSession | None = None) -> TurnRunner | None:
        claimed = self.claims.pop(run.id, None) if session is not None else None
        return await execute(self.resources, run.id, self.cancel_reasons.get, run, session, claimed)

    async def turn(
        self, session_id: uuid.UUID, content: str | list[dict[str, Any]] = "hi"
    ) -> Outcome:
        """Claim a turn and run it in this task to its end (or its pause)."""
        run, session = await self.claim(session_id, content)
        await self.execute(run, session)
        return await self.outcome(run.id)

    async def start(
        self,
        session_id: uuid.UUID,
        content: str | list[dict[str, Any]] = "hi",
        *,
        if_busy: IfBusy = IfBusy.REJECT,
    ) -> Run:
        """Post a turn through admission: the supervisor launches it after the commit."""
        async with self.db.transaction() as db:
            session = await db.get(AgentSession, session_id)
            assert session is not None
            return await self.admission.submit(
                db, session, RunParams(content=content), if_busy=if_busy
            )

    async def compact(self, session_id: uuid.UUID, instructions: str | None = None) -> Outcome:
        async with self.db.transaction() as db:
            session = await db.get(AgentSession, session_id)
            assert session is not None
            run = await self.admission.compact(db, session, instructions)
        return await self.settle(run.id)

    async def settle(self, run_id: uuid.UUID) -> Outcome:
        """Wait until the run is finished or paused, and the supervisor is done with it."""
        await self.supervisor.wait_settled(run_id, poll_seconds=0.02)
        task = self.launched.get(run_id)
        if task is not None:
            await task
        await asyncio.gather(*list(self.supervisor._background), return_exceptions=True)
        return await self.outcome(run_id)

    async def submit_tool_results(
        self, run_id: uuid.UUID, results: list[dict[str, Any]]
    ) -> Outcome:
        body = ToolResultsIn(results=[ToolResultIn(**r) for r in results])
        async with self.db.transaction() as db:
            run = await db.get(Run, run_id)
            assert run is not None
            session = await db.get(AgentSession, run.session_id)
            assert session is not None
            await self.admission.submit_tool_results(db, session, run, body)
        return await self.settle(run_id)

    async def cancel(self, run_id: uuid.UUID) -> Run:
        async with self.db.transaction() as db:
            run = await db.get(Run, run_id)
            assert run is not None
            session = await db.get(AgentSession, run.session_id)
            assert session is not None
            return await self.admission.cancel(db, session, run)

    # --- reading back ----------------------------------------------------------------------

    async def run(self, run_id: uuid.UUID) -> Run:
        async with self.db.sessionmaker() as db:
            run = await db.get(Run, run_id)
        assert run is not None
        return run

    async def events(self, run_id: uuid.UUID, after: int = 0) -> list[Event]:
        stored = await self.resources.events.stored(run_id, after)
        return [Event(e.seq, e.event, json.loads(e.data)) for e in stored]

    async def outcome(self, run_id: uuid.UUID) -> Outcome:
        async with self.db.sessionmaker() as db:
            run, records = await runs.outcome(db, run_id)
        return Outcome(run, records, await self.events(run_id))

    async def chain(self, session_id: uuid.UUID, *, full: bool = True) -> list[MessageRecord]:
        """The session's messages from its head up (across boundaries when `full`)."""
        async with self.db.sessionmaker() as db:
            session = await db.get(AgentSession, session_id)
            assert session is not None
            return await store.chain(db, session.head_uuid, full=full)

    async def message(self, session_id: uuid.UUID, message_uuid: Any) -> MessageRecord:
        async with self.db.sessionmaker() as db:
            record = await store.get_message(db, session_id, message_uuid)
        assert record is not None
        return record

    async def view(self, session_id: uuid.UUID) -> ChainView:
        session = await self.session(session_id)
        config = sessions.config_of(session, self.settings)
        async with self.db.sessionmaker() as db:
            return await load_view(
                db, ChainCache(0), session_id, session.head_uuid, config.compactable
            )

    async def next_request(self, session_id: uuid.UUID) -> dict[str, Any]:
        """The next request as it would be sent now, checked against the API's rules."""
        session = await self.session(session_id)
        async with self.db.sessionmaker() as db:
            body = await context_report.next_request(db, session, self.settings, ChainCache(0))
        assert validate_api_messages(body["messages"]) == [], body["messages"]
        return body

    async def abandon(self, *run_ids: uuid.UUID) -> None:
        """End runs a test left running that nothing here executes: a reaper in a
        later test would take them over and run them against that test's model."""
        async with self.db.transaction() as db:
            await db.execute(
                update(Run)
                .where(Run.id.in_(run_ids))
                .values(status=RunStatus.FAILED, lease_expires_at=None)
            )

    async def active_run(self, session_id: uuid.UUID) -> Run | None:
        async with self.db.sessionmaker() as db:
            return await runs.active(db, session_id)

    async def xmin(self, model: type[Base], **key: Any) -> str:
        """The id of the transaction that last wrote a row (Postgres `xmin`)."""
        table = cast(Table, model.__table__)
        query = (
            select(literal_column("xmin::text"))
            .select_from(table)
            .where(*(table.c[name] == value for name, value in key.items()))
        )
        async with self.db.sessionmaker() as db:
            value = await db.scalar(query)
        assert value is not None, (model, key)
        return str(value)


def build_resources(engine: AsyncEngine, settings: Settings, model: ScriptedModel) -> Resources:
    db = Database(engine)
    return Resources(
        settings=settings,
        db=db,
        events=EventHub(db, settings.event_flush_seconds),
        llm=model,
        views=ChainCache(settings.view_cache_bytes),
        retry=RetryPolicy.of(settings),
        worker_id=f"engine-test:{uuid.uuid4().hex[:8]}",
    )


MakeHarness = Callable[..., Harness]
# Fast retries; and a run still executing at the end of a test is stopped at once.
HARNESS_SETTINGS = {"retry_base_seconds": 0.001, "shutdown_grace_seconds": 0}


@pytest.fixture
async def make_harness(database_url: str, engine: AsyncEngine) -> AsyncIterator[MakeHarness]:
    """`make_harness(model, **settings_overrides)`: a harness on the test database."""
    made: list[Harness] = []

    def make(model: ScriptedModel | None = None, **overrides: Any) -> Harness:
        model = model or ScriptedModel()
        settings = make_settings(database_url, **{**HARNESS_SETTINGS, **overrides})
        harness = Harness(build_resources(engine, settings, model), model)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.close()
    for harness in made:
        assert harness.model.rejected == [], harness.model.rejected
        assert harness.model.unscripted == [], "a request found no scripted reply"


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
def h(make_harness: MakeHarness, model: ScriptedModel) -> Harness:
    return make_harness(model)
