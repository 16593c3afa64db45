"""A fake Anthropic Messages API for tests and benchmarks (the real ``anthropic`` SDK runs
against it unmodified).

In-process::

    with FakeAnthropic() as fake:
        fake.script(items.message("hi"), items.rate_limit(retry_after=1))
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test")
        ...
        assert fake.rejections == []

Its own process: ``python -m tests.fake_anthropic --port 0 --port-file PATH``, driven over
HTTP with the ``/_fake/...`` control routes (see ``server``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import uvicorn

from . import items
from .server import DEFAULT_CONFIG, FakeConnectionDrop, FakeState, create_app
from .tokens import (
    BLOCK_OVERHEAD_TOKENS,
    CHARS_PER_TOKEN,
    IMAGE_TOKENS,
    block_tokens,
    count_tokens,
    prompt_blocks,
    tool_tokens,
)
from .validate import sign_thinking

__all__ = [
    "BLOCK_OVERHEAD_TOKENS",
    "CHARS_PER_TOKEN",
    "DEFAULT_CONFIG",
    "IMAGE_TOKENS",
    "FakeAnthropic",
    "FakeConnectionDrop",
    "FakeState",
    "block_tokens",
    "count_tokens",
    "create_app",
    "items",
    "prompt_blocks",
    "sign_thinking",
    "tool_tokens",
]


class FakeAnthropic:
    """The fake served by uvicorn on 127.0.0.1 in a background thread (its own event loop).

    ``start()`` (or ``with``) binds a free port; ``base_url`` is ``http://127.0.0.1:PORT``.
    Settings given to the constructor are applied at start and again after ``reset()``.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, **settings: Any) -> None:
        self.state = FakeState()
        self._initial = dict(settings)
        if settings:
            self.state.configure(**settings)
        self.host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> FakeAnthropic:
        if self._server is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        sock.listen(1024)
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            create_app(self.state),
            log_config=None,  # leave the test process's logging configuration alone
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
            timeout_keep_alive=30,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="fake-anthropic", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake Anthropic server did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- driving it ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def script(self, *script_items: Any) -> None:
        """Appends items (dicts, or strings for plain text replies) to the FIFO queue."""
        self.state.script(script_items)

    def configure(self, **settings: Any) -> dict[str, Any]:
        """Merges settings (see ``DEFAULT_CONFIG``); returns the whole configuration."""
        return self.state.configure(**settings)

    def advance_clock(self, seconds: float) -> None:
        """Moves the fake's clock forward (e.g. past the cache TTL)."""
        self.configure(clock_offset=float(self.state.config["clock_offset"]) + seconds)

    def reset(self) -> None:
        """Empties the queue, the log and the cache, drops the responder, restores settings."""
        self.state.reset()
        if self._initial:
            self.state.configure(**self._initial)

    @property
    def responder(self) -> Callable[[dict[str, Any]], Any] | None:
        """``fn(request_body) -> script item | None``, asked when the queue is empty (it runs
        on the server's event loop thread, so keep it quick and non-blocking)."""
        return self.state.responder

    @responder.setter
    def responder(self, fn: Callable[[dict[str, Any]], Any] | None) -> None:
        self.state.responder = fn

    # ---- what it saw ------------------------------------------------------------------------
    @property
    def records(self) -> list[dict[str, Any]]:
        """Every API request in order: path, body, valid, status, error, response, usage..."""
        return self.state.records

    @property
    def requests(self) -> list[Any]:
        """The bodies of every ``POST /v1/messages`` received (valid or not), in order."""
        return [r["body"] for r in self.state.records if r["path"] == "/v1/messages"]

    @property
    def rejections(self) -> list[dict[str, Any]]:
        """Records of requests that failed validation (with the error returned)."""
        return self.state.rejections

    @property
    def usages(self) -> list[dict[str, Any]]:
        """The usage of each answered ``/v1/messages`` request, in order."""
        return [
            r["usage"]
            for r in self.state.records
            if r["path"] == "/v1/messages" and r["usage"] is not None
        ]

    @property
    def pending(self) -> list[dict[str, Any]]:
        """Script items not yet used."""
        return self.state.pending

    def async_client(self, **kwargs: Any) -> Any:
        """An ``anthropic.AsyncAnthropic`` pointed at the fake (api_key "test", no retries)."""
        import anthropic

        kwargs.setdefault("api_key", "test")
        kwargs.setdefault("max_retries", 0)
        return anthropic.AsyncAnthropic(base_url=self.base_url, **kwargs)
