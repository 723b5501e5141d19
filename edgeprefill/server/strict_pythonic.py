"""`strict: true` tools under `tool_choice: "auto"` in LFM2's pythonic call format.

LFM2 writes its calls as a Python list between two tags, text around them:
`<|tool_call_start|>[get_weather(city="Paris"), get_time()]<|tool_call_end|>`
(server/tool_parsers.py's PythonicParser reads it with `ast`). The lazy grammar here, as
hermes' in server/strict_tools.py, leaves the text free up to the open tag, holds the list
of calls to the format and the close tag, and frees the text again after it; any number
of such lists.

- The tags are special tokens in LFM2's tokenizers, which llguidance matches only as a
  token (`<[id]>`), so the text also ends at the open tag's token (then that text is valid
  UTF-8, as Mistral's: sdk/lazy_text.text_until's utf8). The close tag is its token
  where it is one (llguidance forces a fixed string's canonical tokens, the special
  token's), else its text.
- A call is `name(key=value, ...)` of a listed tool whose name Python can write (an
  identifier, no keyword); a loose tool named otherwise is left out, as the parser could
  not read its call anyway.
- A strict tool's keywords are its schema's properties, in the schema's order (then any
  `required` name it does not list), each at most once and every required one present:
  one fixed order is the simplest rule a grammar holds that keeps a name from coming
  twice (the parser refuses the whole list then) and a required one from being left out.
  Each value is one JSON value of that property's schema, closed to unlisted properties
  (strict_tools.closed_schema); the parser reads JSON's true/false/null as Python's (its
  `_JsonNames`), and JSON strings as llguidance writes them read the same in Python (it
  writes neither `\\/` nor a `\\u` escape above U+007F). A strict tool whose parameters
  hold more than `properties` and `required` at their top, or list a property Python
  cannot write as a keyword, is refused in one line: the grammar could not hold it.
- A loose tool's keywords are any ASCII identifiers (up to 64 characters) but Python's
  keywords, each value any JSON value. A name given twice the grammar cannot rule out (a
  context-free grammar does not remember unboundedly many names): the parser then reads
  the list as text.
- A bundle that thinks, with the think tags as special tokens (and the open tag one), is
  refused in one line (strict_tools.lazy_call_constraint, as for Mistral's format): the
  text before a call is valid UTF-8 there, so it could not hold the tags and the model
  could never close its think block.
- `parallel_tool_calls: false`: each list holds one call. Text after the close tag may
  open another list, as hermes' grammar lets another call follow (the parser keeps the
  first call).
"""

from __future__ import annotations

import json
import keyword
import unicodedata
from collections.abc import Mapping
from typing import Any, NoReturn

from edgeprefill import json_numbers
from edgeprefill.sdk.lazy_text import BLANKS, spelled, text_until_either
from edgeprefill.server.strict_tools import JSON_STYLE, closed_schema, refused
from edgeprefill.server.tool_parsers import PythonicParser

OPEN, CLOSE = PythonicParser.open_tag, PythonicParser.close_tag
SEPARATOR = ", "  # between calls and between keywords, as LFM2 writes them
# The top-level keywords of a strict tool's parameters that the grammar holds (or that
# constrain nothing); any other is refused rather than dropped.
KNOWN = {"type", "properties", "required", "additionalProperties", "$defs", "definitions",
         "title", "description", "$schema"}
# Any ASCII identifier of up to 64 characters (OpenAI's bound on a function's name; a
# random model would write an unbounded one forever) but a keyword Python refuses as a
# keyword argument's name.
LOOSE_NAME = (r"/[A-Za-z_][A-Za-z0-9_]{0,63}/ & ~/("
              + "|".join(sorted(keyword.kwlist)) + ")/")


