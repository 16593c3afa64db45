"""model_info: the table, alias and snapshot resolution, and safe defaults."""

from __future__ import annotations

import pytest

from app.context.models import OFFLINE_MODEL, is_known_model, model_info


@pytest.mark.parametrize(
    ("name", "canonical", "max_output", "thinking"),
    [
        ("claude-opus-4-5", "claude-opus-4-5", 64_000, True),
        ("claude-sonnet-4-5", "claude-sonnet-4-5", 64_000, True),
        ("claude-haiku-4-5", "claude-haiku-4-5", 64_000, True),
        ("claude-opus-4-1", "claude-opus-4-1", 32_000, True),
        ("claude-opus-4", "claude-opus-4", 32_000, True),
        ("claude-sonnet-4", "claude-sonnet-4", 64_000, True),
        ("claude-3-7-sonnet", "claude-3-7-sonnet", 64_000, True),
        ("claude-3-5-haiku", "claude-3-5-haiku", 8_192, False),
        # dated snapshots, -latest aliases, -0 aliases and cloud-provider ids
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5", 64_000, True),
        ("claude-opus-4-5-20251101", "claude-opus-4-5", 64_000, True),
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5", 64_000, True),
        ("claude-opus-4-1-20250805", "claude-opus-4-1", 32_000, True),
        ("claude-opus-4-20250514", "claude-opus-4", 32_000, True),
        ("claude-sonnet-4-20250514", "claude-sonnet-4", 64_000, True),
        ("claude-opus-4-0", "claude-opus-4", 32_000, True),
        ("claude-sonnet-4-0", "claude-sonnet-4", 64_000, True),
        ("claude-3-7-sonnet-latest", "claude-3-7-sonnet", 64_000, True),
        ("claude-3-7-sonnet-20250219", "claude-3-7-sonnet", 64_000, True),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku", 8_192, False),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku", 8_192, False),
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5", 64_000, True),
        ("us.anthropic.claude-opus-4-1-20250805-v1:0", "claude-opus-4-1", 32_000, True),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5", 64_000, True),
        ("Claude-Sonnet-4-5", "claude-sonnet-4-5", 64_000, True),
    ],
)
def test_known_models_resolve(name: str, canonical: str, max_output: int, thinking: bool) -> None:
    info = model_info(name)
    assert info.name == canonical
    assert info.context_window == 200_000
    assert info.max_output_tokens == max_output
    assert info.supports_thinking is thinking
    assert is_known_model(name)


@pytest.mark.parametrize(
    "name",
    ["gpt-4o", "", "claude-opus-4-66", "claude-sonnet-4-55", "claude-opus-4-5-turbo", "claude-9"],
)
def test_unknown_models_get_safe_defaults_and_never_raise(name: str) -> None:
    info = model_info(name)
    assert (info.context_window, info.max_output_tokens, info.supports_thinking) == (
        200_000,
        8_192,
        False,
    )
    assert info.name == name
    assert not is_known_model(name)


def test_newer_minor_version_is_not_taken_for_an_older_model() -> None:
    # "claude-opus-4-9" must not resolve to claude-opus-4 by prefix.
    assert model_info("claude-opus-4-9").max_output_tokens == 8_192
    assert model_info("claude-opus-4-6").context_window == 1_000_000


def test_current_lineup_is_known() -> None:
    for name in ("claude-sonnet-5-5", "claude-opus-5-5", "claude-haiku-5-5", "claude-fable-5-2"):
        info = model_info(name)
        assert (info.context_window, info.max_output_tokens) == (1_000_000, 128_000)
        assert info.thinking_modes == frozenset({"adaptive"})
        assert info.tokens_per_char_factor > 1


def test_offline_model_has_its_own_entry() -> None:
    info = model_info(OFFLINE_MODEL)
    assert info.name == "parley-offline"
    assert info.supports_thinking
    assert info.context_window == 200_000
