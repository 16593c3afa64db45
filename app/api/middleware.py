"""Pure ASGI middleware: request ids, body size limits, last-resort error rendering, metrics.

Pure ASGI (not BaseHTTPMiddleware) so streaming responses pass straight through and
the size limit can count bytes as they arrive instead of trusting Content-Length.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import metrics
from app.api.problems import PROBLEM_JSON, TOO_LARGE_TITLE, last_resort, problem
from app.logs import request_id_var

log = logging.getLogger("parley.http")


_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
# Every answer: never sniffed into another type; not cached unless its route says so
# (the playground's page and assets say `no-cache`). API answers hold tenant data.
_DEFAULT_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store"))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class RequestContextMiddleware:
    """X-Request-Id and the default security headers on every answer, request metrics,
    and a problem+json answer (no trace; `problems.last_resort`) for anything that
    escaped the exception handlers."""

    def __init__(self, app: ASGIApp, route_name: Callable[[Scope], str]) -> None:
        self.app = app
        self.route_name = route_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = _header(scope, b"x-request-id")
        request_id = (
            incoming if incoming and _VALID_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        )
        token = request_id_var.set(request_id)
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status_holder = {"status": 500, "started": False}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                status_holder["started"] = True
                headers = list(message.get("headers", []))
                present = {key.lower() for key, _ in headers}
                headers += [item for item in _DEFAULT_HEADERS if item[0] not in present]
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            status, problem_body, headers = last_resort(exc)
            if status == 500:
                log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            else:
                method, path = scope.get("method"), scope.get("path")
                log.warning("%s on %s %s: %r", problem_body["type"], method, path, exc)
            if not status_holder["started"]:
                body = json.dumps(problem_body).encode()
                await send_with_id(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", PROBLEM_JSON.encode()),
                            (b"content-length", str(len(body)).encode()),
                            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
                        ],
                    }
                )
                await send_with_id({"type": "http.response.body", "body": body})
        finally:
            request_id_var.reset(token)
            metrics.observe_request(
                scope.get("method", "GET"),
                self.route_name(scope),
                int(status_holder["status"]),
                time.perf_counter() - started,
            )


class BodyLimitMiddleware:
    """Refuse bodies over a per-route limit with 413, counting bytes as they stream in."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[Scope], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope)
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_too_large(send, limit)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counting_receive, send)


class BodyTooLarge(HTTPException):
    """The one HTTP error raised below the routes: FastAPI re-raises an HTTPException
    raised while it reads a body (here, from `receive`) instead of calling it a 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, _too_large(limit))


def _too_large(limit: int) -> str:
    return f"The request body exceeds the limit of {limit} bytes for this route"


async def _send_too_large(send: Send, limit: int) -> None:
    body = json.dumps(problem(413, "payload_too_large", TOO_LARGE_TITLE, _too_large(limit)))
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body.encode()})


def route_template(scope: Scope) -> str:
    """The matched route's path template (low-cardinality metric label)."""
    route: Any = scope.get("route")
    return str(getattr(route, "path", None) or "unmatched")
