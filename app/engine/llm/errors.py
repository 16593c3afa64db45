"""One exception type for every way a model call can fail, classified for the agent loop.

The loop decides three things from a failure: retry or not (`retryable`), how long to
wait (`retry_after`, see `retry.backoff_delay`), and what to tell the client (`kind`,
`message`, `request_id`). SDK exceptions, HTTP library errors raised mid-stream (the
SDK does not wrap those) and `event: error` frames inside a 200 stream all end up
here, so nothing above this package needs to know the SDK's exception tree.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias

from .storable import storable_text

__all__ = [
    "RETRYABLE_KINDS",
    "ErrorKind",
    "ModelError",
    "PromptTooLong",
    "error_from_body",
    "error_from_exception",
    "parse_prompt_too_long",
    "parse_retry_after",
]

ErrorKind: TypeAlias = Literal[
    "rate_limited",
    "overloaded",
    "server",
    "connection",
    "stream_broken",
    "prompt_too_long",
    "invalid_request",
    "authentication",
    "permission",
    "not_found",
    "request_too_large",
    "billing",
    "other",
]

RETRYABLE_KINDS: Final[frozenset[str]] = frozenset(
    {"rate_limited", "overloaded", "server", "connection", "stream_broken"}
)


class ModelError(Exception):
    """A failed model call. `retryable` defaults from `kind` (transient kinds only)."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
        retryable: bool | None = None,
    ) -> None:
        message = storable_text(message)  # it may end up in Run.error and the event log
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.status = status
        self.request_id = request_id
        self.retry_after = retry_after
        self.retryable = kind in RETRYABLE_KINDS if retryable is None else retryable

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(kind={self.kind!r}, status={self.status!r}, "
            f"retryable={self.retryable!r}, retry_after={self.retry_after!r}, "
            f"request_id={self.request_id!r}, message={self.message!r})"
        )


class PromptTooLong(ModelError):
    """400 "prompt is too long: N tokens > M maximum": compact and retry, do not just retry.

    `tokens` and `maximum` are 0 when the message did not carry the numbers.
    """

    def __init__(
        self,
        message: str,
        *,
        tokens: int,
        maximum: int,
        status: int | None = 400,
        request_id: str | None = None,
    ) -> None:
        super().__init__(
            "prompt_too_long", message, status=status, request_id=request_id, retryable=False
        )
        self.tokens = tokens
        self.maximum = maximum


_PROMPT_TOO_LONG = re.compile(
    r"prompt is too long(?::\s*(\d+)\s*tokens\s*>\s*(\d+)\s*maximum)?", re.I
)
# Wording of the spend/credit/usage-limit errors (429, 400 or 402); retrying cannot help.
_BILLING = re.compile(
    r"spend(?:ing)? limit|credit balance|billing|usage limit|purchase credits", re.I
)
_SPEND_LIMIT_CODES = frozenset(
    {
        "contract_spend_limit_reached",
        "enforced_spend_limit_reached",
        "linked_organization_spend_limit_reached",
        "linked_organization_billing_unavailable",
    }
)
_KIND_BY_STATUS: Final[dict[int, ErrorKind]] = {
    400: "invalid_request",
    401: "authentication",
    402: "billing",
    403: "permission",
    404: "not_found",
    408: "server",
    409: "server",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limited",
    529: "overloaded",
}
_KIND_BY_TYPE: Final[dict[str, ErrorKind]] = {
    "invalid_request_error": "invalid_request",
    "authentication_error": "authentication",
    "billing_error": "billing",
    "permission_error": "permission",
    "not_found_error": "not_found",
    "request_too_large": "request_too_large",
    "rate_limit_error": "rate_limited",
    "timeout_error": "server",
    "api_error": "server",
    "overloaded_error": "overloaded",
}
# A retry-after header asking for longer is read as this (a day).
_MAX_RETRY_AFTER_HEADER = 86_400.0


