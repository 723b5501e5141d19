"""The strict-tool grammar of the XML call format (Qwen3.5, Qwen3-Coder) under
`tool_choice: "auto"` (server/strict_tools.py dispatches to it; XmlParser in
server/tool_parsers.py reads what it allows).

Hermes' tags around XML, as their templates write a call and XmlParser reads it:
`<tool_call>`, "\n", `<function=NAME>`, "\n", per parameter `<parameter=KEY>`, "\n", the
value, "\n", `</parameter>`, "\n", then `</function>`, at most two blanks (the template's
"\n", left a choice so that the close tag's added token stays allowed) and `</tool_call>`;
free text again after it. A strict tool's keys come in its schema's order (the simplest
rule that holds each key to one value; OpenAI's strict has them all required), the
required ones present, each value text that the parser's `_typed` reads back as a value
the schema admits: a string is text (its min/maxLength held) that the parser does not read
as null; a string enum its members as written; integer, number, boolean, null, object,
array and any other typed schema JSON by the property's schema (`_typed` reads those back
from JSON text). No value holds `</parameter>`, `</function>` or `</tool_call>`, which
would end the parser's non-greedy match early: a text value excludes them, a JSON value's
strings hold no `</` (a pattern; untyped subschemas narrowed to scalars, objects closed).
What plain text cannot hold is refused in one line: a string's pattern or format, a
property without a type that is not a string enum, a $ref; and a parameter name the
format cannot write (a `>`, a line break, blanks at its ends), with the remedies that work
for it (rename it, or force the call: a forced call is JSON). A non-strict tool's parameters
are any keys (`[^>\n]+`, the parser's), each value any UTF-8 text without those tags (a
key twice stays the parser's: such a call reads as text).
"""

from __future__ import annotations

import json
import re
from typing import Any

from edgeprefill import json_numbers
from edgeprefill.sdk.lazy_text import BLANKS, text_until
from edgeprefill.server.errors import ApiError
from edgeprefill.server.strict_tools import (
    HERMES,
    JSON_STYLE,
    PY_BLANKS,
    closed_schema,
    refused,
)

# Where XmlParser's non-greedy regexes end a value, a call's body and the call: no value
# may hold one (nor may the string of a JSON value: XML_STRING_PATTERN).
XML_CLOSE_TAGS = ("</parameter>", "</function>", "</tool_call>")
# A JSON schema pattern (anchored, as llguidance reads it) for strings without `</`.
XML_STRING_PATTERN = "^([^<]|<+[^</])*<*$"
# The JSON types a subschema without a type is narrowed to in an XML value (containers
# left out: their strings could not be guarded).
XML_SCALARS = ["string", "number", "boolean", "null"]
DESCRIPTIVE = {"description", "title", "default", "examples"}  # keywords that hold nothing


def qwen3_xml_grammar(tools: tuple[dict, ...]) -> str:
    """The Lark grammar: free text, calls opened by `<tool_call>` and closed by
    `</tool_call>` as Qwen3.5's template writes them (each element on its own line), free
    text again after each. A call is one listed tool's `<function=NAME>`; a strict tool's
    parameters are its schema's keys in the schema's order, each at most once, the
    required ones present, each value text that XmlParser types back into a value its
    schema admits; a loose tool's are any keys with any values the parser can delimit."""
    open_tag, close_tag = HERMES
    lines = ["%llguidance {}", "start: (head call)* TEXT", *text_until("head", open_tag),
             # Blanks (the parser's any) before the close tag, not the template's one
             # "\n": llguidance lets bytes the grammar forces be spelled only as its
             # tokenizer would, which leaves out the tag's added token.
             f"call: {_literal(chr(10))} function {BLANKS} {_literal(close_tag)}",
             "function: " + " | ".join(f"f{i}" for i in range(len(tools)))]
    for i, tool in enumerate(tools):
        lines += _xml_function(f"f{i}", tool["function"])
    # A value: any text up to the first close tag of its parameter, holding no tag that
    # would end its call's body first (the rule is lazy, as XmlParser's regex is).
    lines.append(f"LOOSE: /(?s:.*)/ & {_xml_text(null=True)}")
    return "\n".join(lines)


def _xml_function(rule: str, function: dict[str, Any]) -> list[str]:
    """The Lark lines of `rule`: one call of `function` in the XML format."""
    opening = _literal(f"<function={function['name']}>\n")
    closing = _literal("</function>")
    if function.get("strict") is not True:
        return [f"{rule}: {opening} {rule}_p* {closing}",
                f'{rule}_p: "<parameter=" /[^>\\n]+/ ">\\n" {rule}_v "\\n"',
                f'{rule}_v[lazy]: LOOSE "\\n</parameter>"']
    schema = closed_schema(function.get("parameters") or {"type": "object", "properties": {}})
    required = set(schema.get("required", ()))
    unlisted = required - set(schema.get("properties", {}))
    if unlisted:
        raise _xml_refusal(function["name"], sorted(unlisted)[0], "required but not "
                           "among the properties")
    # The keys in the schema's order: the simplest rule that holds each to at most one
    # value (OpenAI's strict has every key required anyway, and templates write a call's
    # arguments in the order the model gave them, which it learns from the schema).
    parts, lines = [], []
    for j, (key, spec) in enumerate(schema.get("properties", {}).items()):
        if not isinstance(key, str) or not key or key != key.strip() or \
                re.search("[>\n]", key):
            # Not `refused`: dropping strict would not make the name writable (XmlParser
            # reads a name up to `>`, stripped); a forced call is JSON, which holds any.
            raise ApiError(400, f"function {function['name']!r}: parameter name {key!r} "
                           "cannot be written in this model's XML call format (a name "
                           "holds no '>' or line break, nor blanks at its ends); rename "
                           "it, or force the call with tool_choice (a forced call is "
                           "JSON, which holds any name)", "tools")
        name = f"{rule}_{j}"
        parts.append(name if key in required else f"{name}?")
        lines += _xml_parameter(name, key, spec, function["name"])
    return [f"{rule}: {opening} {' '.join(parts)} {closing}", *lines]


