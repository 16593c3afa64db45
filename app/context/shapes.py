"""Content blocks checked against the shapes the Messages API accepts, and text checked
for what cannot be stored.

Used where content comes in from outside (a posted turn's image and document blocks,
every block of an imported transcript), so that nothing is stored that the model API
would refuse on every later turn. Each check raises `ShapeError` naming the place
(`content[2].source.data`) and the rule; nothing here changes its input.

The API's limits: an image is at most 5 MB (decoded) of JPEG, PNG, GIF or WebP; a
base64 document is a PDF; tool ids and names match the API's patterns.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

# NUL cannot be stored in a Postgres text or jsonb value, and a lone surrogate (JSON
# allows `"\udfff"`) cannot be encoded as UTF-8 at all.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

MAX_IMAGE_BYTES = 5 * 1024 * 1024
IMAGE_MAGIC: dict[str, tuple[bytes, ...]] = {
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # and b"WEBP" at offset 8
}
TOOL_ID = re.compile(r"[a-zA-Z0-9_-]{1,256}")
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

USER_BLOCKS = frozenset({"text", "image", "document", "tool_result", "search_result"})
ASSISTANT_BLOCKS = frozenset(
    {"text", "tool_use", "thinking", "redacted_thinking", "server_tool_use"}
    # results of the API's own server tools, written into assistant turns
    | {"web_search_tool_result", "web_fetch_tool_result", "code_execution_tool_result"}
)
RESULT_CONTENT_BLOCKS = frozenset({"text", "image", "document", "search_result"})


class ShapeError(ValueError):
    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


def unstorable(text: str) -> str | None:
    """Why `text` cannot be stored, or None when it can."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    return "contains a NUL character" if found.group() == "\x00" else "contains a lone surrogate"


def check_storable(value: Any, where: str) -> None:
    """Every string and key of a JSON value, at any depth, can be stored."""
    if isinstance(value, str):
        if reason := unstorable(value):
            raise ShapeError(where, f"{reason}, which cannot be stored")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and (reason := unstorable(key)):
                raise ShapeError(where, f"a key {reason}, which cannot be stored")
            check_storable(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_storable(item, f"{where}[{i}]")


def _need(block: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = block.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise ShapeError(f"{where}.{key}", f"must be a {kind.__name__}")
    return value


def _decoded(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ShapeError(where, "is not valid base64") from None


def check_image(block: dict[str, Any], where: str) -> None:
    source = _need(block, "source", dict, where)
    where = f"{where}.source"
    kind = source.get("type")
    if kind == "url":
        url = _need(source, "url", str, where)
        if not url.startswith(("https://", "http://")):
            raise ShapeError(f"{where}.url", "must be an http(s) URL")
    elif kind == "file":
        _need(source, "file_id", str, where)
    elif kind == "base64":
        media = source.get("media_type")
        if media not in IMAGE_MAGIC:
            raise ShapeError(f"{where}.media_type", f"must be one of {sorted(IMAGE_MAGIC)}")
        # 4 characters carry 3 bytes: refuse an oversized image before decoding it
        data = _need(source, "data", str, where)
        if len(data) > (MAX_IMAGE_BYTES + 2) // 3 * 4:
            raise ShapeError(f"{where}.data", f"the image exceeds {MAX_IMAGE_BYTES} bytes")
        raw = _decoded(data, f"{where}.data")
        if len(raw) > MAX_IMAGE_BYTES:
            raise ShapeError(f"{where}.data", f"the image exceeds {MAX_IMAGE_BYTES} bytes")
        webp_ok = media != "image/webp" or raw[8:12] == b"WEBP"
        if not raw.startswith(IMAGE_MAGIC[media]) or not webp_ok:
            raise ShapeError(f"{where}.data", f"the image data is not {media}")
    else:
        raise ShapeError(f"{where}.type", "must be base64, url or file")


def check_document(block: dict[str, Any], where: str) -> None:
    source = _need(block, "source", dict, where)
    where = f"{where}.source"
    kind = source.get("type")
    if kind == "base64":
        if source.get("media_type") != "application/pdf":
            raise ShapeError(f"{where}.media_type", "must be application/pdf")
        if not _decoded(_need(source, "data", str, where), f"{where}.data").startswith(b"%PDF"):
            raise ShapeError(f"{where}.data", "the document data is not a PDF")
    elif kind == "text":
        _need(source, "data", str, where)
    elif kind == "url":
        _need(source, "url", str, where)
    elif kind == "file":
        _need(source, "file_id", str, where)
    elif kind == "content":
        content = source.get("content")
        if not isinstance(content, str | list):
            raise ShapeError(f"{where}.content", "must be a string or a list of blocks")
    else:
        raise ShapeError(f"{where}.type", "must be base64, text, url, content or file")


def _check_result(block: dict[str, Any], where: str) -> None:
    use_id = block.get("tool_use_id")
    if not isinstance(use_id, str) or not TOOL_ID.fullmatch(use_id):
        raise ShapeError(f"{where}.tool_use_id", f"must match {TOOL_ID.pattern}")
    if "is_error" in block and not isinstance(block["is_error"], bool):
        raise ShapeError(f"{where}.is_error", "must be a boolean")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ShapeError(f"{where}.content", "must be a string or a list of blocks")
    for i, item in enumerate(content):
        check_block(item, f"{where}.content[{i}]", RESULT_CONTENT_BLOCKS)


def check_block(block: Any, where: str, allowed: frozenset[str]) -> None:
    """One content block of a message whose role allows the `allowed` block types."""
    if not isinstance(block, dict):
        raise ShapeError(where, "must be a content block (an object)")
    kind = block.get("type")
    if kind not in allowed:
        raise ShapeError(f"{where}.type", f"must be one of {sorted(allowed)}")
    if kind == "text":
        _need(block, "text", str, where)
    elif kind == "image":
        check_image(block, where)
    elif kind == "document":
        check_document(block, where)
    elif kind in ("tool_use", "server_tool_use"):
        use_id, name = block.get("id"), block.get("name")
        if not isinstance(use_id, str) or not TOOL_ID.fullmatch(use_id):
            raise ShapeError(f"{where}.id", f"must match {TOOL_ID.pattern}")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise ShapeError(f"{where}.name", f"must match {TOOL_NAME.pattern}")
        _need(block, "input", dict, where)
    elif kind == "tool_result":
        _check_result(block, where)
    elif kind == "thinking":
        _need(block, "thinking", str, where)
        _need(block, "signature", str, where)
    elif kind == "redacted_thinking":
        _need(block, "data", str, where)


def check_content(blocks: list[Any], where: str, role: str) -> None:
    """Every block of a message's content fits the API's shapes and can be stored."""
    allowed = ASSISTANT_BLOCKS if role == "assistant" else USER_BLOCKS
    for i, block in enumerate(blocks):
        check_block(block, f"{where}[{i}]", allowed)
    check_storable(blocks, where)
