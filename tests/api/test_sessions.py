"""Sessions: create, list (cursor pagination), get, patch (merge patch), delete."""

from __future__ import annotations

import uuid

import httpx

from tests.conftest import OTHER_KEY


async def create(api: httpx.AsyncClient, **body: object) -> dict:
    response = await api.post("/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()


async def test_create_fills_defaults(api: httpx.AsyncClient) -> None:
    session = await create(api, title="t", system="be brief", builtin_tools=["Read", "Grep"])
    assert session["title"] == "t"
    assert session["model"] == "claude-sonnet-5-5"
    assert session["system"] == "be brief"
    assert session["builtin_tools"] == ["Read", "Grep"]
    assert session["status"] == "idle"
    assert session["head_uuid"] is None
    assert session["compaction"] == {
        "auto": True,
        "threshold_tokens": None,
        "context_window": None,
        "keep_recent_tool_results": 5,
        "micro_batch_tokens": 20000,
        "micro": True,
        "collapse_at": 0.9,
    }
    assert session["context"]["context_window"] == 1_000_000
    # 1M window - min(128k output, 20k) - 13k buffer
    assert session["context"]["auto_compact_threshold"] == 967_000
    older = await create(api, model="claude-haiku-4-5-20251001")
    # 200k window - min(64k output, 20k) - 13k buffer
    assert older["context"]["auto_compact_threshold"] == 167_000
    assert session["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    fetched = (await api.get(f"/sessions/{session['id']}")).json()
    assert fetched == session


async def test_threshold_override_and_window(api: httpx.AsyncClient) -> None:
    session = await create(api, compaction={"threshold_tokens": 5000, "context_window": 50_000})
    assert session["context"] == {
        "estimated_tokens": 0,
        "context_window": 50_000,
        "auto_compact_threshold": 5000,
    }


async def test_invalid_bodies_are_422_and_change_nothing(api: httpx.AsyncClient) -> None:
    before = (await api.get("/sessions")).json()["data"]
    cases = [
        {"builtin_tools": ["Bash"]},
        {"max_tokens": 0},
        {
            "thinking": {"type": "enabled", "budget_tokens": 2000},
            "max_tokens": 1500,
            "model": "claude-opus-4-1",
        },
        {"thinking": {"type": "enabled", "budget_tokens": 2000}},  # Claude 5: adaptive only
        {"thinking": {"type": "adaptive", "budget_tokens": 2000}},
        {"thinking": {"type": "enabled"}},
        {"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]},
        {"tools": [{"name": "a", "input_schema": {"type": "object"}}] * 2},
        {
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "builtin_tools": ["Read"],
        },
        {"compaction": {"keep_recent_tool_results": -1}},
        {"compaction": {"unknown": 1}},
        {"nope": True},
        {"system": [{"type": "image"}]},
    ]
    for body in cases:
        response = await api.post("/sessions", json=body)
        assert response.status_code == 422, (body, response.text)
        problem = response.json()
        assert response.headers["content-type"] == "application/problem+json"
        assert problem["type"] == "invalid_request"
        assert problem["status"] == 422
        assert "errors" in problem or problem["detail"]
    assert (await api.get("/sessions")).json()["data"] == before


async def test_unparseable_body_is_400(api: httpx.AsyncClient) -> None:
    response = await api.post(
        "/sessions", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["type"] == "invalid_request"


async def test_list_is_newest_first_with_cursor(api: httpx.AsyncClient) -> None:
    ids = [(await create(api, title=f"s{i}"))["id"] for i in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"after": cursor} if cursor else {})}
        page = (await api.get("/sessions", params=params)).json()
        seen += [s["id"] for s in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen[:5] == list(reversed(ids))
    bad = await api.get("/sessions", params={"after": "garbage!"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["loc"] == ["query", "after"]
    assert (await api.get("/sessions", params={"limit": 501})).status_code == 422


async def test_patch_merges_metadata_and_compaction(api: httpx.AsyncClient) -> None:
    session = await create(
        api, metadata={"a": 1, "b": {"c": 2, "d": 3}}, compaction={"micro": False}
    )
    response = await api.patch(
        f"/sessions/{session['id']}",
        json={
            "title": "new",
            "metadata": {"b": {"c": None, "e": 4}, "f": 5},
            "compaction": {"threshold_tokens": 9000},
        },
    )
    assert response.status_code == 200, response.text
    patched = response.json()
    assert patched["title"] == "new"
    assert patched["metadata"] == {"a": 1, "b": {"d": 3, "e": 4}, "f": 5}
    assert patched["compaction"]["micro"] is False
    assert patched["compaction"]["threshold_tokens"] == 9000
    bad = await api.patch(f"/sessions/{session['id']}", json={"compaction": {"collapse_at": 2}})
    assert bad.status_code == 422
    assert (await api.get(f"/sessions/{session['id']}")).json()["compaction"]["collapse_at"] == 0.9


async def test_delete_removes_everything(api: httpx.AsyncClient) -> None:
    session = await create(api)
    sid = session["id"]
    assert (await api.put(f"/sessions/{sid}/files/a.txt", content=b"x")).status_code == 201
    assert (await api.delete(f"/sessions/{sid}")).status_code == 204
    assert (await api.get(f"/sessions/{sid}")).status_code == 404
    assert (await api.get(f"/sessions/{sid}/files")).status_code == 404
    assert (await api.delete(f"/sessions/{sid}")).status_code == 404


async def test_other_tenant_sees_404(api: httpx.AsyncClient) -> None:
    session = await create(api)
    other = {"Authorization": f"Bearer {OTHER_KEY}"}
    for method, path in [
        ("GET", f"/sessions/{session['id']}"),
        ("PATCH", f"/sessions/{session['id']}"),
        ("DELETE", f"/sessions/{session['id']}"),
        ("GET", f"/sessions/{session['id']}/messages"),
    ]:
        response = await api.request(
            method, path, headers=other, json={} if method == "PATCH" else None
        )
        assert response.status_code == 404, (method, path)
        assert response.json()["type"] == "not_found"
    assert (await api.get("/sessions", headers=other)).json()["data"] == []
    assert (await api.get(f"/sessions/{uuid.uuid4()}")).status_code == 404
