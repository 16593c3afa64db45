"""The playground: Parley's reference web client, served at GET / (not part of the OpenAPI
document).

The page is static files in `app/web/` (HTML, CSS and ES modules, no build step), read
once at import and served from memory under `/playground/`; `GET /playground/config.json`
tells the page what this service offers. Every answer carries a strict
Content-Security-Policy: only this origin's scripts, styles and connections.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.api.deps import RuntimeDep
from app.context.tools import BuiltinTool
from app.errors import NotFound

router = APIRouter(tags=["playground"], include_in_schema=False)

WEB_ROOT = Path(__file__).resolve().parents[1] / "web"
ASSET_PREFIX = "/playground/"
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def _load(root: Path) -> dict[str, Asset]:
    """Every file under `root` by its relative path: the only paths ever served."""
    assets: dict[str, Asset] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        body = path.read_bytes()
        media_type = MEDIA_TYPES.get(path.suffix) or (
            mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        )
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        assets[path.relative_to(root).as_posix()] = Asset(body, media_type, etag)
    return assets


ASSETS = _load(WEB_ROOT)


def _serve(asset: Asset, request: Request) -> Response:
    headers = {**SECURITY_HEADERS, "ETag": asset.etag}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


@router.get("/", summary="Open the playground")
async def playground(request: Request) -> Response:
    """The playground page."""
    return _serve(ASSETS["index.html"], request)


@router.get(ASSET_PREFIX + "config.json", summary="Playground settings")
async def playground_config(runtime: RuntimeDep) -> JSONResponse:
    """What the page needs to know about this service (no secrets): the model provider
    and default model, the built-in tools, whether an API key is required."""
    settings = runtime.settings
    body = {
        "provider": settings.provider,
        "default_model": settings.model,
        "builtin_tools": [tool.value for tool in BuiltinTool],
        "key_required": not runtime.open_mode,
    }
    return JSONResponse(body, headers=SECURITY_HEADERS)


@router.get(ASSET_PREFIX + "{path:path}", summary="Playground assets")
async def playground_asset(path: str, request: Request) -> Response:
    """A static file of the page (scripts, styles, icons)."""
    asset = ASSETS.get(path)
    if asset is None or path == "index.html":
        raise NotFound(f"No playground asset {path!r}")
    return _serve(asset, request)
