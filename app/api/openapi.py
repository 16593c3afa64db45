"""The OpenAPI document, made to tell the truth about errors.

FastAPI documents only a `422` with its own `application/json` validation shape. Every
error Parley sends is `application/problem+json` (see `problems.py`), and which ones an
operation can send follows from what it takes: a key (401; 403 for a browser token out
of its scope; 429 past a rate limit; 503 while the database cannot be reached), a path
parameter (404), parameters or a body (422), a JSON body (400), any body on a writing
method (413, the body limit). Statuses a route declares itself (409, 502, 503) keep
their descriptions.
This module derives the list for every operation and gives each the problem schema.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.api.problems import PROBLEM_JSON
from app.schemas import Problem

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
DESCRIPTIONS = {
    400: "The body is not valid JSON",
    401: "No valid API key",
    403: "A browser token used outside its session or its rights",
    404: "No such resource (or another tenant's)",
    413: "The body is over the route's size limit",
    422: "The request is not valid; `errors` names the fields",
    429: "A rate limit (`rate_limited`, with Retry-After) or a token budget (`budget_exceeded`)",
    503: "The database cannot be reached now (`unavailable`, with Retry-After)",
}
WRITING_METHODS = {"post", "put", "patch"}
# Every route under these takes the caller's key (deps.TenantDep).
KEYED_PREFIXES = ("/sessions", "/webhooks", "/usage", "/tokens")
# The event stream: the schema of one event (OpenAPI's reading of `text/event-stream`).
EVENT_STREAM_SCHEMA = {
    "type": "object",
    "description": "One Server-Sent Event: `id` is the run's event number (growing, never "
    "reused; for Last-Event-ID), `event` its name, `data` a JSON document (docs/api.md "
    "lists them); comment lines between events are keep-alive pings",
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$"},
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
    "required": ["event", "data"],
}


def _problem_statuses(path: str, method: str, operation: dict[str, Any]) -> set[int]:
    statuses = set()
    if path.startswith(KEYED_PREFIXES):
        statuses |= {401, 403, 429, 503}
    if "{" in path:
        statuses.add(404)
    body = operation.get("requestBody", {}).get("content", {})
    if operation.get("parameters") or body:
        statuses.add(422)
    if "application/json" in body:
        statuses.add(400)
    if method in WRITING_METHODS:
        statuses.add(413)
    return statuses


def _as_problem(response: dict[str, Any]) -> None:
    content = response.get("content", {})
    schemas = [media.get("schema") for media in content.values()]
    schema = next((s for s in schemas if s and "HTTPValidationError" not in str(s)), None)
    response["content"] = {PROBLEM_JSON: {"schema": schema or PROBLEM_REF}}


def document_problems(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document with every operation's problem answers."""
    if app.openapi_schema:
        return app.openapi_schema
    spec = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            for status in _problem_statuses(path, method, operation):
                responses.setdefault(str(status), {"description": DESCRIPTIONS[status]})
                if status == 422 and responses["422"]["description"] == "Validation Error":
                    responses["422"]["description"] = DESCRIPTIONS[422]
            for status, response in responses.items():
                if status.isdigit() and int(status) >= 400:
                    _as_problem(response)
            ok = responses.get("200", {}).get("content", {})
            if "text/event-stream" in ok:
                ok["text/event-stream"] = {"schema": EVENT_STREAM_SCHEMA}
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(problem.pop("$defs", {}))
    schemas["Problem"] = problem
    app.openapi_schema = spec
    return spec


def install(app: FastAPI) -> None:
    app.openapi = lambda: document_problems(app)  # type: ignore[method-assign]
