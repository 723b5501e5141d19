"""Structured-output request fields -> one sdk Constraint (or None).

OpenAI's `response_format` ({"type": "text" | "json_object" | "json_schema"}), vLLM's
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (Lark, as
llguidance reads it) and llama.cpp's `grammar` (GBNF) / `json_schema`. At most one of
them per request: two would have to be intersected, which no grammar engine offers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from edgeprefill.errors import RequestError
from edgeprefill.sdk.constraints import Constraint
from edgeprefill.server.errors import ApiError


def parse_constraint(body: dict) -> Constraint | None:
    given = [name for name in READERS if body.get(name) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ApiError(400, f"send one structured-output field, not {' and '.join(given)}",
                       given[1])
    name = given[0]
    try:
        return READERS[name](body[name])
    except RequestError as err:
        raise ApiError(400, f"'{name}': {err}", name) from None


def _response_format(value: Any) -> Constraint | None:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise RequestError("must be an object with a string 'type'")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object()
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise RequestError("json_schema must be an object with a 'schema' object")
        strict = spec.get("strict")
        return Constraint.json_schema(spec.get("schema", {}), strict=strict is not False)
    raise RequestError(f"type {kind!r} is not supported (text, json_object, json_schema)")


def _schema(value: Any) -> Constraint:
    if isinstance(value, str):  # vLLM accepts the schema as JSON text too
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RequestError(f"not valid JSON: {err}") from None
    return Constraint.json_schema(value, strict=False)


READERS: dict[str, Callable[[Any], Constraint | None]] = {
    "response_format": _response_format,
    "guided_json": _schema,
    "json_schema": _schema,
    "guided_regex": Constraint.regex,
    "guided_choice": Constraint.choice,
    "guided_grammar": Constraint.grammar,
    "grammar": Constraint.gbnf,
}
