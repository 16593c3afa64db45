"""Hostile input: NUL, lone surrogates and out-of-range values are refused with a 4xx
problem naming the field, never a 500, and nothing is stored."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

NUL = "a\u0000b"
SURROGATE = "a\udfffb"


def raw_json(body: Any) -> bytes:
    # json.dumps escapes a lone surrogate as \udfff, as a hostile client would send it
    return json.dumps(body).encode()


async def post_raw(
    api: httpx.AsyncClient, url: str, body: Any, method: str = "POST"
) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return await api.request(method, url, content=raw_json(body), headers=headers)


def assert_names(response: httpx.Response, *loc: str | int) -> None:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    locs = [err["loc"] for err in response.json()["errors"]]
    assert any(found[: len(loc)] == [str(part) for part in loc] for found in locs), locs


async def new_session(api: httpx.AsyncClient) -> str:
    response = await api.post("/sessions", json={"builtin_tools": ["Read"]})
    assert response.status_code == 201
    return str(response.json()["id"])


SESSION_BODIES = [
    ({"title": NUL}, ["body", "title"]),
    ({"title": SURROGATE}, ["body", "title"]),
    ({"model": NUL}, ["body", "model"]),
    ({"system": NUL}, ["body", "system"]),
    ({"system": [{"type": "text", "text": SURROGATE}]}, ["body", "system"]),
    ({"metadata": {NUL: 1}}, ["body", "metadata"]),
    ({"metadata": {"k": NUL}}, ["body", "metadata"]),
    ({"metadata": {"k": [{"x": SURROGATE}]}}, ["body", "metadata"]),
    ({"metadata": {SURROGATE: 1}}, ["body", "metadata"]),
    (
        {"tools": [{"name": "t", "description": NUL, "input_schema": {"type": "object"}}]},
        ["body", "tools", 0, "description"],
    ),
    (
        {"tools": [{"name": "t", "input_schema": {"type": "object", "title": NUL}}]},
        ["body", "tools", 0, "input_schema"],
    ),
    (
        {"tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": NUL}]},
        ["body", "tools", 0],
    ),
    ({"compaction": {SURROGATE: 1}}, ["body", "compaction"]),
]


@pytest.mark.parametrize(("body", "loc"), SESSION_BODIES)
async def test_session_strings_are_checked(
    api: httpx.AsyncClient, body: dict[str, Any], loc: list[str | int]
) -> None:
    assert_names(await post_raw(api, "/sessions", body), *loc)
    sid = await new_session(api)
    assert_names(await post_raw(api, f"/sessions/{sid}", body, "PATCH"), *loc)
    assert (await api.get("/sessions")).json()["data"][0]["title"] is None


TURN_BODIES = [
    ({"content": NUL}, ["body", "content"]),
    ({"content": SURROGATE}, ["body", "content"]),
    ({"content": [{"type": "text", "text": NUL}]}, ["body", "content"]),
]


@pytest.mark.parametrize(("body", "loc"), TURN_BODIES)
async def test_turn_strings_are_checked(
    api: httpx.AsyncClient, body: dict[str, Any], loc: list[str | int]
) -> None:
    sid = await new_session(api)
    assert_names(await post_raw(api, f"/sessions/{sid}/messages", body), *loc)
    assert (await api.get(f"/sessions/{sid}/messages")).json()["data"] == []


async def test_other_bodies_are_checked(api: httpx.AsyncClient) -> None:
    sid = await new_session(api)
    compact = await post_raw(api, f"/sessions/{sid}/compact", {"instructions": NUL})
    assert_names(compact, "body", "instructions")
    run = "00000000-0000-0000-0000-000000000000"
    results = {"results": [{"tool_use_id": "x", "content": NUL}]}
    assert_names(
        await post_raw(api, f"/sessions/{sid}/runs/{run}/tool_results", results),
        "body",
        "results",
        0,
        "content",
    )
    results = {"results": [{"tool_use_id": "x", "content": [image("%%%")]}]}
    assert_names(
        await post_raw(api, f"/sessions/{sid}/runs/{run}/tool_results", results),
        "body",
        "results",
        0,
        "content",
    )
    results = {"results": [{"tool_use_id": SURROGATE}]}
    assert_names(
        await post_raw(api, f"/sessions/{sid}/runs/{run}/tool_results", results),
        "body",
        "results",
        0,
        "tool_use_id",
    )


def cursor(*values: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


BAD_AFTERS = [
    "%00",
    "\u00b2",
    "9" * 5000,
    cursor("0001-01-01T00:00:00", "00000000-0000-0000-0000-000000000000"),
    cursor("0001-01-01T00:00:00+05:00", "00000000-0000-0000-0000-000000000000"),
    cursor("9999-12-31T23:59:59-05:00", "00000000-0000-0000-0000-000000000000"),
    cursor(2**63),
    cursor(2**70),
    cursor(int("9" * 30)),
    cursor(NUL),
]


@pytest.mark.parametrize("after", BAD_AFTERS)
async def test_bad_cursors_are_422(api: httpx.AsyncClient, after: str) -> None:
    sid = await new_session(api)
    for url in (
        "/sessions",
        f"/sessions/{sid}/runs",
        f"/sessions/{sid}/tree",
        f"/sessions/{sid}/messages",
        f"/sessions/{sid}/files",
    ):
        response = await api.get(url, params={"after": after})
        assert response.status_code in (200, 422), (url, response.text)
        if response.status_code == 422:
            assert_names(response, "query", "after")


async def test_bad_query_strings_are_422(api: httpx.AsyncClient) -> None:
    response = await api.post(
        "/sessions/import", params={"title": NUL}, content=b'{"type":"user"}\n'
    )
    assert_names(response, "query", "title")
    response = await api.post(
        "/sessions/import", params={"model": NUL}, content=b'{"type":"user"}\n'
    )
    assert_names(response, "query", "model")


# --- imported transcripts and posted blocks, against the Messages API's shapes -----------

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def line(kind: str, uid: str, parent: str | None, content: Any, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": kind, "content": content}
    message.update(extra.pop("message", {}))
    return {"type": kind, "uuid": uid, "parentUuid": parent, "message": message, **extra}


def image(data: str, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


GOOD_PNG = base64.b64encode(PNG).decode()
BAD_LINES = [
    (
        line("assistant", "a1", "u1", [{"type": "tool_use", "id": 5, "name": None, "input": "s"}]),
        "message.content[0].id",
    ),
    (
        line(
            "assistant", "a1", "u1", [{"type": "tool_use", "id": "t1", "name": None, "input": {}}]
        ),
        "message.content[0].name",
    ),
    (
        line(
            "assistant", "a1", "u1", [{"type": "tool_use", "id": "t1", "name": "n", "input": "s"}]
        ),
        "message.content[0].input",
    ),
    (line("assistant", "a1", "u1", [{"type": "tool_result", "tool_use_id": "x"}]), "type"),
    (line("user", "a1", "u1", [image("not base64!")]), "message.content[0].source.data"),
    (line("user", "a1", "u1", [image(GOOD_PNG, "image/jpeg")]), "message.content[0].source.data"),
    (line("user", "a1", "u1", [image(GOOD_PNG, "image/bmp")]), "source.media_type"),
    (line("user", "a1", "u1", [{"type": "image", "source": "x"}]), "message.content[0].source"),
    (line("user", "a1", "u1", [{"type": "text", "text": NUL}]), "NUL"),
    (line("user", "a1", "u1", [{"type": "text", "text": "x", "k": {SURROGATE: 1}}]), "surrogate"),
    (line("user", "a1\u0000", "u1", "hi"), "uuid"),
    (line("assistant", "a1", "u1", "hi", message={"stop_reason": "x" * 65}), "stop_reason"),
    (line("assistant", "a1", "u1", "hi", message={"model": NUL}), "message.model"),
    (line("user", "a1", "u1", "hi", timestamp="0001-01-01T00:00:00+05:00"), "timestamp"),
    (line("user", "a1", "u1", "hi", timestamp="9999-12-31T23:59:59-05:00"), "timestamp"),
]


@pytest.mark.parametrize(("bad", "field"), BAD_LINES)
async def test_import_checks_every_block(
    api: httpx.AsyncClient, bad: dict[str, Any], field: str
) -> None:
    first = line("user", "u1", None, "hello")
    body = (json.dumps(first) + "\n" + json.dumps(bad) + "\n").encode()
    before = len((await api.get("/sessions")).json()["data"])
    response = await api.post("/sessions/import", content=body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["errors"][0]["loc"] == ["body", "line", 2]
    assert field in problem["detail"], problem["detail"]
    assert len((await api.get("/sessions")).json()["data"]) == before


async def test_import_keeps_valid_images(api: httpx.AsyncClient) -> None:
    lines = [line("user", "u1", None, [image(GOOD_PNG), {"type": "text", "text": "see"}])]
    body = "".join(json.dumps(x) + "\n" for x in lines).encode()
    response = await api.post("/sessions/import", content=body)
    assert response.status_code == 201, response.text


BAD_IMAGES = [
    (image("%%%"), "not valid base64"),
    (image(GOOD_PNG, "image/gif"), "not image/gif"),
    (image(GOOD_PNG, "text/html"), "media_type"),
    (image(base64.b64encode(PNG + b"\x00" * 5 * 1024 * 1024).decode()), "exceeds"),
    ({"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}, "http"),
    (
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": GOOD_PNG},
        },
        "not a PDF",
    ),
]


@pytest.mark.parametrize(("block", "reason"), BAD_IMAGES)
async def test_posted_images_are_checked(
    api: httpx.AsyncClient, block: dict[str, Any], reason: str
) -> None:
    sid = await new_session(api)
    response = await api.post(f"/sessions/{sid}/messages", json={"content": [block]})
    assert_names(response, "body", "content")
    assert reason in response.text


# --- headers ----------------------------------------------------------------------------


async def test_answers_carry_security_headers(api: httpx.AsyncClient) -> None:
    for response in (
        await api.get("/sessions"),
        await api.post("/sessions", json={"title": NUL}),
        await api.get("/nowhere"),
        await api.get("/healthz"),
    ):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["cache-control"] == "no-store"
    page = await api.get("/")
    assert "default-src" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
