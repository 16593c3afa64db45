"""Every error answer as RFC 9457 problem details (`application/problem+json`).

The one place where domain errors (`app.errors`) and framework errors (unknown routes,
bad JSON, validation, the streamed body limit) become HTTP answers. Anything else that
escapes is rendered by `middleware.RequestContextMiddleware` as `last_resort` says: 503
`unavailable` with `Retry-After` when the database cannot be reached now (the request
may be repeated as it is), 422 when Postgres refused the request's text (a NUL), else a
500 problem without a trace.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError
from starlette.exceptions import HTTPException

from app.db import is_transient, is_unstorable_text
from app.errors import (
    BudgetExceeded,
    Conflict,
    DomainError,
    Forbidden,
    Invalid,
    NoGain,
    NotFound,
    RateLimited,
    TooLarge,
    Unauthorized,
    Unavailable,
    UpstreamFailed,
)

PROBLEM_JSON = "application/problem+json"
# What a 503 asks a client to wait before it repeats the request.
RETRY_AFTER_SECONDS = 2

# status, problem type and title of each domain error
DOMAIN_PROBLEMS: dict[type[DomainError], tuple[int, str, str]] = {
    # a subclass before its base: the first match wins
    NoGain: (422, "nothing_to_gain", "Nothing to gain"),
    Invalid: (422, "invalid_request", "Invalid request"),
    Unauthorized: (401, "unauthorized", "Unauthorized"),
    Forbidden: (403, "forbidden", "Forbidden"),
    NotFound: (404, "not_found", "Not found"),
    Conflict: (409, "conflict", "Conflict"),
    TooLarge: (413, "payload_too_large", "Payload too large"),
    UpstreamFailed: (502, "upstream_error", "Model API failed"),
    RateLimited: (429, "rate_limited", "Too many requests"),
    BudgetExceeded: (429, "budget_exceeded", "Token budget exceeded"),
    Unavailable: (503, "unavailable", "Service unavailable"),
}

# problem types of the framework's own HTTP errors (unknown route, wrong method, body limit)
_SLUG_BY_STATUS = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
}
TOO_LARGE_TITLE = "Payload too large"


class ProblemResponse(JSONResponse):
    """A problem document, ASCII-escaped: the text it echoes (a field name, a path) may
    hold a lone surrogate, which UTF-8 cannot encode but a JSON escape can carry."""

    media_type = PROBLEM_JSON

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def problem(status: int, slug: str, title: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"type": slug, "title": title, "status": status, "detail": detail, **extra}


def problem_response(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = problem(status, slug, title, detail, **extra)
    return ProblemResponse(body, status_code=status, headers=headers)


def domain_problem(exc: DomainError) -> tuple[int, dict[str, Any]]:
    """The status and problem document of a domain error."""
    status, slug, title = next(
        spec for kind, spec in DOMAIN_PROBLEMS.items() if isinstance(exc, kind)
    )
    extra = dict(exc.extra)
    if exc.errors is not None:
        extra["errors"] = exc.errors
    return status, problem(status, slug, title, exc.detail, **extra)


def _headers_for(status: int, exc: BaseException) -> dict[str, str] | None:
    if isinstance(exc, Unauthorized):
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, RateLimited):
        return {"Retry-After": str(exc.retry_after)}
    if status == 503:
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return None


async def _on_domain_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DomainError)
    status, body = domain_problem(exc)
    headers = _headers_for(status, exc)
    return ProblemResponse(body, status_code=status, headers=headers)


def last_resort(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The answer to an exception no handler took: its status, problem document and
    headers."""
    if is_transient(exc):
        unavailable = Unavailable("The database cannot be reached right now; retry shortly")
        status, body = domain_problem(unavailable)
        return status, body, _headers_for(status, unavailable) or {}
    if is_unstorable_text(exc):  # the transaction rolled back: nothing was stored
        status, body = domain_problem(
            Invalid("The request holds a NUL character (\\u0000), which cannot be stored")
        )
        return status, body, {}
    return 500, problem(500, "internal", "Internal error", "An unexpected error occurred"), {}


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    title = TOO_LARGE_TITLE if status == 413 else phrase
    detail = exc.detail if isinstance(exc.detail, str) and exc.detail != phrase else None
    if status == 404 and (detail is None or detail == "Not Found"):
        detail = f"No route for {request.method} {request.url.path}"
    headers = getattr(exc, "headers", None)
    if status == 405:
        detail = f"Method {request.method} is not allowed on {request.url.path}"
        # Starlette names the methods of the first route that matched the path only
        headers = {**(headers or {}), "Allow": ", ".join(_allowed(request))}
    return problem_response(
        status, _SLUG_BY_STATUS.get(status, "error"), title, detail or phrase, headers=headers
    )


def _allowed(request: Request) -> list[str]:
    """Every documented method of the request's path (from the OpenAPI document); a
    literal segment wins over a parameter (`/sessions/import` is no session id)."""
    templates: list[tuple[re.Pattern[str], int, list[str]]] | None = getattr(
        request.app.state, "path_methods", None
    )
    if templates is None:
        templates = [
            (_template_regex(path), path.count("{"), [method.upper() for method in operations])
            for path, operations in request.app.openapi()["paths"].items()
        ]
        request.app.state.path_methods = templates
    found = [
        (params, methods)
        for pattern, params, methods in templates
        if pattern.match(request.url.path)
    ]
    fewest = min((params for params, _ in found), default=0)
    return sorted({m for params, methods in found if params == fewest for m in methods})


def _template_regex(template: str) -> re.Pattern[str]:
    parts = []
    for segment in template.strip("/").split("/"):
        if segment == "{path}":  # the Files routes' path spans segments
            parts.append(".+")
        elif segment.startswith("{"):
            parts.append("[^/]+")
        else:
            parts.append(re.escape(segment))
    return re.compile("/" + "/".join(parts) + "$")


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    return [
        {
            "loc": [str(part) for part in err.get("loc", ())],
            "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in exc.errors()
    ]


async def _on_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = _validation_errors(exc)
    if any(e["type"] == "json_invalid" for e in errors):
        return problem_response(
            400, "invalid_request", "Bad request", "The request body is not valid JSON"
        )
    return problem_response(
        422,
        "invalid_request",
        "Invalid request",
        "The request is not valid; see errors",
        errors=errors,
    )


async def _on_integrity_error(_request: Request, exc: Exception) -> JSONResponse:
    # Two requests raced for one unique row (the same Idempotency-Key, say): the loser's
    # transaction rolled back, so nothing changed, and a retry gets the winner's answer.
    return problem_response(
        409,
        "conflict",
        "Conflict",
        "The request conflicts with a concurrent one (the same Idempotency-Key?); retry it",
    )


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DomainError, _on_domain_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(IntegrityError, _on_integrity_error)


async def _method_not_allowed() -> None:
    raise HTTPException(405)


def refuse_other_methods(router: APIRouter, path: str, allowed: set[str]) -> None:
    """For a literal segment where a parameter route would take it for an id
    (`/sessions/import`, `/webhooks/deliveries`): other methods answer 405, not a 422
    about the id. Call it before the parameter routes are added to `router`."""
    others = sorted({"GET", "POST", "PUT", "PATCH", "DELETE"} - allowed)
    router.add_api_route(path, _method_not_allowed, methods=others, include_in_schema=False)
