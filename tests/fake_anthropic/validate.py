"""Request validation with the real API's 400 wording (from the SDK's fixtures and real answers).

Indices in messages count messages after consecutive same-role messages are merged, as the
real API does. Where the real wording is unknown, the message is a plausible one in the same
style.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from typing import Any

from .tokens import merge_messages, normalize_content

__all__ = [
    "ApiError",
    "sign_thinking",
    "validate_messages_request",
    "verify_thinking_signature",
]

SIGNING_SECRET = b"parley-fake-anthropic-thinking-v1"
TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"

TOP_LEVEL_KEYS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "stream",
        "stop_sequences",
        "metadata",
        "temperature",
        "top_p",
        "top_k",
        "cache_control",
        "container",
        "context_management",
        "diagnostics",
        "inference_geo",
        "mcp_servers",
        "output_config",
        "output_format",
        "service_tier",
        "speed",
        "prefill",
        "user_profile_id",
        "workspace_id",
        # beta endpoint fields
        "billing_policy",
        "compaction",
        "fallback_credit_token",
        "fallbacks",
        "thread",
    }
)
CUSTOM_TOOL_KEYS = frozenset(
    {
        "name",
        "description",
        "input_schema",
        "cache_control",
        "type",
        "strict",
        "allowed_callers",
        "defer_loading",
        "eager_input_streaming",
        "input_examples",
    }
)
USER_ONLY_BLOCKS = frozenset({"tool_result"})
ASSISTANT_ONLY_BLOCKS = frozenset({"tool_use", "thinking", "redacted_thinking", "server_tool_use"})


class ApiError(Exception):
    """An error answer of the API: HTTP status, error type, message, extra headers/details."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = headers or {}
        self.details = details

    def error_object(self) -> dict[str, Any]:
        err: dict[str, Any] = {"type": self.error_type, "message": self.message}
        if self.details is not None:
            err["details"] = self.details
        return err


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


def sign_thinking(thinking: str) -> str:
    """The fake's signature of a thinking text: base64 of an HMAC-SHA256 with a fixed key."""
    mac = hmac.new(SIGNING_SECRET, thinking.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(b"FAKE" + mac).decode("ascii")


def verify_thinking_signature(thinking: str, signature: str) -> bool:
    return hmac.compare_digest(sign_thinking(thinking), signature)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_cache_control(cc: Any, where: str) -> int:
    if cc is None:
        return 0
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise _bad(f"{where}.cache_control.type: Input should be 'ephemeral'")
    ttl = cc.get("ttl")
    if ttl is not None and ttl not in ("5m", "1h"):
        raise _bad(f"{where}.cache_control.ephemeral.ttl: Input should be '5m' or '1h'")
    return 1


def _check_text(block: dict[str, Any], where: str, prefix: str) -> None:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}.text: Input should be a valid string")
    if text == "":
        raise _bad(f"{prefix}: text content blocks must be non-empty")
    if not text.strip():
        raise _bad(f"{prefix}: text content blocks must contain non-whitespace text")


# The first bytes of each image type the API takes.
IMAGE_MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}


def _check_image(block: dict[str, Any], where: str) -> None:
    """A base64 image must decode and be of its declared media type (the API looks)."""
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        return  # url and file sources are fetched by the API; not modelled here
    media_type = source.get("media_type")
    if media_type not in IMAGE_MAGIC:
        raise _bad(
            f"{where}.image.source.base64.media_type: Input should be 'image/jpeg', "
            "'image/png', 'image/gif' or 'image/webp'"
        )
    try:
        data = base64.b64decode(str(source.get("data", "")), validate=True)
    except ValueError:
        data = b""
    if not data.startswith(IMAGE_MAGIC[media_type]):
        subtype = media_type.split("/")[1]
        raise _bad(
            f"{where}.image.source.base64: The image was specified using the {media_type} "
            f"media type, but does not appear to be a valid {subtype} image"
        )


