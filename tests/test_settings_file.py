"""`.env.example` lists every setting, and the listed defaults are the real ones."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings

EXAMPLE = Path(__file__).resolve().parents[1] / ".env.example"


def env_names() -> dict[str, str]:
    names = {}
    for line in EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            names[key] = value
    return names


def setting_env_name(field: str) -> str:
    info = Settings.model_fields[field]
    alias = info.validation_alias
    if alias is not None:
        return str(alias.choices[0])  # type: ignore[union-attr]
    return f"PARLEY_{field.upper()}"


def test_every_setting_is_listed() -> None:
    listed = env_names()
    expected = {setting_env_name(field) for field in Settings.model_fields}
    assert set(listed) == expected


def test_listed_values_load_as_the_defaults(monkeypatch: object) -> None:
    values = {k: v for k, v in env_names().items() if v != ""}
    loaded = Settings(_env_file=None, **{})  # type: ignore[call-arg]
    from_file = Settings(_env_file=str(EXAMPLE))  # type: ignore[call-arg]
    assert from_file.model_dump() == loaded.model_dump()
    assert values
