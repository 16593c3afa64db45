"""A tool input checked against its spec's schema, worded for the model to correct.

Only the few JSON-schema keywords the built-in schemas use (type, enum, minimum,
required, no other members) are known here.
"""

from __future__ import annotations

from typing import Any

from app.context.tools import ToolSpec

_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "boolean": bool}


def _json_type_name(value: object) -> str:
    if value is None:
        return "null"
    for name, kind in (("boolean", bool), ("integer", int), ("number", float), ("string", str)):
        if isinstance(value, kind):
            return name
    return "array" if isinstance(value, list) else "object"


def _article(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _value_problem(name: str, value: object, schema: dict[str, Any]) -> str | None:
    kind = schema["type"]
    # bool is an int in Python, but `true` is no valid offset.
    if not isinstance(value, _JSON_TYPES[kind]) or (kind == "integer" and isinstance(value, bool)):
        return f"'{name}' must be {_article(kind)}, not {_article(_json_type_name(value))}"
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(repr(choice) for choice in schema["enum"])
        return f"'{name}' must be one of {choices}, not {value!r}"
    if "minimum" in schema and isinstance(value, int) and value < schema["minimum"]:
        return f"'{name}' must be at least {schema['minimum']}, not {value}"
    return None


def check_input(spec: ToolSpec, tool_input: object) -> tuple[dict[str, Any], str | None]:
    """The input without null members (models send `null` for "not given"), or a problem."""
    if not isinstance(tool_input, dict):
        return {}, f"the input must be a JSON object, not {_article(_json_type_name(tool_input))}"
    properties: dict[str, Any] = spec.input_schema["properties"]
    args = {key: value for key, value in tool_input.items() if value is not None}
    unknown = sorted(str(key) for key in args if key not in properties)
    if unknown:
        return {}, f"unknown parameter(s) {unknown}; {spec.name} takes {sorted(properties)}"
    for name in spec.input_schema["required"]:
        if name not in args:
            return {}, f"the required parameter '{name}' is missing"
    for name, value in args.items():
        problem = _value_problem(name, value, properties[name])
        if problem:
            return {}, problem
    return args, None
