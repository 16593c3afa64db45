"""The playground's routes: the page and its assets from memory, with a strict CSP, no
key needed, outside the OpenAPI document. (The page itself is tested in a browser:
tests/browser.)"""

from __future__ import annotations

import re

import httpx

from app.api.playground import ASSETS, WEB_ROOT


async def test_the_page_is_served_with_a_strict_policy(api: httpx.AsyncClient) -> None:
    page = await api.get("/", headers={"Authorization": ""})
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    # No inline script or style: everything comes from /playground/.
    assert "<script>" not in page.text
    assert "<style" not in page.text
    assert " style=" not in page.text
    assert not re.search(r"\son[a-z]+=", page.text), "inline event handlers"


async def test_every_asset_the_page_names_is_served(api: httpx.AsyncClient) -> None:
    page = (await api.get("/")).text
    named = set(re.findall(r'(?:src|href)="(/playground/[^"]+)"', page))
    modules = {f"/playground/{path}" for path in ASSETS if path.endswith(".js")}
    for path in named | modules:
        response = await api.get(path, headers={"Authorization": ""})
        assert response.status_code == 200, path
        assert response.headers["content-security-policy"]
        if path.endswith(".js"):
            assert response.headers["content-type"] == "text/javascript; charset=utf-8"
            # ES modules import each other by relative path, all of them served.
            for imported in re.findall(r'from "\./([\w.]+)"', response.text):
                assert f"js/{imported}" in ASSETS, (path, imported)


async def test_assets_revalidate_by_etag(api: httpx.AsyncClient) -> None:
    first = await api.get("/playground/style.css")
    etag = first.headers["etag"]
    again = await api.get("/playground/style.css", headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.content == b""


async def test_only_the_page_files_are_served(api: httpx.AsyncClient) -> None:
    for path in (
        "/playground/nope.js",
        "/playground/../api/playground.py",
        "/playground/%2e%2e/main.py",
        "/playground/index.html",
    ):
        response = await api.get(path)
        assert response.status_code == 404, path
        assert response.headers["content-type"] == "application/problem+json"
    assert set(ASSETS) == {
        p.relative_to(WEB_ROOT).as_posix() for p in WEB_ROOT.rglob("*") if p.is_file()
    }


async def test_config_tells_the_page_what_the_service_offers(api: httpx.AsyncClient) -> None:
    config = (await api.get("/playground/config.json", headers={"Authorization": ""})).json()
    assert config == {
        "provider": "offline",
        "default_model": "claude-sonnet-5-5",
        "builtin_tools": ["Read", "Write", "Edit", "Glob", "Grep"],
        "key_required": True,
    }


async def test_the_playground_is_not_in_the_openapi_document(api: httpx.AsyncClient) -> None:
    paths = (await api.get("/openapi.json")).json()["paths"]
    assert "/" not in paths
    assert not [p for p in paths if p.startswith("/playground")]
