"""What the service needs to know about each model: context window, output limit, thinking.

Compaction thresholds and `max_tokens` defaults are computed from these numbers, so an
unknown model id gets conservative values (a 200k window, 8,192 output tokens, no
thinking) rather than an error: a new model id must never break a running service.
Figures are Anthropic's published ones (platform.claude.com model pages, November
2026). Models from Claude 4.7 on use a newer tokenizer that counts about 30% more tokens
for the same text (`tokens_per_char_factor`), and models from Claude 5 on think
adaptively only: a manual `{"type": "enabled", "budget_tokens": N}` is refused there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_MODEL_INFO", "OFFLINE_MODEL", "ModelInfo", "is_known_model", "model_info"]

OFFLINE_MODEL: Final = "parley-offline"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Limits of one model; `name` is the canonical id the lookup resolved to."""

    name: str
    context_window: int
    max_output_tokens: int
    supports_thinking: bool
    # "extended" (budget_tokens), "adaptive" (the model decides), or both
    thinking_modes: frozenset[str] = frozenset({"extended"})
    # How many more tokens than the calibration tokenizer the same text takes.
    tokens_per_char_factor: float = 1.0


_ADAPTIVE = frozenset({"adaptive"})
_BOTH = frozenset({"extended", "adaptive"})
_NEW_TOKENIZER = 1.3


_TABLE: Final[dict[str, ModelInfo]] = {
    info.name: info
    for info in (
        # The current lineup (1M context, 128K output, adaptive thinking, new tokenizer).
        ModelInfo("claude-fable-5-2", 1_000_000, 128_000, True, _ADAPTIVE, _NEW_TOKENIZER),
        ModelInfo("claude-fable-5-1", 1_000_000, 128_000, True, _ADAPTIVE, _NEW_TOKENIZER),
        ModelInfo("claude-fable-5", 1_000_000, 128_000, True, _ADAPTIVE, _NEW_TOKENIZER),
        ModelInfo("claude-opus-5-5", 1_000_000, 128_000, True, _ADAPTIVE, _NEW_TOKENIZER),
        ModelInfo("claude-sonnet-5-5", 1_000_000, 128_000, True, _ADAPTIVE, _NEW_TOKENIZER),
        ModelInfo("claude-haiku-5-5", 1_000_000, 128_000, True, _ADAPTIVE, _NEW_TOKENIZER),
        ModelInfo("claude-opus-5", 1_000_000, 128_000, True, _ADAPTIVE, _NEW_TOKENIZER),
        ModelInfo("claude-sonnet-5", 1_000_000, 128_000, True, _ADAPTIVE, _NEW_TOKENIZER),
        # Legacy models still served.
        ModelInfo("claude-opus-4-8", 1_000_000, 128_000, True, _BOTH, _NEW_TOKENIZER),
        ModelInfo("claude-opus-4-7", 1_000_000, 128_000, True, _BOTH, _NEW_TOKENIZER),
        ModelInfo("claude-opus-4-6", 1_000_000, 128_000, True, _BOTH),
        ModelInfo("claude-sonnet-4-6", 1_000_000, 64_000, True, _BOTH),
        ModelInfo("claude-opus-4-5", 200_000, 64_000, True),
        ModelInfo("claude-sonnet-4-5", 200_000, 64_000, True),
        ModelInfo("claude-haiku-4-5", 200_000, 64_000, True),
        ModelInfo("claude-opus-4-1", 200_000, 32_000, True),
        ModelInfo("claude-opus-4", 200_000, 32_000, True),
        ModelInfo("claude-sonnet-4", 200_000, 64_000, True),
        # 64k by default; 128k only with the output-128k beta header.
        ModelInfo("claude-3-7-sonnet", 200_000, 64_000, True),
        ModelInfo("claude-3-5-haiku", 200_000, 8_192, False),
        ModelInfo("claude-3-5-sonnet", 200_000, 8_192, False),
        ModelInfo("claude-3-opus", 200_000, 4_096, False),
        ModelInfo("claude-3-haiku", 200_000, 4_096, False),
        ModelInfo(OFFLINE_MODEL, 200_000, 64_000, True),
    )
}

# Aliases that are not "<canonical>-<date>" or "<canonical>-latest".
_ALIASES: Final[dict[str, str]] = {
    "claude-opus-4-0": "claude-opus-4",
    "claude-sonnet-4-0": "claude-sonnet-4",
    "claude-4-opus": "claude-opus-4",
    "claude-4-sonnet": "claude-sonnet-4",
}

# Suffixes a snapshot or a cloud-provider id adds to a canonical name:
# "-20250929" (dated snapshot), "-latest", Vertex "@20250929", Bedrock "-v1:0".
_SUFFIX: Final = re.compile(r"(?:-v\d+(?::\d+)?|@\d{8}|-\d{8}|-latest)$")

DEFAULT_MODEL_INFO: Final = ModelInfo("unknown", 200_000, 8_192, False, frozenset())


def _canonical(name: str) -> str:
    key = name.strip().lower()
    # Bedrock ids carry a provider (and region) prefix: "us.anthropic.claude-...".
    _, sep, rest = key.rpartition("anthropic.")
    if sep:
        key = rest
    while True:
        stripped = _SUFFIX.sub("", key)
        if stripped == key:
            break
        key = stripped
    return _ALIASES.get(key, key)


def model_info(name: str) -> ModelInfo:
    """Limits for `name` (alias, dated snapshot or provider id); safe defaults if unknown.

    Only known suffixes and a Bedrock provider prefix are stripped; names are never
    matched by prefix, so a newer model such as "claude-opus-4-6" is not mistaken for
    "claude-opus-4".
    """
    info = _TABLE.get(_canonical(name))
    if info is None:
        d = DEFAULT_MODEL_INFO
        return ModelInfo(
            name, d.context_window, d.max_output_tokens, d.supports_thinking, d.thinking_modes
        )
    return info


def is_known_model(name: str) -> bool:
    """Whether `name` resolves to a table entry (else `model_info` returned defaults)."""
    return _canonical(name) in _TABLE
