"""Error classification from SDK exceptions, HTTP library errors and error bodies."""

from __future__ import annotations

import email.utils
import time

import anthropic
import httpx2
import pytest

from app.engine.llm.errors import (
    ModelError,
    PromptTooLong,
    error_from_body,
    error_from_exception,
    parse_prompt_too_long,
    parse_retry_after,
)

REQUEST = httpx2.Request("POST", "https://api.anthropic.com/v1/messages")


def status_error(
    cls: type[anthropic.APIStatusError],
    status: int,
    etype: str,
    message: str,
    headers: dict[str, str] | None = None,
    error_code: str | None = None,
) -> anthropic.APIStatusError:
    error: dict[str, object] = {"type": etype, "message": message}
    if error_code:
        error["details"] = {"error_code": error_code}
    body = {"type": "error", "error": error, "request_id": "req_body"}
    response = httpx2.Response(status, headers=headers or {}, request=REQUEST, json=body)
    return cls(f"Error code: {status} - {body}", response=response, body=body)


def test_rate_limit_with_retry_after_is_retryable() -> None:
    exc = status_error(
        anthropic.RateLimitError, 429, "rate_limit_error", "slow", {"retry-after": "12"}
    )
    error = error_from_exception(exc)
    assert (error.kind, error.retryable, error.retry_after, error.status) == (
        "rate_limited",
        True,
        12.0,
        429,
    )
    assert error.request_id == "req_body"


def test_spend_limit_error_code_is_billing_and_final() -> None:
    exc = status_error(
        anthropic.RateLimitError,
        429,
        "rate_limit_error",
        "limit",
        error_code="enforced_spend_limit_reached",
    )
    error = error_from_exception(exc)
    assert (error.kind, error.retryable) == ("billing", False)


def test_overloaded_error_is_overloaded() -> None:
    error = error_from_exception(
        status_error(anthropic.OverloadedError, 529, "overloaded_error", "Overloaded")
    )
    assert (error.kind, error.retryable) == ("overloaded", True)


def test_in_stream_error_has_status_200_and_is_classified_by_type() -> None:
    body = {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}
    response = httpx2.Response(200, headers={"request-id": "req_h"}, request=REQUEST)
    exc = anthropic.APIStatusError(str(body), response=response, body=body)
    error = error_from_exception(exc, events_seen=True)
    assert (error.kind, error.status, error.retryable, error.request_id) == (
        "server",
        200,
        True,
        "req_h",
    )


@pytest.mark.parametrize(
    ("etype", "kind", "retryable"),
    [
        ("overloaded_error", "overloaded", True),
        ("rate_limit_error", "rate_limited", True),
        ("api_error", "server", True),
        ("invalid_request_error", "invalid_request", False),
        ("authentication_error", "authentication", False),
        ("permission_error", "permission", False),
        ("not_found_error", "not_found", False),
        ("billing_error", "billing", False),
        ("request_too_large", "request_too_large", False),
        ("something_new_error", "other", False),
    ],
)
def test_in_stream_error_types(etype: str, kind: str, retryable: bool) -> None:
    error = error_from_body(200, {"type": "error", "error": {"type": etype, "message": "m"}})
    assert (error.kind, error.retryable, error.retry_after) == (kind, retryable, None)


def test_prompt_too_long_in_a_400_is_a_prompt_too_long() -> None:
    exc = status_error(
        anthropic.BadRequestError,
        400,
        "invalid_request_error",
        "prompt is too long: 201234 tokens > 200000 maximum",
    )
    error = error_from_exception(exc)
    assert isinstance(error, PromptTooLong)
    assert (error.tokens, error.maximum, error.retryable, error.status) == (
        201234,
        200000,
        False,
        400,
    )


def test_prompt_too_long_without_numbers_still_classified() -> None:
    error = error_from_body(
        400, {"error": {"type": "invalid_request_error", "message": "Prompt is too long"}}
    )
    assert isinstance(error, PromptTooLong)
    assert (error.tokens, error.maximum) == (0, 0)


def test_parse_prompt_too_long() -> None:
    assert parse_prompt_too_long("prompt is too long: 5 tokens > 3 maximum") == (5, 3)
    assert parse_prompt_too_long("max_tokens: 9 > 8") is None


def test_unknown_5xx_and_4xx() -> None:
    assert error_from_body(502, "Bad Gateway").kind == "server"
    assert error_from_body(502, "Bad Gateway").retryable
    odd = error_from_body(418, {"error": {"type": "teapot", "message": "short and stout"}})
    assert (odd.kind, odd.retryable, odd.message) == ("other", False, "short and stout")


def test_x_should_retry_header_is_obeyed() -> None:
    error = error_from_body(
        400,
        {"error": {"type": "invalid_request_error", "message": "m"}},
        headers={"x-should-retry": "true"},
    )
    assert error.retryable
    error = error_from_body(
        529,
        {"error": {"type": "overloaded_error", "message": "m"}},
        headers={"x-should-retry": "false"},
    )
    assert not error.retryable


def test_connection_errors_before_and_after_events() -> None:
    exc = anthropic.APIConnectionError(request=REQUEST)
    assert error_from_exception(exc).kind == "connection"
    assert error_from_exception(exc, events_seen=True).kind == "stream_broken"
    timeout = anthropic.APITimeoutError(request=REQUEST)
    assert error_from_exception(timeout).kind == "connection"
    assert error_from_exception(timeout).retryable


@pytest.mark.parametrize(
    "exc",
    [
        httpx2.RemoteProtocolError("peer closed connection without sending complete message body"),
        httpx2.ReadError("connection reset"),
        httpx2.ReadTimeout("timed out"),
        ConnectionResetError(104, "reset"),
    ],
)
def test_unwrapped_transport_errors_mid_stream_are_stream_broken(exc: Exception) -> None:
    error = error_from_exception(exc, events_seen=True)
    assert (error.kind, error.retryable) == ("stream_broken", True)
    assert error_from_exception(exc).kind == "connection"


def test_anything_else_is_other_and_final() -> None:
    error = error_from_exception(RuntimeError("bug"))
    assert (error.kind, error.retryable) == ("other", False)
    original = ModelError("overloaded", "x")
    assert error_from_exception(original) is original


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "2.5"}) == 2.5
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"retry-after-ms": "junk", "retry-after": "4"}) == 4.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "-5"}) == 0.0
    assert parse_retry_after({}) is None
    assert parse_retry_after(None) is None
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    value = parse_retry_after({"retry-after": future})
    assert value is not None
    assert 25.0 <= value <= 31.0


def test_model_error_defaults_retryable_from_kind() -> None:
    assert ModelError("overloaded", "x").retryable
    assert not ModelError("invalid_request", "x").retryable
    assert "overloaded" in repr(ModelError("overloaded", "x"))


def test_a_5xx_stays_retryable_whatever_its_body_says() -> None:
    error = error_from_body(500, {"error": {"type": "invalid_request_error", "message": "odd"}})
    assert (error.kind, error.retryable) == ("server", True)
