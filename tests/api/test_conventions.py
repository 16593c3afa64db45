"""The conventions of docs/api.md: problem+json everywhere, request ids, body limits,
auth, CORS, operations routes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.main import create_app
from tests.conftest import TEST_KEY, make_settings


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == slug
    assert body["status"] == status
    assert body["detail"]
    assert "Traceback" not in response.text
    return dict(body)


async def test_unknown_routes_and_methods(api: httpx.AsyncClient) -> None:
    problem(await api.get("/nope"), 404, "not_found")
    problem(await api.delete("/healthz"), 405, "method_not_allowed")
    problem(await api.get("/sessions/not-a-uuid"), 422, "invalid_request")


async def test_request_id_echoed_or_made(api: httpx.AsyncClient) -> None:
    given = await api.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    made = await api.get("/nope")
    assert len(made.headers["x-request-id"]) == 32
    weird = await api.get("/healthz", headers={"X-Request-Id": "bad id\twith tab"})
    assert weird.headers["x-request-id"] != "bad id\twith tab"


async def test_auth(api: httpx.AsyncClient) -> None:
    problem(await api.get("/sessions", headers={"Authorization": ""}), 401, "unauthorized")
    problem(
        await api.get("/sessions", headers={"Authorization": "Bearer wrong-key-000000000"}),
        401,
        "unauthorized",
    )
    problem(await api.get("/sessions", headers={"Authorization": "Basic abc"}), 401, "unauthorized")
    # Operations routes need no key.
    for path in ("/healthz", "/metrics", "/openapi.json", "/"):
        assert (await api.get(path, headers={"Authorization": ""})).status_code == 200, path


async def test_body_limit_counts_streamed_bytes(database_url: str, conn: Any) -> None:
    app = create_app(make_settings(database_url, max_body_bytes=2048))
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {TEST_KEY}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://t", headers=headers
    ) as client:
        declared = await client.post(
            "/sessions", content=b"x" * 4096, headers={"Content-Type": "application/json"}
        )
        problem(declared, 413, "payload_too_large")

        async def chunks() -> Any:  # no Content-Length: counted as it streams
            for _ in range(8):
                yield b" " * 512
                await asyncio.sleep(0)

        streamed = await client.post(
            "/sessions", content=chunks(), headers={"Content-Type": "application/json"}
        )
        problem(streamed, 413, "payload_too_large")
    await app.state.runtime.db.engine.dispose()


async def test_cors_from_settings(database_url: str) -> None:
    app = create_app(make_settings(database_url, cors_origins=["https://app.example"]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        ok = await client.options(
            "/sessions",
            headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
        )
        assert ok.headers["access-control-allow-origin"] == "https://app.example"
        other = await client.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
    await app.state.runtime.db.engine.dispose()


async def test_readyz_and_metrics(api: httpx.AsyncClient) -> None:
    ready = await api.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ok"
    await api.get("/healthz")
    metrics = (await api.get("/metrics")).text
    assert 'parley_http_requests_total{method="GET",route="/healthz",status="200"}' in metrics


async def test_readyz_unready_when_not_migrated(database_url: str) -> None:
    from sqlalchemy.engine import make_url

    app = create_app(
        make_settings(
            make_url(database_url).set(database="postgres").render_as_string(hide_password=False)
        )
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        problem(await c.get("/readyz"), 503, "unavailable")
    await app.state.runtime.db.engine.dispose()


def test_open_mode_refused_on_public_address(database_url: str) -> None:
    settings = make_settings(database_url, api_keys=[])
    with pytest.raises(RuntimeError, match="refusing"):
        settings.check_bind("0.0.0.0")
    settings.check_bind("127.0.0.1")
    make_settings(database_url, api_keys=[], allow_open=True).check_bind("0.0.0.0")


def test_unsafe_settings_refused() -> None:
    from pydantic import ValidationError

    from app.config import Settings

    for bad in (
        {"api_keys": "tenant:short"},
        {"api_keys": "nokey"},
        {"api_keys": "a:0123456789abcdef,b:0123456789abcdef"},
        {"database_url": "mysql://x"},
        {"cors_origins": "*,https://a.example"},
        {"model_provider": "anthropic"},
        {"sse_ping_seconds": 30},
    ):
        with pytest.raises(ValidationError):
            Settings(**bad)


async def test_open_mode_single_tenant(database_url: str, conn: Any) -> None:
    app = create_app(make_settings(database_url, api_keys=[]))
    runtime = app.state.runtime
    assert runtime.open_mode
    from sqlalchemy.ext.asyncio import async_sessionmaker

    runtime.db.sessionmaker = async_sessionmaker(
        bind=conn, join_transaction_mode="create_savepoint"
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        created = await c.post("/sessions", json={})
        assert created.status_code == 201
        problem(
            await c.get("/sessions", headers={"Authorization": "Bearer nope-nope-nope-nope"}),
            401,
            "unauthorized",
        )
    await runtime.db.engine.dispose()


async def test_unexpected_error_is_a_problem_without_trace(database_url: str) -> None:
    app = create_app(make_settings(database_url))

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/boom", headers={"X-Request-Id": "req-500"})
    body = problem(response, 500, "internal")
    assert "secret internals" not in response.text
    assert body["detail"] == "An unexpected error occurred"
    assert response.headers["x-request-id"] == "req-500"
    await app.state.runtime.db.engine.dispose()


async def test_a_nul_character_is_a_422_and_stores_nothing(api: httpx.AsyncClient) -> None:
    """Postgres holds no NUL in text or JSON; a client can send one as `\\u0000`."""
    before = (await api.get("/sessions")).json()["data"]
    for body in ({"title": "a\u0000b"}, {"metadata": {"k": "a\u0000b"}}):
        response = await api.post("/sessions", json=body)
        problem(response, 422, "invalid_request")
        assert "NUL" in response.json()["errors"][0]["msg"]
    assert (await api.get("/sessions")).json()["data"] == before
    sid = (await api.post("/sessions", json={})).json()["id"]
    turn = await api.post(f"/sessions/{sid}/messages", json={"content": "a\u0000b"})
    problem(turn, 422, "invalid_request")
    assert (await api.get(f"/sessions/{sid}/messages")).json()["data"] == []
    assert (await api.get(f"/sessions/{sid}/runs")).json()["data"] == []
