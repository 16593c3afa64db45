"""What runs share within one process: settings, the database, the event hub, the model
client, the view cache and the compaction hooks. Built once by `Runtime`; the loop,
compaction and the supervisor receive it rather than reaching for globals."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from app.config import Settings
from app.conversation.views import ChainCache
from app.db import Database, make_engine
from app.engine.events import EventHub
from app.engine.hooks import CompactionHooks, WebhookHook
from app.engine.llm.client import ModelClient
from app.engine.llm.provider import make_model_client
from app.engine.llm.retrying import RetryPolicy


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
            views=ChainCache(settings.view_cache_messages),
            retry=RetryPolicy.of(settings),
            hooks=hooks,
        )
