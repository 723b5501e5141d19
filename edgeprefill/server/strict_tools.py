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
- llama3_json (Llama 3.1, 3.2, 3.3): the reply is calls alone or text alone, as the
  parser reads it (server/tool_parsers.py's Llama3JsonParser): calls when, after blanks,
  it opens with `{` or `<|python_tag|>`. So the grammar is either a few blanks,
  `<|python_tag|>` or not (the special token, or its text), one call
  `{"name": ..., "parameters": {...}}` (the key Llama's templates ask for), with
  parallel calls more after "; " (vLLM's separator), and the end of the turn; or a text
  whose first non-blank (str.strip's blanks) is not `{` and which does not open with the
  tag. That text is valid UTF-8, so it holds no special token: the detokenizer would
  drop one, and a text behind it that opens with `{` would read as calls.
- qwen3_xml (Qwen3.5, Qwen3-Coder): hermes' tags around XML, each argument's value plain
  text typed by its schema; its grammar is server/strict_xml.py's.
- Mixed tools: once a call starts its name may be any listed tool's (a call to no tool
  is no use to the client); a strict tool's arguments follow its schema (no properties
  beyond those listed, OpenAI's strict), a non-strict tool's are any JSON object (what the
  parser needs to read a call at all). Without a strict tool nothing is constrained.
- Free text is otherwise any bytes: the free-text mask allows every token (llguidance
  spells a special token as bytes a negated regex admits; a byte-level token may split a
  character).
- `parallel_tool_calls: false`: hermes's and qwen3_xml's grammars still let every call
  follow it (the parser keeps the first; a grammar that allowed one call could not keep
  the marker out of the text after it: see sdk/lazy_text.py's TEXT); Mistral's list and
  Llama's calls hold one call, as nothing follows them.
- pythonic (LFM2): `<|tool_call_start|>[name(key=value, ...)]<|tool_call_end|>` between
  free text, its own grammar (server/strict_pythonic.py). Every format the parsers read
  now has a grammar; gpt-oss's harmony calls are refused in one line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from edgeprefill import json_numbers
from edgeprefill.sdk.constraints import Constraint
from edgeprefill.sdk.lazy_text import BLANKS, spelled, text_until, text_until_either
from edgeprefill.sdk.thinking_budget import tags_are_special
from edgeprefill.server.errors import ApiError
from edgeprefill.server.tool_parsers import PythonicParser

HERMES = ("<tool_call>", "</tool_call>")  # a call's open and close markers
MISTRAL = "[TOOL_CALLS]"  # opens the list of calls
PYTHON_TAG = "<|python_tag|>"  # may open Llama 3's calls
# The formats whose calls open with a marker that may be a special token (the text
# before it is then UTF-8), and how a refusal names each.
SPECIAL_OPENERS = {"mistral": MISTRAL, "pythonic": PythonicParser.open_tag}
FORMAT_NAMES = {"mistral": "the Mistral call format", "pythonic": "LFM2's pythonic call format"}
LLAMA_SEPARATOR = "; "  # between Llama 3 calls (vLLM's llama3_json skips these two)
# The blanks the Llama 3 parser strips before it looks for `{` (str.strip's, server/
# tool_parsers.py's WholeReplyParser), for a regex class: none is above U+3000.
PY_BLANKS = "".join(f"\\x{{{c:x}}}" for c in range(0x3001) if chr(c).isspace())
# The JSON of a call as Hermes- and Mistral-format models write it (`json.dumps`
# separators), and at most two blanks around it (BLANKS).
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def strict_given(tool: dict[str, Any]) -> bool:
    """Whether a chat tool (`{"type": "function", "function": {...}}`) asks for strict."""
    return tool["function"].get("strict") is True


def lazy_call_constraint(tools: tuple[dict, ...], call_format: str, parallel: bool = True,
                         special_ids: Mapping[str, int] | None = None,
                         thinks: bool = False) -> Constraint:
    """The constraint of a reply under auto where some tool is strict. `special_ids`: the
    tokenizer's special tokens (text -> id), where the call marker may be one; `thinks`:
    the bundle's replies may open with a think block (sdk/thinking_budget.bundle_thinks)."""
    special = special_ids or {}
    opener = SPECIAL_OPENERS.get(call_format)
    if thinks and opener in special and tags_are_special(special):
        # The text before a special marker is UTF-8 (text_until's utf8), so it holds no
        # special token: the model could never write its think tags. Refused rather than
        # held so.
        raise refused("a tool's strict: true under tool_choice auto is not supported for "
                      f"a reasoning model in {FORMAT_NAMES[call_format]} whose think tags "
                      "are special tokens")
    if call_format == "llama3_json" and thinks:
        # Its choice, calls or text, is the whole reply's: a reply that opens a think block
        # would be text (calls after the block not held), reasoning that opens with `{` a
        # call. Refused, as before the grammar, rather than held half.
        raise refused("a tool's strict: true under tool_choice auto is not supported for a "
                      "reasoning model in the Llama 3 JSON call format (its reply opens "
                      "with a think block)")
    if call_format == "hermes":
        return Constraint.grammar(hermes_grammar(tools), lazy=True)
    if call_format == "mistral":
        grammar = mistral_grammar(tools, parallel, special.get(MISTRAL))
        return Constraint.grammar(grammar, lazy=True)
    if call_format == "llama3_json":
        grammar = llama3_grammar(tools, parallel, special.get(PYTHON_TAG))
        return Constraint.grammar(grammar, lazy=True)
    # Imported here: strict_xml and strict_pythonic build on this module's markers,
    # schemas and refusal.
    if call_format == "qwen3_xml":
        from edgeprefill.server.strict_xml import qwen3_xml_grammar

        return Constraint.grammar(qwen3_xml_grammar(tools), lazy=True)
    if call_format == "pythonic":
        from edgeprefill.server.strict_pythonic import pythonic_grammar

        return Constraint.grammar(pythonic_grammar(tools, parallel, special), lazy=True)
    raise refused("a tool's strict: true under tool_choice auto is not supported for this "
                  f"model's call format ({call_format})")


def refused(why: str) -> ApiError:
    """The one-line 400 of a strict tool a format's grammar cannot hold, with the ways
    round it."""
    return ApiError(400, f"{why}; drop strict, or force the call with tool_choice", "tools")


def hermes_grammar(tools: tuple[dict, ...]) -> str:
    """The Lark grammar (llguidance's dialect): free text, calls opened by `<tool_call>`
    and closed by `</tool_call>`, free text again after each."""
    open_tag, close_tag = HERMES
    calls = {"anyOf": [_call_schema(t["function"]) for t in tools], "x-guidance": JSON_STYLE}
    return "\n".join([
        "%llguidance {}",
        "start: (head call)* TEXT",
        *text_until("head", open_tag),
        f"call: {BLANKS} %json {json_numbers.dumps_as_json(calls)} {BLANKS} "
        f"{json.dumps(close_tag)}",
    ])


def mistral_grammar(tools: tuple[dict, ...], parallel: bool, marker_id: int | None) -> str:
    """The Lark grammar: free text, or free text up to `[TOOL_CALLS]` and a JSON list of
    calls that ends the reply. `marker_id`: the marker's id where it is a special token."""
    calls: dict[str, Any] = {"type": "array", "minItems": 1, "items": {
        "anyOf": [_call_schema(t["function"]) for t in tools]}, "x-guidance": JSON_STYLE}
    if not parallel:
        calls["maxItems"] = 1
    return "\n".join([
        "%llguidance {}",
        "start: head calls | TEXT",
        *text_until_either("head", MISTRAL, marker_id),  # the marker's token or its text
        f"calls: {BLANKS} %json {json_numbers.dumps_as_json(calls)}",
    ])


def llama3_grammar(tools: tuple[dict, ...], parallel: bool, tag_id: int | None) -> str:
    """The Lark grammar: a reply of calls alone, or a text that the parser cannot take for
    calls. Calls: a few blanks, `<|python_tag|>` or not (`tag_id`: its id where it is a
    special token), one call or, `parallel`, several separated by "; ", then the end. Text:
    valid UTF-8 (so no special token, which the detokenizer would drop) whose first
    non-blank is not `{` and which does not open with `<|python_tag|>`."""
    call = {"anyOf": [_call_schema(t["function"], "parameters") for t in tools],
            "x-guidance": JSON_STYLE}
    more = f" ({json.dumps(LLAMA_SEPARATOR)} call)*" if parallel else ""
    return "\n".join([
        "%llguidance {}",
        "start: calls | TEXT",
        f"calls: {BLANKS} (tag {BLANKS})? call{more}",
        f"tag: {spelled(PYTHON_TAG, tag_id)}",
        f"call: %json {json_numbers.dumps_as_json(call)}",
        # blanks, then nothing or a character other than a blank and `{`, then anything
        f"TEXT: /(?s:[{PY_BLANKS}]*([^{PY_BLANKS}{{].*)?)/ & "
        f"~/(?s:[{PY_BLANKS}]*{re.escape(PYTHON_TAG)}.*)/",
    ])


def _call_schema(function: dict[str, Any], key: str = "arguments") -> dict[str, Any]:
    """`{"name": <this tool>, <key>: ...}`, the arguments under `key` (the format's),
    by the tool's schema if strict."""
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    arguments = closed_schema(parameters) if function.get("strict") is True else {"type": "object"}
    return {"type": "object", "additionalProperties": False, "required": ["name", key],
            "properties": {"name": {"const": function["name"]}, key: arguments}}


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with no properties beyond those listed (OpenAI's strict)."""
    # read as written: a number a float cannot hold stays its text in the grammar
    closed: dict[str, Any] = json_numbers.read_request(
        Constraint.json_schema(schema, strict=True).source)
    return closed