def _xml_parameter(rule: str, key: str, spec: Any, function: str) -> list[str]:
    """The Lark lines of `rule`: `<parameter=KEY>`, a value `spec` admits as XmlParser
    types it (server/tool_parsers.py's _typed), `</parameter>`, each on its own line."""
    head = _literal(f"<parameter={key}>\n")
    end = _literal("\n</parameter>")
    spec = spec if isinstance(spec, dict) else {}
    kind = spec.get("type")
    members = spec["enum"] if "enum" in spec else [spec["const"]] if "const" in spec else None
    if kind in (None, "string") and members is not None:
        # The parser keeps the text of an untyped or string parameter: the string members,
        # written as they are, less those it would not read back as themselves.
        texts = [m for m in members if isinstance(m, str) and _xml_text_reads_back(m)]
        if not texts:
            raise _xml_refusal(function, key, "no enum member can be written as plain text")
        return [f"{rule}: {head} ({' | '.join(_literal(t) for t in texts)}) {end} "
                f"{_literal(chr(10))}"]
    if kind == "string" or (kind is None and not set(spec) - DESCRIPTIVE):
        if "pattern" in spec or "format" in spec:
            raise _xml_refusal(function, key, "a string's pattern or format cannot be "
                               "held in plain text")
        low, high = spec.get("minLength", 0), spec.get("maxLength")
        length = f"{{{low},{'' if high is None else high}}}"
        return [f"{rule}: {head} {rule}_v {_literal(chr(10))}",
                f"{rule}_v[lazy]: {rule.upper()}_S {end}",
                f"{rule.upper()}_S: /(?s:.{length})/ & {_xml_text()}"]
    if kind is None:
        raise _xml_refusal(function, key, "a parameter without a type is read as plain "
                           "text, which its schema may not admit")
    # integer, number, boolean, null: JSON text that the parser reads back as that type
    # (a JSON number or literal); anything else the parser reads as JSON.
    value = {**_xml_guarded(spec, function, key), "x-guidance": JSON_STYLE}
    return [f"{rule}: {head} %json {json_numbers.dumps_as_json(value)} {end} {_literal(chr(10))}"]


def _xml_text(null: bool = False) -> str:
    """A lexeme's regex: text holding no XML close tag and, unless `null`, that the parser
    does not take for null (str.strip's blanks around `null`, any case)."""
    tags = "|".join(re.escape(t).replace("/", "\\/") for t in XML_CLOSE_TAGS)
    text = f"~/(?s:.*({tags}).*)/"
    return text if null else f"{text} & ~/[{PY_BLANKS}]*[nN][uU][lL][lL][{PY_BLANKS}]*/"


def _xml_text_reads_back(text: str) -> bool:
    return text.strip().lower() != "null" and not any(t in text for t in XML_CLOSE_TAGS)


def _xml_guarded(schema: Any, function: str, key: str) -> dict[str, Any]:
    """A JSON value's schema narrowed so that its text holds no `</` (which could end the
    parameter, its call's body or the call early): strings by a pattern, untyped
    subschemas to scalars, objects closed. Every value it admits, the original admits."""
    if schema is True or not isinstance(schema, dict):
        schema = {}
    node = dict(schema)
    if {"$ref", "not", "contains", "additionalItems"} & set(node):
        raise _xml_refusal(function, key, "a JSON value's $ref, not, contains or "
                           "additionalItems is not supported")
    if not {"type", "enum", "const", "anyOf", "oneOf", "allOf"} & set(node):
        node["type"] = XML_SCALARS
    for member in node.get("enum", []) + ([node["const"]] if "const" in node else []):
        if "</" in json_numbers.dumps_as_json(member):
            raise _xml_refusal(function, key, "an enum member holds '</'")
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds and not {"enum", "const"} & set(node):  # members checked above
        if "pattern" in node or "format" in node:
            raise _xml_refusal(function, key, "a string's pattern or format inside a JSON "
                               "value cannot be kept free of '</'")
        node["pattern"] = XML_STRING_PATTERN
    if "array" in kinds and "items" not in node and "prefixItems" not in node:
        node["items"] = {}
    if "object" in kinds:
        node["additionalProperties"] = False
    if isinstance(node.get("items"), (dict, bool)):
        node["items"] = _xml_guarded(node["items"], function, key)
    for word in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(node.get(word), list):
            node[word] = [_xml_guarded(s, function, key) for s in node[word]]
    if isinstance(node.get("properties"), dict):
        node["properties"] = {k: _xml_guarded(s, function, key)
                              for k, s in node["properties"].items()}
    return node


def _xml_refusal(function: str, key: str, why: str) -> ApiError:
    return refused(f"function {function!r}, parameter {key!r}: {why} in this model's XML "
                   "call format under strict")


def _literal(text: str) -> str:
    """A Lark string literal of `text`."""
    return json.dumps(text)
