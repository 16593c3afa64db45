"""`.env.example` lists every setting, and the listed defaults are the real ones.

The real defaults are those of `Settings` read from an empty environment: variables the
settings read (PARLEY_*, DATABASE_URL, ANTHROPIC_*) are removed for these tests, so a
value set in the developer's or CI's environment can neither hide a wrong default in the
file nor stand in for a missing one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings

EXAMPLE = Path(__file__).resolve().parents[1] / ".env.example"
SETTINGS_PREFIXES = ("PARLEY_", "ANTHROPIC_")
SETTINGS_NAMES = {"DATABASE_URL"}


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every variable `Settings` could read (names are matched case-insensitively)."""
    for name in list(os.environ):
        upper = name.upper()
        if upper.startswith(SETTINGS_PREFIXES) or upper in SETTINGS_NAMES:
            monkeypatch.delenv(name)


def listed_lines() -> list[tuple[str, str]]:
    pairs = []
    for line in EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs.append((key.strip(), value.strip()))
    return pairs


def setting_env_name(field: str) -> str:
    info = Settings.model_fields[field]
    alias = info.validation_alias
    if alias is not None:
        return str(alias.choices[0])  # type: ignore[union-attr]
    return f"PARLEY_{field.upper()}"


def test_every_setting_is_listed_once() -> None:
    names = [key for key, _ in listed_lines()]
    assert sorted({n for n in names if names.count(n) > 1}) == [], "listed more than once"
    expected = {setting_env_name(field) for field in Settings.model_fields}
    assert sorted(expected - set(names)) == [], "settings missing from .env.example"
    assert sorted(set(names) - expected) == [], ".env.example lists unknown settings"


@pytest.mark.usefixtures("clean_environment")
def test_listed_values_are_the_real_defaults() -> None:
    defaults: dict[str, Any] = Settings(_env_file=None).model_dump()
    from_file: dict[str, Any] = Settings(_env_file=str(EXAMPLE)).model_dump()
    listed = dict(listed_lines())
    wrong = {
        setting_env_name(field): {"listed": listed.get(setting_env_name(field)), "real": value}
        for field, value in defaults.items()
        if from_file[field] != value
    }
    assert wrong == {}, ".env.example states defaults that are not the real ones"


@pytest.mark.usefixtures("clean_environment")
def test_every_setting_has_a_default() -> None:
    # An empty environment starts: nothing listed as optional is actually required.
    Settings(_env_file=None)
