"""`strict: true` function tools under `tool_choice: "auto"`: a lazy grammar.

Under auto the model may answer in text or call a tool, so the whole reply cannot be a
JSON schema (as a forced tool_choice makes it, server/tools.py). The grammar here leaves
the text free until the model writes its call format's start marker, and from there
holds the calls to the format: a listed tool's name and, for a strict tool, arguments
that match its parameters' schema (the lazy rule that ends the text at a marker:
sdk/lazy_text.py).

- hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>` a call `</tool_call>`, any number, and
  after each close marker the text is free again.
- mistral (Mistral, Ministral, Mistral Small): `[TOOL_CALLS]` then a JSON list of one or
  more calls that runs to the end of the reply (the format has no close marker). Current
  Mistral tokenizers have the marker as a special token, which llguidance matches only as
  a token (`<[id]>`, never inside a text lexeme), so the grammar ends the text at that
  token as well as at the marker spelled in plain text; that text is then valid UTF-8 (a
  text of any bytes would take the special token in: lazy_text.text_until's utf8).
- Mixed tools: once a call starts its name may be any listed tool's (a call to no tool
  is no use to the client); a strict tool's arguments follow its schema (no properties
  beyond those listed, OpenAI's strict), a non-strict tool's are any JSON object (what the
  parser needs to read a call at all). Without a strict tool nothing is constrained.
- Free text is otherwise any bytes: the free-text mask allows every token (llguidance
  spells a special token as bytes a negated regex admits; a byte-level token may split a
  character).
- `parallel_tool_calls: false`: hermes's grammar still lets every call follow it (the
  parser keeps the first; a grammar that allowed one call could not keep the marker out
  of the text after it: see sdk/lazy_text.py's TEXT); Mistral's list holds one call, as
  nothing follows it.
- The other formats are refused in one line: the Llama 3 JSON format opens with a bare
  `{` a text may begin with, and the arguments of the Python (LFM2) and XML (Qwen3.5)
  formats are not JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from edgeprefill.sdk.constraints import Constraint
from edgeprefill.sdk.lazy_text import BLANKS, text_until
from edgeprefill.server.errors import ApiError

HERMES = ("<tool_call>", "</tool_call>")  # a call's open and close markers
MISTRAL = "[TOOL_CALLS]"  # opens the list of calls
FORMATS = ("hermes", "mistral")  # those with a lazy grammar
# The JSON of a call as Hermes- and Mistral-format models write it (`json.dumps`
# separators), and at most two blanks around it (BLANKS).
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def strict_given(tool: dict[str, Any]) -> bool:
    """Whether a chat tool (`{"type": "function", "function": {...}}`) asks for strict."""
    return tool["function"].get("strict") is True


def lazy_call_constraint(tools: tuple[dict, ...], call_format: str, parallel: bool = True,
                         special_ids: Mapping[str, int] | None = None) -> Constraint:
    """The constraint of a reply under auto where some tool is strict. `special_ids`: the
    tokenizer's special tokens (text -> id), where the call marker may be one."""
    if call_format == "hermes":
        return Constraint.grammar(hermes_grammar(tools), lazy=True)
    if call_format == "mistral":
        marker_id = (special_ids or {}).get(MISTRAL)
        return Constraint.grammar(mistral_grammar(tools, parallel, marker_id), lazy=True)
    raise ApiError(400, "a tool's strict: true under tool_choice auto is not supported "
                   f"for this model's call format ({call_format}); drop strict, or force "
                   "the call with tool_choice", "tools")


def special_token_ids(tokenizer: object) -> dict[str, int]:
    """A bundle tokenizer's special tokens, text -> id (none without tokenizer.json)."""
    backend = getattr(tokenizer, "tokenizer", None)
    if backend is None:
        return {}
    return {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}


def hermes_grammar(tools: tuple[dict, ...]) -> str:
    """The Lark grammar (llguidance's dialect): free text, calls opened by `<tool_call>`
    and closed by `</tool_call>`, free text again after each."""
    open_tag, close_tag = HERMES
    calls = {"anyOf": [_call_schema(t["function"]) for t in tools], "x-guidance": JSON_STYLE}
    return "\n".join([
        "%llguidance {}",
        "start: (head call)* TEXT",
        *text_until("head", open_tag),
        f"call: {BLANKS} %json {json.dumps(calls)} {BLANKS} {json.dumps(close_tag)}",
    ])


def mistral_grammar(tools: tuple[dict, ...], parallel: bool, marker_id: int | None) -> str:
    """The Lark grammar: free text, or free text up to `[TOOL_CALLS]` and a JSON list of
    calls that ends the reply. `marker_id`: the marker's id where it is a special token."""
    calls: dict[str, Any] = {"type": "array", "minItems": 1, "items": {
        "anyOf": [_call_schema(t["function"]) for t in tools]}, "x-guidance": JSON_STYLE}
    if not parallel:
        calls["maxItems"] = 1
    opening = ["start: head calls | TEXT"]
    if marker_id is not None:  # the token, or the marker spelled in plain text
        opening = ["start: (head | special) calls | TEXT", f"special: TEXT <[{marker_id}]>"]
    return "\n".join([
        "%llguidance {}",
        *opening,
        *text_until("head", MISTRAL, utf8=marker_id is not None),
        f"calls: {BLANKS} %json {json.dumps(calls)}",
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
