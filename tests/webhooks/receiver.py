"""A webhook receiver for tests: a real HTTP server on a free port that verifies each
delivery with the `standardwebhooks` package, as a tenant's service would."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import free_port


@dataclass
class Received:
    msg_id: str
    path: str
    body: dict[str, Any]


@dataclass
class Receiver:
    """Verifies with the secret `secrets[path]`; answers 200 or 401 (a bad signature)."""

    port: int = field(default_factory=free_port)
    secrets: dict[str, str] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    arrivals: list[str] = field(default_factory=list)  # webhook-id of every request
    # While set, the first request is held unanswered until `release` is set.
    hold_first: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)
    answer: Callable[[Received], int] = lambda _: 200
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    async def _handle(self, request: Request) -> Response:
        path = request.path_params["path"]
        raw = await request.body()
        try:
            body = Webhook(self.secrets[path]).verify(raw, dict(request.headers))
        except Exception as exc:
            self.rejected.append(f"{path}: {exc}")
            return Response(status_code=401)
        item = Received(request.headers["webhook-id"], path, body)
        self.arrivals.append(item.msg_id)
        if self.hold_first and len(self.arrivals) == 1:
            await self.release.wait()
            return Response(status_code=503)
        status = self.answer(item)
        if status < 300:
            self.received.append(item)
        return Response(status_code=status)

    async def start(self) -> None:
        app = Starlette(routes=[Route("/{path}", self._handle, methods=["POST"])])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.release.set()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout=10)

    def events(self, path: str | None = None) -> list[tuple[str, str]]:
        """(run id, type) of each accepted delivery."""
        return sorted(
            (r.body["run_id"], r.body["type"])
            for r in self.received
            if path is None or r.path == path
        )


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