def parse_prompt_too_long(message: str) -> tuple[int, int] | None:
    """`(tokens, maximum)` from a "prompt is too long" message, (0, 0) without numbers;
    None for any other message."""
    match = _PROMPT_TOO_LONG.search(message)
    if match is None:
        return None
    if match.group(1) is None:
        return 0, 0
    return int(match.group(1)), int(match.group(2))


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from `retry-after-ms` (preferred) or `retry-after` (seconds or date)."""
    if not headers:
        return None
    value: float | None = None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        value = _to_float(raw_ms)
        value = None if value is None else value / 1000.0
    if value is None:
        raw = headers.get("retry-after")
        if raw is None:
            return None
        value = _to_float(raw)
        if value is None:
            parsed = email.utils.parsedate_tz(raw)
            if parsed is None:
                return None
            value = email.utils.mktime_tz(parsed) - time.time()
    return min(max(value, 0.0), _MAX_RETRY_AFTER_HEADER)


def _to_float(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def error_from_body(
    status: int | None,
    body: object,
    *,
    headers: Mapping[str, str] | None = None,
    request_id: str | None = None,
    fallback_message: str = "",
) -> ModelError:
    """Classify an API error body `{"type": "error", "error": {"type", "message"}, ...}`.

    `status` 200 (or None) means the error arrived inside a stream: the error type
    decides. Otherwise the HTTP status decides (the type, for a status it does not
    know), refined by the type and the message.
    """
    error: Mapping[str, Any] = {}
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping):
            error = inner
        if request_id is None and isinstance(body.get("request_id"), str):
            request_id = body["request_id"]
    etype = error.get("type") if isinstance(error.get("type"), str) else None
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = fallback_message or (str(body) if body else f"model API error ({status})")
    details = error.get("details")
    code = details.get("error_code") if isinstance(details, Mapping) else None
    if request_id is None and headers is not None:
        request_id = headers.get("request-id")

    kind: ErrorKind
    in_stream = status is None or status == 200
    if status is not None and status in _KIND_BY_STATUS:
        kind = _KIND_BY_STATUS[status]
    elif status is not None and status >= 500:
        kind = "server"
    else:
        kind = _KIND_BY_TYPE.get(etype or "", "other")
    if etype == "overloaded_error":
        kind = "overloaded"

    if kind in ("invalid_request", "request_too_large"):
        numbers = parse_prompt_too_long(message)
        if numbers is not None:
            return PromptTooLong(
                message,
                tokens=numbers[0],
                maximum=numbers[1],
                status=status,
                request_id=request_id,
            )
    if (
        etype == "billing_error"
        or code in _SPEND_LIMIT_CODES
        or (kind in ("rate_limited", "invalid_request", "permission") and _BILLING.search(message))
    ):
        kind = "billing"

    retryable = kind in RETRYABLE_KINDS
    if not in_stream and headers is not None:
        # The API's own verdict, which the SDK obeys too.
        should_retry = headers.get("x-should-retry")
        if should_retry == "true" and kind != "billing":
            retryable = True
        elif should_retry == "false":
            retryable = False
    retry_after = None if in_stream else parse_retry_after(headers)
    return ModelError(
        kind,
        message,
        status=status,
        request_id=request_id,
        retry_after=retry_after,
        retryable=retryable,
    )


def error_from_exception(exc: BaseException, *, events_seen: bool = False) -> ModelError:
    """Map any failure of one model call to a `ModelError`.

    `events_seen` says whether at least one stream event had arrived: a transport
    failure after that is `stream_broken` (the client must discard the partial
    message), before it `connection`.
    """
    if isinstance(exc, ModelError):
        return exc
    # Imported here so that importing this module does not load the (slow) SDK.
    import anthropic
    import httpx2

    broken: ErrorKind = "stream_broken" if events_seen else "connection"
    if isinstance(exc, anthropic.APIStatusError):
        return error_from_body(
            exc.status_code,
            exc.body,
            headers=exc.response.headers,
            request_id=exc.request_id,
            fallback_message=exc.message,
        )
    if isinstance(exc, anthropic.APITimeoutError):
        return ModelError(broken, f"model API timed out: {exc.message}")
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else exc.message
        return ModelError(broken, f"cannot reach the model API: {detail}")
    if isinstance(exc, httpx2.TimeoutException):
        return ModelError(broken, f"model API stream timed out ({type(exc).__name__})")
    if isinstance(exc, (httpx2.HTTPError, OSError)):
        # A dropped connection mid-stream surfaces as RemoteProtocolError / ReadError
        # straight from the HTTP library: the SDK only wraps failures of the send.
        return ModelError(broken, f"model API connection failed: {type(exc).__name__}: {exc}")
    if isinstance(exc, anthropic.AnthropicError):
        return ModelError("other", f"{type(exc).__name__}: {exc}")
    return ModelError("other", f"unexpected model client failure: {type(exc).__name__}: {exc}")
