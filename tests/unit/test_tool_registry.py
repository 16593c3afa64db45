"""The tool registry: what derives from it, the tools a session offers, the API's names."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.config import Settings
from app.context.tools import (
    BUILTIN_TOOLS,
    COMPACTABLE_BUILTINS,
    READ_ONLY_TOOLS,
    BuiltinTool,
    client_tool_names,
    compactable_tools,
    tool_definitions,
)
from app.engine.tools.builtin import HANDLERS
from app.main import create_app
from app.schemas import SessionCreate, SessionPatch

NAMES = ["Read", "Write", "Edit", "Glob", "Grep"]
WEATHER = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_the_registry_holds_the_five_builtins_in_order() -> None:
    assert list(BUILTIN_TOOLS) == NAMES
    assert [tool.value for tool in BuiltinTool] == NAMES
    assert all(spec.name == name for name, spec in BUILTIN_TOOLS.items())


def test_read_only_tools_are_read_glob_grep() -> None:
    assert frozenset({"Read", "Glob", "Grep"}) == READ_ONLY_TOOLS


def test_every_builtin_is_compactable() -> None:
    assert frozenset(NAMES) == COMPACTABLE_BUILTINS


def test_every_registered_tool_has_a_handler() -> None:
    assert set(HANDLERS) == set(BUILTIN_TOOLS)


def test_definitions_put_builtins_first_and_strip_parley_keys() -> None:
    client = [{**WEATHER, "compactable": True}, {**WEATHER, "name": "other"}]
    definitions = tool_definitions(["Grep", "Read"], client)
    assert [tool["name"] for tool in definitions] == ["Grep", "Read", "weather", "other"]
    assert definitions[0] == BUILTIN_TOOLS["Grep"].to_api()
    assert definitions[2] == WEATHER
    assert all("compactable" not in tool for tool in definitions)
    assert client[0]["compactable"] is True  # the stored tool is not changed


def test_definitions_of_a_session_without_tools_are_empty() -> None:
    assert tool_definitions([], []) == []


def test_client_tool_names() -> None:
    assert client_tool_names([WEATHER, {**WEATHER, "name": "other"}]) == {"weather", "other"}


def test_compactable_tools_add_client_tools_marked_compactable() -> None:
    client = [
        {**WEATHER, "compactable": True},
        {**WEATHER, "name": "plain"},
        {**WEATHER, "name": "unmarked", "compactable": False},
    ]
    assert compactable_tools(client) == COMPACTABLE_BUILTINS | {"weather"}
    assert compactable_tools([]) == COMPACTABLE_BUILTINS


@pytest.mark.parametrize("model", [SessionCreate, SessionPatch])
def test_sessions_take_exactly_the_registry_names(model: type[SessionCreate]) -> None:
    body = model.model_validate({"builtin_tools": NAMES})
    assert body.builtin_tools == NAMES
    assert all(type(name) is str for name in body.builtin_tools or [])
    for wrong in ("Bash", "read", ""):
        with pytest.raises(ValidationError):
            model.model_validate({"builtin_tools": [wrong]})


def test_openapi_lists_the_registry_names() -> None:
    spec = create_app(Settings(model_provider="offline", database_url="sqlite://")).openapi()
    assert spec["components"]["schemas"]["BuiltinTool"]["enum"] == NAMES


@pytest.mark.parametrize("body", [{"builtin_tools": ["Bash"]}, {"builtin_tools": ["Read", "x"]}])
async def test_other_names_are_refused_with_422(body: dict[str, Any]) -> None:
    # Validation fails before the database is used, so none is needed.
    app = create_app(Settings(model_provider="offline", database_url="sqlite://"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://parley") as client:
        response = await client.post("/sessions", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["loc"][:2] == ["body", "builtin_tools"]
