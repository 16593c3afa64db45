"""Domain errors: plain exceptions that say what went wrong, in the caller's terms.

Services raise them; only `app.api.problems` knows how each one is shown over HTTP
(status, problem type). Nothing here knows about HTTP, so the same errors serve the
routes, the run engine and the command line.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """A failure the caller can act on. `errors` names the offending fields (each
    `{"loc": [...], "msg": ..., "type": ...}`); `extra` adds members to the answer."""

    def __init__(
        self,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        self.extra = extra or {}


class Invalid(DomainError):
    """The request parsed but is not valid (or not valid now, for this resource)."""

    @classmethod
    def field(cls, loc: list[str | int], msg: str, detail: str | None = None) -> Invalid:
        """An error about one field, `loc` as in a validation error (`["query", "after"]`)."""
        return cls(detail or msg, errors=[{"loc": loc, "msg": msg, "type": "value_error"}])


class Unauthorized(DomainError):
    def __init__(self, detail: str = "A valid API key is required") -> None:
        super().__init__(detail)


class Forbidden(DomainError):
    """The credential is valid but does not allow this (a browser token outside its
    scope)."""


class NotFound(DomainError):
    """Absent, or not the caller's to see (another tenant's session)."""


class Conflict(DomainError):
    """The resource's state does not allow this now (an active run, say)."""


class TooLarge(DomainError):
    """Past a size limit or a quota (a file, a session's workspace)."""


class UpstreamFailed(DomainError):
    """The model API failed after retries."""


class Unavailable(DomainError):
    """A dependency (the database) cannot answer now; the request may be retried."""


class RunFailed(Exception):
    """Ends a run as `failed` with an error type clients can branch on (`Run.error`)."""

    def __init__(
        self,
        error_type: str,
        message: str,
        request_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.error: dict[str, Any] = {"type": error_type, "message": message}
        if request_id:
            self.error["request_id"] = request_id
        self.error.update(extra or {})


class NoGain(Invalid):
    """A compaction would not make the context smaller by the minimum share (problem
    type `nothing_to_gain`); `extra` carries both figures (`pre_tokens`,
    `post_tokens`) and `min_saving`."""


class RateLimited(DomainError):
    """Past a rate or concurrency limit; `retry_after` seconds until it may pass."""

    def __init__(self, detail: str, *, retry_after: int, extra: dict[str, Any] | None = None):
        super().__init__(detail, extra={**(extra or {}), "retry_after": retry_after})
        self.retry_after = retry_after


class BudgetExceeded(DomainError):
    """A token budget (the tenant's or the session's) is used up for this period."""
