"""The token limits of a session: its window, the output reserve and the thresholds."""

from __future__ import annotations

from dataclasses import dataclass

from app.context.models import model_info
from app.context.session import CompactionConfig, SessionConfig

AUTOCOMPACT_BUFFER_TOKENS = 13_000
SUMMARY_OUTPUT_RESERVE = 20_000
WARNING_BUFFER_TOKENS = 20_000
DEFAULT_MAX_TOKENS_CAP = 16_000


def default_max_tokens(model: str) -> int:
    return min(model_info(model).max_output_tokens, DEFAULT_MAX_TOKENS_CAP)


def max_tokens_of(config: SessionConfig) -> int:
    return config.max_tokens or default_max_tokens(config.model)


@dataclass(frozen=True, slots=True)
class Limits:
    context_window: int
    max_output_tokens: int
    auto_compact_threshold: int
    warning_threshold: int
    compaction: CompactionConfig

    @classmethod
    def of(cls, config: SessionConfig) -> Limits:
        """`window - min(max output, 20k) - 13k` unless the session sets a threshold."""
        info = model_info(config.model)
        compaction = config.compaction
        window = compaction.context_window or info.context_window
        computed = window - min(info.max_output_tokens, SUMMARY_OUTPUT_RESERVE)
        # A tiny window (tests, odd gateways) still gets a positive threshold.
        computed = max(computed - AUTOCOMPACT_BUFFER_TOKENS, window // 2)
        threshold = compaction.threshold_tokens or computed
        return cls(
            context_window=window,
            max_output_tokens=info.max_output_tokens,
            auto_compact_threshold=threshold,
            warning_threshold=max(threshold - WARNING_BUFFER_TOKENS, 0),
            compaction=compaction,
        )
