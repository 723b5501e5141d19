"""Tool calls' arguments are JSON (RFC 8259) whatever number the model wrote: a number a
float cannot hold keeps its text in every call format (server/json_numbers.py), and NaN or
Infinity, not JSON, make no call. No model: the replies are texts in each format. The
reference for "valid JSON" is JavaScript's JSON.parse (node), where it is installed, and
the literal text the model wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
from decimal import Decimal

import pytest

pytest.importorskip("starlette")

from edgeprefill import json_numbers  # noqa: E402
from edgeprefill.server.responses import calls_finish_reason  # noqa: E402
from edgeprefill.server.tool_parsers import (  # noqa: E402
    PARSERS,
    ForcedNamedParser,
    ForcedRequiredParser,
    ToolParser,
)

XML = "<tool_call>\n<function=f>\n<parameter=x>\n{}\n</parameter>\n</function>\n</tool_call>"
PYTHONIC = "<|tool_call_start|>[f(x={})]<|tool_call_end|>"
# (format, reply with {} for the value, the value the model wrote)
FORMATS = [
    ("hermes", '<tool_call>{{"name": "f", "arguments": {{"x": {}}}}}</tool_call>'),
    # arguments first: the call is parsed whole, not streamed as written
    ("hermes", '<tool_call>{{"arguments": {{"x": {}}}, "name": "f"}}</tool_call>'),
    ("llama3_json", '{{"name": "f", "parameters": {{"x": {}}}}}'),
    ("mistral", '[TOOL_CALLS][{{"name": "f", "arguments": {{"x": {}}}}}]'),
    ("pythonic", PYTHONIC),
    ("pythonic", '<|tool_call_start|>[{{"name": "f", "arguments": {{"x": {}}}}}]'
                 '<|tool_call_end|>'),
    ("qwen3_xml", XML),
    ("forced_named", '{{"x": {}}}'),
    ("forced_required", '[{{"name": "f", "parameters": {{"x": {}}}}}]'),
]
PARSED_WHOLE = FORMATS[1:]  # hermes' first streams its arguments as written
UNHOLDABLE = ["1e400", "-1e999", "1E+400", "2.5e-400", "-1e-999"]
NUMBER_SCHEMA = {"f": {"type": "object", "properties": {"x": {"type": "number"}}}}


def parser(fmt: str) -> ToolParser:
    made = {"forced_named": lambda: ForcedNamedParser("f"),
            "forced_required": ForcedRequiredParser}.get(fmt, PARSERS.get(fmt))
    tool_parser = made()  # type: ignore[misc]
    tool_parser.schemas = NUMBER_SCHEMA
    return tool_parser


def js_parses(texts: list[str]) -> list[bool]:
    """Whether JavaScript's JSON.parse reads each text (skips without node)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node: JavaScript's JSON.parse is the reference")
    script = ("const texts = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "console.log(JSON.stringify(texts.map(t => { try { JSON.parse(t); "
              "return true; } catch (e) { return false; } })));")
    out = subprocess.run([node, "-e", script], input=json.dumps(texts), text=True,
                         capture_output=True, check=True, timeout=30)
    return json.loads(out.stdout)


@pytest.mark.parametrize("fmt,reply", FORMATS)
def test_a_number_a_float_cannot_hold_keeps_the_text_the_model_wrote(fmt, reply):
    texts = []
    for written in UNHOLDABLE:
        (call,) = parser(fmt).parse(reply.format(written)).calls
        assert call.arguments == f'{{"x": {written}}}', (fmt, written)
        texts.append(call.arguments)
    assert all(js_parses(texts))


@pytest.mark.parametrize("fmt,reply", PARSED_WHOLE)
def test_numbers_a_float_holds_are_as_before(fmt, reply):
    for written, arguments in [("1e308", '{"x": 1e+308}'), ("-0.5", '{"x": -0.5}'),
                               ("0e-400", '{"x": 0.0}'), ("12", '{"x": 12}')]:
        (call,) = parser(fmt).parse(reply.format(written)).calls
        assert call.arguments == arguments, (fmt, written)


@pytest.mark.parametrize("fmt,reply", [f for f in PARSED_WHOLE if f[0] not in (
    "pythonic", "qwen3_xml")])
@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_json_arguments_is_no_call_but_text(fmt, reply, constant):
    """Python's json reads them; JSON has no such numbers: the call is invalid JSON, and
    stays the reply's text as any other."""
    text = reply.format(constant)
    parsed = parser(fmt).parse(text)
    assert parsed.calls == [] and parsed.content.strip() == text.strip()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_streamed_arguments_with_nan_do_not_finish_as_tool_calls(constant):
    """Arguments streamed as generated are the model's text (sent before the end is
    known): with NaN they are not JSON, so the reply's finish_reason is not `tool_calls`,
    as for any call whose arguments are not JSON."""
    text = FORMATS[0][1].format(constant)
    (call,) = parser("hermes").parse(text).calls
    assert call.arguments == f'{{"x": {constant}}}'
    assert calls_finish_reason([call], "stop") == "stop"
    (kept,) = parser("hermes").parse(FORMATS[0][1].format("1e400")).calls
    assert calls_finish_reason([kept], "stop") == "tool_calls"


def test_pythonic_literals_are_written_as_json_numbers():
    """Python spellings JSON has not (`1_0e400`, `.5e400`, a `+`) in JSON's, the sign
    kept; a double sign is no literal (as `--1` is not), so no call."""
    for written, json_text in [("1_0e400", "10e400"), (".5e400", "5E+399"),
                               ("+1e400", "1e400"), ("-.5e-400", "-5E-401"),
                               ("[1e400, -1e400]", "[1e400, -1e400]")]:
        (call,) = parser("pythonic").parse(PYTHONIC.format(written)).calls
        assert call.arguments == f'{{"x": {json_text}}}', written
        assert Decimal(json_text.strip("[]").split(",")[0]) == \
            Decimal(written.strip("[]").split(",")[0].replace("_", ""))
    assert parser("pythonic").parse(PYTHONIC.format("--1e400")).calls == []


@pytest.mark.parametrize("written", ["nan", "NaN", "inf", "-Infinity", "+inf"])
def test_an_xml_number_spelled_nan_or_inf_is_its_text(written):
    """Python's float() reads these; a JSON number they are not: the value stays the
    string the model wrote (as any text that is not a number)."""
    (call,) = parser("qwen3_xml").parse(XML.format(written)).calls
    assert call.arguments == json.dumps({"x": written})


@pytest.mark.parametrize("kind,written", [("array", "[1e400, 2]"), ("object", '{"a": -1e400}'),
                                          ("integer", "1e400"), ("array", "[NaN]")])
def test_xml_json_values_keep_their_numbers_too(kind, written):
    schemas = {"f": {"properties": {"x": {"type": kind}}}}
    tool_parser = PARSERS["qwen3_xml"]()
    tool_parser.schemas = schemas
    (call,) = tool_parser.parse(XML.format(written)).calls
    expected = f'{{"x": {written}}}' if "NaN" not in written else json.dumps({"x": written})
    assert call.arguments == expected


def test_dumps_writes_what_loads_read_and_json_writes_the_rest_as_json_does():
    value = json_numbers.loads('{"a": [1e400, 1.5, 7, "é", null, true], "b": {"c": -1e-400}}')
    assert json_numbers.dumps(value) == '{"a": [1e400, 1.5, 7, "é", null, true], ' \
        '"b": {"c": -1e-400}}'
    assert json_numbers.dumps(value, (",", ":")).startswith('{"a":[1e400,1.5,')
    plain = {"k": [1.25, 3, "ü"], 2: None}
    assert json_numbers.dumps(plain) == json.dumps(plain, ensure_ascii=False)
    with pytest.raises(ValueError):  # not JSON, as json.dumps would write it
        json_numbers.dumps({"x": float("inf")})
    with pytest.raises(TypeError):  # json's own writer never writes a kept number wrong
        json.dumps(value)


def test_integers_of_more_digits_than_python_converts_are_kept():
    digits = "9" * 5000  # past sys.get_int_max_str_digits (4300)
    assert json_numbers.dumps(json_numbers.loads(f"[{digits}]")) == f"[{digits}]"


def test_dumps_as_json_takes_json_s_options_and_writes_kept_numbers_bare():
    """What a chat template's tojson calls (indent, separators, sort_keys, ensure_ascii):
    json.dumps's text, each kept number in place of the string json would write."""
    value = json_numbers.loads('{"b": [1e400, "é"], "a": {"c": -1e-999}}')
    plain = {"b": ["1e400", "é"], "a": {"c": "-1e-999"}}
    for options in [{}, {"indent": 2}, {"separators": (",", ":")}, {"sort_keys": True},
                    {"ensure_ascii": False, "indent": "\t"}]:
        expected = json.dumps(plain, **options).replace('"1e400"', "1e400") \
            .replace('"-1e-999"', "-1e-999")
        assert json_numbers.dumps_as_json(value, **options) == expected, options
    with pytest.raises(TypeError):
        json_numbers.dumps_as_json({"x": object()})


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [json_numbers.MAX_DEPTH, 1000, 100_000])
@pytest.mark.parametrize("fmt,reply", [f for f in PARSED_WHOLE if f[0] != "qwen3_xml"])
def test_arguments_nested_too_deep_are_no_call_but_text(fmt, reply, depth):
    """Python's JSON reader overflows the stack on 100,000 `[` (RecursionError, no
    ValueError), and a call's arguments deeper than MAX_DEPTH would be a 400 when a client
    sends them back: either way no call, the text as any other that does not parse. The
    arguments object is one level more than the value."""
    text = reply.format(nested(depth))
    parsed = parser(fmt).parse(text)
    assert parsed.calls == [] and parsed.content.strip() == text.strip()


@pytest.mark.parametrize("fmt,reply", FORMATS)
def test_arguments_as_deep_as_allowed_are_a_call(fmt, reply):
    value = nested(json_numbers.MAX_DEPTH - 1)
    tool_parser = parser(fmt)
    tool_parser.schemas = {"f": {"properties": {"x": {"type": "array"}}}}
    (call,) = tool_parser.parse(reply.format(value)).calls
    assert json.loads(call.arguments) == {"x": json.loads(value)}


def test_an_xml_value_too_deep_is_no_call_or_past_python_s_parser_its_text():
    """An array value read as JSON is too deep; read as a Python literal (XmlParser's
    fallback) too deep as well: no call. Past Python's parser (200 brackets) it is no
    literal either, and the value is its text, as any value that does not parse."""
    tool_parser = PARSERS["qwen3_xml"]()
    tool_parser.schemas = {"f": {"properties": {"x": {"type": "array"}}}}
    text = XML.format(nested(json_numbers.MAX_DEPTH))
    parsed = tool_parser.parse(text)
    assert parsed.calls == [] and parsed.content.strip() == text.strip()
    (call,) = tool_parser.parse(XML.format(nested(100_000))).calls
    assert call.arguments == json.dumps({"x": nested(100_000)})


@pytest.mark.parametrize("depth", [json_numbers.MAX_DEPTH + 1, 100_000])
def test_loads_refuses_nesting_deeper_than_max_depth_as_not_json(depth):
    with pytest.raises(ValueError, match="deeper than"):
        json_numbers.loads(nested(depth))
    with pytest.raises(ValueError, match="deeper than"):
        json_numbers.raw_decode("1 " + nested(depth), 2)
    assert json_numbers.loads(nested(json_numbers.MAX_DEPTH)) == \
        json.loads(nested(json_numbers.MAX_DEPTH))


def test_a_kept_number_shows_its_text_in_messages_and_a_setting_reads_it_as_a_float():
    """An error naming a value shows `1e400`, not the class; a sampling setting given a
    number a float cannot hold reads it as a float does: 1e400 is inf (refused as no finite
    number), 1e-400 is 0.0 (taken)."""
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.schemas import _number

    kept = json_numbers.loads('{"t": 1e400, "u": 1e-400}')
    assert repr(kept["t"]) == "1e400" and f"{kept}" == "{'t': 1e400, 'u': 1e-400}"
    with pytest.raises(ApiError, match="'t' must be a finite number"):
        _number(kept, "t", 1.0, 0.0, 2.0)
    assert _number(kept, "u", 1.0, 0.0, 2.0) == 0.0