def _validate_tools(tools: Any) -> int:
    if not isinstance(tools, list):
        raise _bad("tools: Input should be a valid list")
    seen: set[str] = set()
    count = 0
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _bad(f"tools.{i}: Input should be a valid dictionary")
        kind = tool.get("type")
        name = tool.get("name")
        if kind in (None, "custom"):
            where = f"tools.{i}.custom"
            for key in tool:
                if key not in CUSTOM_TOOL_KEYS:
                    raise _bad(f"{where}.{key}: Extra inputs are not permitted")
            if name is None:
                raise _bad(f"{where}.name: Field required")
            if not isinstance(name, str) or not TOOL_NAME_RE.match(name):
                raise _bad(f"{where}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
            schema = tool.get("input_schema")
            if schema is None:
                raise _bad(f"{where}.input_schema: Field required")
            if not isinstance(schema, dict):
                raise _bad(f"{where}.input_schema: Input should be a valid dictionary")
            if schema.get("type") != "object":
                raise _bad(f"{where}.input_schema.type: Input should be 'object'")
            if "description" in tool and not isinstance(tool["description"], str):
                raise _bad(f"{where}.description: Input should be a valid string")
            count += _check_cache_control(tool.get("cache_control"), f"tools.{i}")
        else:
            if not isinstance(kind, str):
                raise _bad(f"tools.{i}.type: Input should be a valid string")
            if not isinstance(name, str) or not name:
                raise _bad(f"tools.{i}.{kind}.name: Field required")
            count += _check_cache_control(tool.get("cache_control"), f"tools.{i}")
        if name in seen:
            raise _bad("tools: Tool names must be unique.")
        seen.add(name)
    return count


def _validate_system(system: Any) -> int:
    if isinstance(system, str):
        return 0
    if not isinstance(system, list):
        raise _bad("system: Input should be a valid string or a valid list")
    count = 0
    for i, block in enumerate(system):
        where = f"system.{i}"
        if not isinstance(block, dict):
            raise _bad(f"{where}: Input should be a valid dictionary")
        if block.get("type") != "text":
            raise _bad(f"{where}.type: Input should be 'text'")
        _check_text(block, where, "system")
        count += _check_cache_control(block.get("cache_control"), where)
    return count


def _validate_thinking_config(thinking: Any, max_tokens: Any) -> bool:
    """Returns whether thinking is on (enabled or adaptive)."""
    if thinking is None:
        return False
    if not isinstance(thinking, dict):
        raise _bad("thinking: Input should be a valid dictionary")
    kind = thinking.get("type")
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if budget is None:
            raise _bad("thinking.enabled.budget_tokens: Field required")
        if not _is_int(budget):
            raise _bad("thinking.enabled.budget_tokens: Input should be a valid integer")
        if budget < 1024:
            raise _bad(
                "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
            )
        if _is_int(max_tokens) and max_tokens <= budget:
            raise _bad(
                "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
                f"documentation at {THINKING_DOCS}#max-tokens-and-context-window-size"
            )
        return True
    if kind == "adaptive":
        return True
    if kind == "disabled":
        return False
    raise _bad(
        f"thinking: Input tag '{kind}' found using 'type' does not match any of the expected "
        "tags: 'enabled', 'disabled', 'adaptive'"
    )


def _validate_message_shapes(messages: Any) -> None:
    """Per-message structure, before merging (indices are the request's own)."""
    if not isinstance(messages, list):
        raise _bad("messages: Input should be a valid list")
    if not messages:
        raise _bad("messages: List should have at least 1 item after validation, not 0")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"messages.{i}: Input should be a valid dictionary")
        if "role" not in message:
            raise _bad(f"messages.{i}.role: Field required")
        if message["role"] not in ("user", "assistant"):
            raise _bad(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if "content" not in message:
            raise _bad(f"messages.{i}.content: Field required")
        for key in message:
            if key not in ("role", "content"):
                raise _bad(f"messages.{i}.{key}: Extra inputs are not permitted")
        content = message["content"]
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise _bad(f"messages.{i}.content: Input should be a valid string or a valid list")
        for j, block in enumerate(content):
            if not isinstance(block, dict):
                raise _bad(f"messages.{i}.content.{j}: Input should be a valid dictionary")
            if not isinstance(block.get("type"), str):
                raise _bad(f"messages.{i}.content.{j}.type: Field required")


def _validate_blocks(merged: list[tuple[str, list[Any]]]) -> int:
    """Content rules on merged messages; returns the number of cache_control breakpoints."""
    count = 0
    last = len(merged) - 1
    for i, (role, content) in enumerate(merged):
        if not content and not (i == last and role == "assistant"):
            raise _bad(
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        for j, block in enumerate(content):
            where = f"messages.{i}.content.{j}"
            kind = block["type"]
            if role == "assistant" and kind in USER_ONLY_BLOCKS:
                raise _bad(f"{where}: `{kind}` blocks can only be in `user` messages")
            if role == "user" and kind in ASSISTANT_ONLY_BLOCKS:
                raise _bad(f"{where}: `{kind}` blocks can only be in `assistant` messages")
            if kind == "text":
                _check_text(block, where, "messages")
            elif kind == "tool_use":
                if not isinstance(block.get("id"), str) or not block["id"]:
                    raise _bad(f"{where}.tool_use.id: Field required")
                if not isinstance(block.get("name"), str) or not block["name"]:
                    raise _bad(f"{where}.tool_use.name: Field required")
                if not isinstance(block.get("input"), dict):
                    raise _bad(f"{where}.tool_use.input: Input should be a valid dictionary")
            elif kind == "tool_result":
                if not isinstance(block.get("tool_use_id"), str):
                    raise _bad(f"{where}.tool_result.tool_use_id: Field required")
                nested = block.get("content")
                if isinstance(nested, list):
                    for k, item in enumerate(nested):
                        item_where = f"{where}.tool_result.content.{k}"
                        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
                            raise _bad(f"{item_where}.type: Field required")
                        if item["type"] == "text":
                            _check_text(item, item_where, "messages")
                        count += _check_cache_control(item.get("cache_control"), item_where)
                elif nested is not None and not isinstance(nested, str):
                    raise _bad(
                        f"{where}.tool_result.content: "
                        "Input should be a valid string or a valid list"
                    )
            elif kind == "thinking":
                if not isinstance(block.get("thinking"), str):
                    raise _bad(f"{where}.thinking.thinking: Field required")
                if not isinstance(block.get("signature"), str):
                    raise _bad(f"{where}.thinking.signature: Field required")
            elif kind == "redacted_thinking" and not isinstance(block.get("data"), str):
                raise _bad(f"{where}.redacted_thinking.data: Field required")
            elif kind == "image":
                _check_image(block, where)
            count += _check_cache_control(block.get("cache_control"), where)
    return count


def _validate_tool_pairing(merged: list[tuple[str, list[Any]]]) -> None:
    seen_ids: set[str] = set()
    last = len(merged) - 1
    for i, (role, content) in enumerate(merged):
        if role == "assistant":
            for j, block in enumerate(content):
                if block["type"] == "tool_use":
                    if block["id"] in seen_ids:
                        raise _bad(f"messages.{i}.content.{j}: `tool_use` ids must be unique")
                    seen_ids.add(block["id"])
            uses = [b["id"] for b in content if b["type"] == "tool_use"]
            if uses and i != last:
                nxt_role, nxt = merged[i + 1]
                answered = (
                    {b["tool_use_id"] for b in nxt if b["type"] == "tool_result"}
                    if nxt_role == "user"
                    else set()
                )
                missing = [u for u in uses if u not in answered]
                if missing:
                    raise _bad(
                        f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                        f"immediately after: {', '.join(missing)}. Each `tool_use` block must "
                        "have a corresponding `tool_result` block in the next message."
                    )
            continue
        # user message
        results = [(j, b) for j, b in enumerate(content) if b["type"] == "tool_result"]
        if not results:
            continue
        prev = merged[i - 1] if i > 0 else None
        prev_uses = (
            [b["id"] for b in prev[1] if b["type"] == "tool_use"]
            if prev is not None and prev[0] == "assistant"
            else []
        )
        orphans = [(j, b["tool_use_id"]) for j, b in results if b["tool_use_id"] not in prev_uses]
        if orphans:
            ids = ", ".join(dict.fromkeys(t for _, t in orphans))
            raise _bad(
                f"messages.{i}.content.{orphans[0][0]}: unexpected `tool_use_id` found in "
                f"`tool_result` blocks: {ids}. Each `tool_result` block must have a "
                "corresponding `tool_use` block in the previous message."
            )
        answered_ids: set[str] = set()
        for j, b in results:
            if b["tool_use_id"] in answered_ids:
                raise _bad(
                    f"messages.{i}.content.{j}: each `tool_use` must have a single result. "
                    f"Found multiple `tool_result` blocks with id: {b['tool_use_id']}"
                )
            answered_ids.add(b["tool_use_id"])
        if any(b["type"] != "tool_result" for b in content[: len(results)]):
            raise _bad(
                f"messages.{i}: Did not find {len(prev_uses)} `tool_result` block(s) at the "
                "beginning of this message. Messages following `tool_use` blocks must begin "
                "with a matching number of `tool_result` blocks."
            )


def _validate_thinking_blocks(merged: list[tuple[str, list[Any]]], thinking_on: bool) -> None:
    last = len(merged) - 1
    for i, (role, content) in enumerate(merged):
        if role != "assistant":
            continue
        for j, block in enumerate(content):
            if block["type"] == "thinking" and not verify_thinking_signature(
                block["thinking"], block["signature"]
            ):
                raise _bad(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
        if i == last and content:
            if not thinking_on:
                for j, block in enumerate(content):
                    if block["type"] in ("thinking", "redacted_thinking"):
                        raise _bad(
                            f"messages.{i}.content.{j}: When thinking is disabled, an "
                            "`assistant` message in the final position cannot contain "
                            "`thinking`. To use thinking blocks, enable `thinking` in your "
                            "request."
                        )
            if content[-1]["type"] in ("thinking", "redacted_thinking"):
                raise _bad(
                    f"messages.{i}: The final block in an assistant message cannot be `thinking`."
                )
            final = content[-1]
            if final["type"] == "text" and final["text"] != final["text"].rstrip():
                raise _bad("messages: final assistant content cannot end with trailing whitespace")
    # With thinking on, in a tool loop the last assistant turn must start with thinking.
    in_tool_loop = merged[-1][0] == "user" and any(
        b["type"] == "tool_result" for b in merged[-1][1]
    )
    if thinking_on and in_tool_loop and len(merged) >= 2:
        i = len(merged) - 2
        first = merged[i][1][0] if merged[i][1] else None
        if first is not None and first["type"] not in ("thinking", "redacted_thinking"):
            raise _bad(
                f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                f"but found `{first['type']}`. When `thinking` is enabled, a final "
                "`assistant` message must start with a thinking block (preceeding the "
                "lastmost set of `tool_use` and `tool_result` blocks). We recommend you "
                "include thinking blocks from previous turns. To avoid this requirement, "
                f"disable `thinking`. Please consult our documentation at {THINKING_DOCS}"
            )


def validate_messages_request(
    body: Any, *, count_tokens_route: bool = False
) -> list[tuple[str, list[Any]]]:
    """Raises ApiError for an invalid request body; returns the merged messages.

    The prompt-length check is the caller's (it needs the token count and configuration).
    """
    if not isinstance(body, dict):
        raise _bad("Input should be a valid dictionary")
    if "model" not in body:
        raise _bad("model: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise _bad("model: Input should be a valid string")
    if "messages" not in body:
        raise _bad("messages: Field required")
    max_tokens = body.get("max_tokens")
    if not count_tokens_route:
        if "max_tokens" not in body:
            raise _bad("max_tokens: Field required")
        if not _is_int(max_tokens):
            raise _bad("max_tokens: Input should be a valid integer")
        if max_tokens < 0:
            raise _bad("max_tokens: Input should be greater than or equal to 0")
    for key in body:
        if key not in TOP_LEVEL_KEYS or (count_tokens_route and key in ("max_tokens", "stream")):
            raise _bad(f"{key}: Extra inputs are not permitted")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _bad("stream: Input should be a valid boolean")

    cache_controls = 0
    if body.get("tools") is not None:
        cache_controls += _validate_tools(body["tools"])
    if body.get("system") is not None:
        cache_controls += _validate_system(body["system"])
    messages = body["messages"]
    _validate_message_shapes(messages)
    if messages[0]["role"] != "user":
        raise _bad('messages: first message must use the "user" role')
    merged = merge_messages(messages)
    for i, (_role, content) in enumerate(merged):
        merged[i] = (_role, normalize_content(content))
    cache_controls += _validate_blocks(merged)
    if body.get("cache_control") is not None:
        cache_controls += _check_cache_control(body["cache_control"], "cache_control")
    if cache_controls > 4:
        raise _bad(
            f"A maximum of 4 blocks with cache_control may be provided. Found {cache_controls}."
        )
    thinking_on = _validate_thinking_config(body.get("thinking"), max_tokens)
    _validate_tool_pairing(merged)
    _validate_thinking_blocks(merged, thinking_on)
    return merged
