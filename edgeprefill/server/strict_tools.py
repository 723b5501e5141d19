"""`strict: true` function tools under `tool_choice: "auto"`: a lazy grammar.

Under auto the model may answer in text or call a tool, so the whole reply cannot be a
JSON schema (as a forced tool_choice makes it, server/tools.py). The grammar here leaves
the text free until the model writes its call format's start marker (`<tool_call>`), and
from there holds the call to the format: a listed tool's name and, for a strict tool,
arguments that match its parameters' schema; after the close marker the text is free
again (the lazy rule that ends the text at a marker: sdk/lazy_text.py).

- Mixed tools: once a call starts its name may be any listed tool's (a call to no tool
  is no use to the client); a strict tool's arguments follow its schema (no properties
  beyond those listed, OpenAI's strict), a non-strict tool's are any JSON object (what the
  parser needs to read a call at all). Without a strict tool nothing is constrained.
- Free text is any bytes: the free-text mask allows every token (llguidance spells a
  special token as bytes a negated regex admits; a byte-level token may split a
  character). Every call the model opens follows the grammar, with
  `parallel_tool_calls: false` too (the parser keeps the first; a grammar that allowed one
  call could not keep the marker out of the text after it: see sdk/lazy_text.py's TEXT).
- Formats: hermes (Qwen2.5, Qwen3, Hermes). The others are refused in one line: the
  Llama 3 JSON and Mistral formats open with a bare `{` or `[` a text may begin with,
  and the arguments of the Python (LFM2) and XML (Qwen3.5) formats are not JSON.
"""

from __future__ import annotations

import json
from typing import Any

from edgeprefill.sdk.constraints import Constraint
from edgeprefill.sdk.lazy_text import BLANKS, text_until
from edgeprefill.server.errors import ApiError

# call format -> its call's open and close markers
MARKERS = {"hermes": ("<tool_call>", "</tool_call>")}
# The JSON of a call as Hermes-format models write it (`json.dumps` separators), and at
# most two blanks around it (BLANKS).
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def strict_given(tool: dict[str, Any]) -> bool:
    """Whether a chat tool (`{"type": "function", "function": {...}}`) asks for strict."""
    return tool["function"].get("strict") is True


def lazy_call_constraint(tools: tuple[dict, ...], call_format: str) -> Constraint:
    """The constraint of a reply under auto where some tool is strict."""
    if call_format not in MARKERS:
        raise ApiError(400, "a tool's strict: true under tool_choice auto is not supported "
                       f"for this model's call format ({call_format}); drop strict, or force "
                       "the call with tool_choice", "tools")
    return Constraint.grammar(lazy_call_grammar(tools, MARKERS[call_format]), lazy=True)


def lazy_call_grammar(tools: tuple[dict, ...], markers: tuple[str, str]) -> str:
    """The Lark grammar (llguidance's dialect): free text, calls opened by the marker."""
    open_tag, close_tag = markers
    calls = {"anyOf": [_call_schema(t["function"]) for t in tools], "x-guidance": JSON_STYLE}
    return "\n".join([
        "%llguidance {}",
        "start: (head call)* TEXT",
        *text_until("head", open_tag),
        f"call: {BLANKS} %json {json.dumps(calls)} {BLANKS} {json.dumps(close_tag)}",
    ])


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    """`{"name": <this tool>, "arguments": ...}`, the arguments by its schema if strict."""
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    arguments = _closed(parameters) if function.get("strict") is True else {"type": "object"}
    return {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": function["name"]}, "arguments": arguments}}


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with no properties beyond those listed (OpenAI's strict)."""
    closed: dict[str, Any] = json.loads(Constraint.json_schema(schema, strict=True).source)
    return closed

