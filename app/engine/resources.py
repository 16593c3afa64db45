"""What runs share within one process: settings, the database, the event hub, the model
client, the view cache and the compaction hooks. Built once by `Runtime`; the loop,
compaction and the supervisor receive it rather than reaching for globals."""

from __future__ import annotations

import os
import socket
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from app.config import Settings
from app.conversation.session_rows import SessionRows
from app.conversation.views import ChainCache
from app.db import Database, make_engine
from app.engine.events import EventHub
from app.engine.hooks import CompactionHooks, WebhookHook
from app.engine.llm.client import ModelClient
from app.engine.llm.provider import make_model_client
from app.engine.llm.retrying import RetryPolicy


class CompactionSkips:
    """Sessions whose automatic compaction was refused because it would not have made
    the request smaller enough, with the figure it is tried again at (the estimate then,
    grown by the minimum saving): the next turns skip it instead of paying for the same
    refusal each time. Per process and bounded: a restart or another replica tries once
    more."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._retry_at: OrderedDict[uuid.UUID, int] = OrderedDict()

    def retry_at(self, session_id: uuid.UUID) -> int | None:
        return self._retry_at.get(session_id)

    def skip(self, session_id: uuid.UUID, retry_at: int) -> None:
        self._retry_at.pop(session_id, None)
        self._retry_at[session_id] = retry_at
        while len(self._retry_at) > self.limit:
            self._retry_at.popitem(last=False)

    def clear(self, session_id: uuid.UUID) -> None:
        self._retry_at.pop(session_id, None)


@dataclass
class Resources:
    settings: Settings
    db: Database
    events: EventHub
    llm: ModelClient
    views: ChainCache
    retry: RetryPolicy
    hooks: list[CompactionHooks] = field(default_factory=list)
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    compaction_skips: CompactionSkips = field(default_factory=CompactionSkips)
    session_rows: SessionRows = field(default_factory=SessionRows)
    # Tenants last seen with webhook endpoints: a run's end goes in a transaction with
    # their deliveries at once (`finishing.NeedsOutbox` corrects a stale guess).
    webhook_tenants: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, settings: Settings) -> Resources:
        db = Database(make_engine(settings))
        hooks: list[CompactionHooks] = []
        if settings.compaction_webhook_url:
            hooks.append(WebhookHook(settings.compaction_webhook_url))
        return cls(
            settings=settings,
            db=db,
            events=EventHub(db, settings.event_flush_seconds),
            llm=make_model_client(settings),
            views=ChainCache(settings.view_cache_bytes),
            retry=RetryPolicy.of(settings),
            hooks=hooks,
        )