def pythonic_grammar(tools: tuple[dict, ...], parallel: bool,
                     special_ids: Mapping[str, int]) -> str:
    """The Lark grammar (llguidance's dialect): free text, then any number of
    `<|tool_call_start|>[call, ...]<|tool_call_end|>` each followed by free text.
    `special_ids`: the tokenizer's special tokens, text -> id (the tags, where they are)."""
    open_id, close_id = special_ids.get(OPEN), special_ids.get(CLOSE)
    functions = [t["function"] for t in tools  # a strict one Python cannot name refuses
                 if writable(t["function"]["name"]) or t["function"].get("strict") is True]
    more = f" ({json.dumps(SEPARATOR)} call)*" if parallel else ""
    lines = [
        "%llguidance {}", "start: (opening calls closing)* TEXT",
        *text_until_either("opening", OPEN, open_id),  # the tag's token or its text
        f'calls: {BLANKS} "[" call{more} "]" {BLANKS}',
        f"closing: {spelled(CLOSE, close_id)}",
        "call: " + " | ".join(f"call_{i}" for i in range(len(functions))),
        f"LOOSE_NAME: {LOOSE_NAME}",
        f"any_value: %json {json.dumps({'x-guidance': JSON_STYLE})}",
    ]
    for i, function in enumerate(functions):
        lines += _call_rules(f"call_{i}", function)
    return "\n".join(lines)


def writable(name: str) -> bool:
    """Whether Python reads `name` back as written, as a call's or a keyword's name: an
    identifier, no keyword, unchanged by the NFKC that Python applies to identifiers."""
    return name.isidentifier() and not keyword.iskeyword(name) and \
        unicodedata.normalize("NFKC", name) == name


def _call_rules(rule: str, function: dict[str, Any]) -> list[str]:
    """`rule`: a call of `function`, `name(...)`, its keywords by its schema if strict."""
    opening = json.dumps(function["name"] + "(")
    if function.get("strict") is not True:
        keyword_ = 'LOOSE_NAME "=" any_value'
        keywords = f"{keyword_} ({json.dumps(SEPARATOR)} {keyword_})*"
        return [f'{rule}: {opening} ({keywords})? ")"']
    properties = _strict_properties(function)
    return [f'{rule}: {opening} {rule}_0_first ")"',
            *_keyword_rules(rule, properties)]


def _keyword_rules(rule: str, properties: list[tuple[str, dict, bool]]) -> list[str]:
    """Rules `{rule}_{i}_first` and `{rule}_{i}_after`: the keywords from property i on,
    none written yet or some (a separator first); each property once, in order, a
    required one always, an optional one or not."""
    lines = [f'{rule}_{len(properties)}_first: ""', f'{rule}_{len(properties)}_after: ""']
    for i, (name, schema, required) in enumerate(properties):
        value = json_numbers.dumps_as_json({**schema, "x-guidance": JSON_STYLE})
        item = f'{rule}_{i}_item: {json.dumps(name + "=")} %json {value}'
        written = f"{rule}_{i}_item {rule}_{i + 1}_after"
        for state, sep in (("first", ""), ("after", json.dumps(SEPARATOR) + " ")):
            skipped = "" if required else f" | {rule}_{i + 1}_{state}"
            lines.append(f"{rule}_{i}_{state}: {sep}{written}{skipped}")
        lines.append(item)
    return lines


def _strict_properties(function: dict[str, Any]) -> list[tuple[str, dict, bool]]:
    """A strict tool's keywords: (name, closed JSON schema of its value, required), in
    the schema's order; ApiError for parameters the grammar cannot hold."""
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    name = function["name"]
    extra = sorted(set(parameters) - KNOWN)
    if not writable(name):
        _refuse(name, "its name is no Python name")
    if extra or parameters.get("type", "object") != "object":
        _refuse(name, f"its parameters are no plain object ({', '.join(extra) or 'type'})")
    closed = closed_schema(parameters)
    listed: dict[str, Any] = closed.get("properties") or {}
    required = list(closed.get("required") or [])
    defs = {k: closed[k] for k in ("$defs", "definitions") if k in closed}
    names = [*listed, *(r for r in dict.fromkeys(required) if r not in listed)]
    for key in names:
        if not writable(key):
            _refuse(name, f"its parameter {key!r} is no Python keyword name")
        if not isinstance(listed.get(key, {}), dict):
            _refuse(name, f"its parameter {key!r} has a boolean schema")
    return [(key, {**listed.get(key, {}), **defs}, key in required) for key in names]


def _refuse(tool: str, why: str) -> NoReturn:
    raise refused(f"tool {tool!r} is strict, but LFM2's pythonic call format cannot hold it "
                  f"under tool_choice auto: {why}")
