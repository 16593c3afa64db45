"""One error hierarchy, rendered as RFC 9457 problem details (HTTP) or SSE `error` events.

Routes and services raise `ProblemError` subclasses; the handlers in `install_handlers`
turn those and framework errors (unknown routes, bad JSON, validation) into
`application/problem+json`; anything unexpected becomes a 500 problem in
`api.middleware.RequestContextMiddleware`. Nothing ever leaks a stack trace.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"


class ProblemError(StarletteHTTPException):
    """An error with a problem+json rendering.

    Subclassing Starlette's HTTPException matters: FastAPI re-raises HTTPExceptions
    raised while it reads a request body (our streaming size limit does so) instead of
    turning them into a generic 400.
    """

    status = 500
    slug = "internal"
    title = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        errors: list[Any] | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(status_code=self.status, detail=detail, headers=headers)
        self.errors = errors
        self.extra = extra or {}

    def problem(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.errors is not None:
            body["errors"] = self.errors
        body.update(self.extra)
        return body


class BadRequest(ProblemError):
    status, slug, title = 400, "invalid_request", "Bad request"


class Invalid(ProblemError):
    status, slug, title = 422, "invalid_request", "Invalid request"


class Unauthorized(ProblemError):
    status, slug, title = 401, "unauthorized", "Unauthorized"

    def __init__(self, detail: str = "A valid API key is required") -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class NotFound(ProblemError):
    status, slug, title = 404, "not_found", "Not found"


class Conflict(ProblemError):
    status, slug, title = 409, "conflict", "Conflict"


class PayloadTooLarge(ProblemError):
    status, slug, title = 413, "payload_too_large", "Payload too large"


class RateLimited(ProblemError):
    status, slug, title = 429, "rate_limited", "Too many requests"


class UpstreamError(ProblemError):
    status, slug, title = 502, "upstream_error", "Model API failed"


class Unavailable(ProblemError):
    status, slug, title = 503, "unavailable", "Service unavailable"


class RunFailed(Exception):
    """Ends a run as `failed` with an error type clients can branch on (`Run.error`)."""

    def __init__(self, error_type: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.error = {"type": error_type, "message": message}
        if request_id:
            self.error["request_id"] = request_id


def problem_response(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {"type": slug, "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


_SLUG_BY_STATUS = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "invalid_request",
    429: "rate_limited",
    502: "upstream_error",
    503: "unavailable",
}


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        out.append(
            {
                "loc": [str(part) for part in err.get("loc", ())],
                "msg": str(err.get("msg", "")),
                "type": str(err.get("type", "")),
            }
        )
    return out


async def _on_problem(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    return JSONResponse(
        exc.problem(), status_code=exc.status, headers=exc.headers, media_type=PROBLEM_JSON
    )


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc, ProblemError):
        return await _on_problem(request, exc)
    status = exc.status_code
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    detail = exc.detail if isinstance(exc.detail, str) and exc.detail != phrase else None
    if status == 404:
        detail = detail or f"No route for {request.method} {request.url.path}"
        if detail == "Not Found":
            detail = f"No route for {request.method} {request.url.path}"
    elif status == 405:
        detail = f"Method {request.method} is not allowed on {request.url.path}"
    return problem_response(
        status,
        _SLUG_BY_STATUS.get(status, "error"),
        phrase,
        detail or phrase,
        headers=getattr(exc, "headers", None),
    )


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


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation)
