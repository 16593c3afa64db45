"""The model adapter layer: Anthropic streaming client, offline stand-in, model table,
error classification and retry policy. The agent loop and compaction talk only to
`ModelClient`."""

from .assembler import MessageAssembler
from .client import AnthropicClient, ModelClient, make_model_client
from .errors import ModelError, PromptTooLong, error_from_exception
from .events import (
    MessageDone,
    MessageStart,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolUseReady,
)
from .models import OFFLINE_MODEL, ModelInfo, model_info
from .offline import OfflineModel
from .retry import MAX_RETRY_AFTER_SECONDS, backoff_delay

__all__ = [
    "MAX_RETRY_AFTER_SECONDS",
    "OFFLINE_MODEL",
    "AnthropicClient",
    "MessageAssembler",
    "MessageDone",
    "MessageStart",
    "ModelClient",
    "ModelError",
    "ModelInfo",
    "OfflineModel",
    "PromptTooLong",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolUseReady",
    "backoff_delay",
    "error_from_exception",
    "make_model_client",
    "model_info",
]
