"""openapi/openapi.json is generated from the app (`make openapi`); this fails on drift."""

from __future__ import annotations

import json
from pathlib import Path

from app.config import Settings
from app.main import create_app

SPEC = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def test_openapi_file_matches_the_app() -> None:
    spec = create_app(Settings(model_provider="offline", database_url="sqlite://")).openapi()
    committed = json.loads(SPEC.read_text())
    assert committed == json.loads(json.dumps(spec)), (
        "openapi/openapi.json is stale: run `make openapi` and commit the result"
    )


def test_contract_routes_are_documented() -> None:
    paths = json.loads(SPEC.read_text())["paths"]
    expected = {
        ("post", "/sessions"),
        ("get", "/sessions"),
        ("get", "/sessions/{session_id}"),
        ("patch", "/sessions/{session_id}"),
        ("delete", "/sessions/{session_id}"),
        ("post", "/sessions/{session_id}/messages"),
        ("get", "/sessions/{session_id}/messages"),
        ("get", "/sessions/{session_id}/messages/{message_uuid}"),
        ("get", "/sessions/{session_id}/tree"),
        ("put", "/sessions/{session_id}/head"),
        ("post", "/sessions/{session_id}/messages/{message_uuid}/regenerate"),
        ("post", "/sessions/{session_id}/fork"),
        ("post", "/sessions/{session_id}/snip"),
        ("post", "/sessions/{session_id}/clear"),
        ("get", "/sessions/{session_id}/runs"),
        ("get", "/sessions/{session_id}/runs/{run_id}"),
        ("get", "/sessions/{session_id}/runs/{run_id}/events"),
        ("post", "/sessions/{session_id}/runs/{run_id}/cancel"),
        ("post", "/sessions/{session_id}/runs/{run_id}/tool_results"),
        ("get", "/sessions/{session_id}/context"),
        ("get", "/sessions/{session_id}/context/request"),
        ("post", "/sessions/{session_id}/compact"),
        ("put", "/sessions/{session_id}/files/{path}"),
        ("get", "/sessions/{session_id}/files"),
        ("get", "/sessions/{session_id}/files/{path}"),
        ("delete", "/sessions/{session_id}/files/{path}"),
        ("get", "/sessions/{session_id}/transcript"),
        ("post", "/sessions/import"),
        ("post", "/webhooks"),
        ("get", "/webhooks"),
        ("delete", "/webhooks/{webhook_id}"),
        ("get", "/webhooks/{webhook_id}/deliveries"),
        ("post", "/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"),
        ("get", "/webhooks/turn_secret"),
        ("get", "/webhooks/deliveries"),
        ("post", "/webhooks/deliveries/{delivery_id}/redeliver"),
        ("get", "/usage"),
        ("post", "/tokens"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
    }
    documented = {(method, path) for path, ops in paths.items() for method in ops}
    assert expected <= documented, sorted(expected - documented)


def test_every_operation_documents_itself() -> None:
    paths = json.loads(SPEC.read_text())["paths"]
    undocumented = sorted(
        f"{method.upper()} {path}"
        for path, ops in paths.items()
        for method, op in ops.items()
        if not str(op.get("summary", "")).strip() or not str(op.get("description", "")).strip()
    )
    assert undocumented == [], "operations without a summary= or a docstring"
