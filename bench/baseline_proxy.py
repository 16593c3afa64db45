"""The baseline of `bench turns`: a bare FastAPI + sse-starlette proxy to the model.

It does the least an honest conversation service must do per turn: load the session's
history from Postgres (the Messages API is stateless, so every turn resends it), store
the user message, stream the model's reply with the official SDK, relay its text
deltas as SSE, and store the assistant message after the stream ends. Two tables of
its own, asyncpg, no compaction, no tools, no event log, no runs. Like any proxy that
cares about cost, it marks the newest message block with a prompt-cache breakpoint
(which also makes the fake model do the same prefix hashing as for Parley's requests).

    python -m bench.baseline_proxy --port P --database-url postgresql://... \\
        --anthropic-base-url http://127.0.0.1:F [--model M]

Routes: `POST /sessions` -> `{"id"}`; `POST /sessions/{id}/messages` with
`{"content": str, "stream": bool}`: SSE (`text.delta` events, then `message.completed`)
or, without `stream`, the stored assistant message as JSON once the reply is complete.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import anthropic
import asyncpg
import uvicorn
from anthropic.types import MessageParam, RawContentBlockDeltaEvent, TextDelta
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent

SCHEMA = """
CREATE TABLE IF NOT EXISTS proxy_sessions (
    id uuid PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS proxy_messages (
    id bigserial PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES proxy_sessions (id) ON DELETE CASCADE,
    role text NOT NULL,
    content jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ix_proxy_messages_session ON proxy_messages (session_id, id);
"""
MAX_TOKENS = 16_000
EPHEMERAL = {"type": "ephemeral"}


@dataclass
class Config:
    database_url: str
    anthropic_base_url: str
    model: str
    api_key: str = "x"
    pool_size: int = 10


class TurnIn(BaseModel):
    content: str
    stream: bool = False


def with_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with a cache breakpoint on the last block (a copy: history unchanged)."""
    last = messages[-1]
    blocks = [*last["content"][:-1], {**last["content"][-1], "cache_control": EPHEMERAL}]
    return [*messages[:-1], {**last, "content": blocks}]


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog", format="text"
    )


async def create_schema(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
    finally:
        await conn.close()


class Proxy:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.pool: asyncpg.Pool | None = None
        self.sdk = anthropic.AsyncAnthropic(
            api_key=config.api_key, base_url=config.anthropic_base_url, max_retries=0
        )

    async def start(self) -> None:
        await create_schema(self.config.database_url)
        self.pool = await asyncpg.create_pool(
            self.config.database_url,
            min_size=1,
            max_size=self.config.pool_size,
            init=_init_connection,
        )

    async def stop(self) -> None:
        await self.sdk.close()
        if self.pool is not None:
            await self.pool.close()

    @property
    def db(self) -> asyncpg.Pool:
        assert self.pool is not None
        return self.pool

    async def new_session(self) -> uuid.UUID:
        session_id = uuid.uuid4()
        await self.db.execute("INSERT INTO proxy_sessions (id) VALUES ($1)", session_id)
        return session_id

    async def begin_turn(self, session_id: uuid.UUID, text: str) -> list[dict[str, Any]]:
        """The request's messages: the stored history plus the user's new message,
        which is stored before the model is called."""
        content = [{"type": "text", "text": text}]
        async with self.db.acquire() as conn, conn.transaction():
            if (
                await conn.fetchval("SELECT 1 FROM proxy_sessions WHERE id = $1", session_id)
                is None
            ):
                raise HTTPException(404, f"session {session_id} not found")
            rows = await conn.fetch(
                "SELECT role, content FROM proxy_messages WHERE session_id = $1 ORDER BY id",
                session_id,
            )
            await conn.execute(
                "INSERT INTO proxy_messages (session_id, role, content) VALUES ($1, 'user', $2)",
                session_id,
                content,
            )
        return [{"role": r["role"], "content": r["content"]} for r in rows] + [
            {"role": "user", "content": content}
        ]

    async def deltas(self, messages: list[dict[str, Any]]) -> AsyncIterator[str]:
        """The text deltas of one streamed reply (the SDK's ordinary streaming call)."""
        stream = await self.sdk.messages.create(
            model=self.config.model,
            max_tokens=MAX_TOKENS,
            messages=cast(list[MessageParam], with_breakpoint(messages)),
            stream=True,
        )
        async for event in stream:
            if isinstance(event, RawContentBlockDeltaEvent) and isinstance(event.delta, TextDelta):
                yield event.delta.text

    async def end_turn(self, session_id: uuid.UUID, text: str) -> dict[str, Any]:
        content = [{"type": "text", "text": text}]
        await self.db.execute(
            "INSERT INTO proxy_messages (session_id, role, content) VALUES ($1, 'assistant', $2)",
            session_id,
            content,
        )
        return {"role": "assistant", "content": content}


def create_app(config: Config) -> FastAPI:
    proxy = Proxy(config)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await proxy.start()
        try:
            yield
        finally:
            await proxy.stop()

    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/sessions", status_code=201)
    async def create_session() -> dict[str, str]:
        return {"id": str(await proxy.new_session())}

    @app.post("/sessions/{session_id}/messages", response_model=None)
    async def post_turn(session_id: uuid.UUID, body: TurnIn) -> Response:
        messages = await proxy.begin_turn(session_id, body.content)
        if not body.stream:
            text = "".join([delta async for delta in proxy.deltas(messages)])
            return JSONResponse(await proxy.end_turn(session_id, text))

        async def events() -> AsyncIterator[ServerSentEvent]:
            parts: list[str] = []
            async for delta in proxy.deltas(messages):
                parts.append(delta)
                yield ServerSentEvent(event="text.delta", data=json.dumps({"text": delta}))
            stored = await proxy.end_turn(session_id, "".join(parts))
            yield ServerSentEvent(event="message.completed", data=json.dumps(stored))

        return EventSourceResponse(events())

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline_proxy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True, help="postgresql://...")
    parser.add_argument("--anthropic-base-url", required=True)
    parser.add_argument("--model", default="claude-sonnet-5-5")
    args = parser.parse_args(argv)
    config = Config(args.database_url, args.anthropic_base_url, args.model)
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
