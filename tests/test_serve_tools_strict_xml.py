"""`strict: true` tools under `tool_choice: "auto"` in Qwen3.5's and Qwen3-Coder's XML call
format: free text, then `<tool_call>`, one listed tool's `<function=NAME>` and its
`<parameter=KEY>` values as plain text, `</tool_call>`, free text again
(server/strict_tools.py's qwen3_xml_grammar).

The tiny random model of tests/strict_live.py behind a chat template in Qwen3.5's
shape (calls written back in XML, which is how the server tells the format) and the same
tokenizer (`<tool_call>`, `</tool_call>` added, non-special tokens); the bias on
`<tool_call>` makes the greedy reply open a call after some text. Without strict what
follows is the model's noise, which stays text; with strict it is a call to a listed tool
whose arguments, as the server's XmlParser types them, validate against the schema. The
grammar itself is checked token by token, and each call it takes is parsed by XmlParser
(the independent reference for the format)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from tests import strict_live  # noqa: E402
from tests.strict_live import SCHEMAS, Live, chat, follows, strict_engine, tool, valid  # noqa: E402

# Qwen3.5's shape, shortened: the tools up front, an earlier call written back as XML
# (each element on its own line), results in <tool_response>.
TEMPLATE = (
    "{% if tools %}system: {% for t in tools %}{{ t.function.name }} "
    "{{ t.function.parameters | tojson }} {% endfor %}; {% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<tool_response> {{ m.content }} </tool_response> ; "
    "{% elif m.tool_calls %}assistant: {% for c in m.tool_calls %}<tool_call>\n"
    "<function={{ c.function.name }}>\n{% for k, v in c.function.arguments.items() %}"
    "<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}</function>\n</tool_call>"
    "{% endfor %}; "
    "{% else %}{{ m.role }}: {{ m.content }} ; {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


# A call's XML is long in the tiny vocabulary's tokens: room for one after some text.
LIVE = Live(marker="<tool_call>", max_tokens=200)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    engine = strict_engine(tmp_path_factory, TEMPLATE)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    yield from strict_live.serve(engine)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return strict_live.connect(server)


def test_the_template_is_read_as_the_xml_format(engine):
    from edgeprefill.server.tools import call_format

    assert call_format(engine.manifest) == "qwen3_xml"


@pytest.mark.parametrize("parallel", [False, True])
def test_a_strict_call_follows_its_schema_and_the_text_before_it_is_free(client, parallel):
    strict_live.check_a_strict_call_then_free_text(client, LIVE, parallel)


def test_streamed_is_the_whole_reply(client):
    whole = strict_live.check_streamed_is_the_whole_reply(client, LIVE)
    assert whole.message.tool_calls, whole


def test_a_strict_and_a_loose_tool_together(client):
    """Once a call starts its name is a listed tool's; a strict tool's arguments follow
    its schema, a non-strict tool's are any parameters (the grammar tests below show a
    loose tool's arguments outside its schema pass). Here the model calls the strict
    get_time (a loose value is free text, which this random model never ends)."""
    choice = chat(client, LIVE, [tool("get_time", True), tool("get_weather", None)]).choices[0]
    calls = strict_live.complete_calls(choice)
    assert calls, choice
    for call in calls:
        assert call.function.name == "get_time", call
        assert valid("get_time", json.loads(call.function.arguments)), call


def test_the_messages_api_honours_strict_under_auto(server, client):
    strict_live.check_the_messages_api_text_then_a_strict_use(server, client, LIVE)


# -- the grammar, token by token -------------------------------------------------------

TOOLS = [tool("get_weather", True), tool("get_time", None)]


def xml_call(name: str, parameters: list[tuple[str, str]]) -> str:
    """A call as Qwen3.5's template writes it: each element on its own line."""
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters)
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


GOOD = xml_call("get_weather", [("city", "Bern"), ("days", "2")])


def takes(engine, text: str, tools: list[dict] = TOOLS) -> bool:
    """Whether the lazy grammar takes `text` as a whole reply, token by token."""
    from edgeprefill.sdk.constraints import compile_constraint
    from edgeprefill.server.strict_tools import lazy_call_constraint

    tokenizer, vocab = engine.tokenizer, engine.tokenizer.vocab_size
    constraint = lazy_call_constraint(tuple(tools), "qwen3_xml")
    mask = compile_constraint(constraint, tokenizer, sorted(engine.eos))
    return follows(mask, vocab, tokenizer.encode_plain(text)) and \
        bool(mask.allowed(vocab)[min(engine.eos)])


def parsed(text: str, tools: list[dict] = TOOLS) -> list[tuple[str, dict]]:
    """The calls the server's XmlParser reads in `text`, arguments typed by the schemas."""
    from edgeprefill.server.tool_parsers import XmlParser

    parser = XmlParser()
    parser.schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    return [(c.name, json.loads(c.arguments)) for c in parser.parse(text).calls]


def test_the_grammar_takes_valid_calls_that_the_parser_reads_as_valid(engine):
    loose = xml_call("get_time", [("zone", "Mars"), ("extra", "null"), ("n", "3")])
    odd = xml_call("get_weather", [("city", " 好\nnull?"), ("days", "7")])
    replies = [
        f"Sure, 好. {GOOD} Done.",
        f"{GOOD}\n{odd}",
        f"Hi {loose}",
        "No call.",
        "",
    ]
    for reply in replies:
        assert takes(engine, reply), reply
        for name, arguments in parsed(reply):
            assert name in SCHEMAS
            assert name == "get_time" or valid(name, arguments), (reply, arguments)
    assert parsed(replies[1]) == [("get_weather", {"city": "Bern", "days": 2}),
                                  ("get_weather", {"city": " 好\nnull?", "days": 7})]
    assert parsed(replies[2]) == [("get_time", {"zone": "Mars", "extra": None, "n": "3"})]


def test_the_grammar_refuses_what_breaks_the_format_or_the_schema(engine):
    city, days = ("city", "Bern"), ("days", "2")
    bad = {
        "an unlisted tool": xml_call("get_news", []),
        "an unlisted key": xml_call("get_weather", [city, days, ("x", "1")]),
        "a key twice": xml_call("get_weather", [city, city, days]),
        "a required key missing": xml_call("get_weather", [city]),
        "the keys out of the schema's order": xml_call("get_weather", [days, city]),
        "an integer that is a word": xml_call("get_weather", [city, ("days", "two")]),
        "an integer written as a float": xml_call("get_weather", [city, ("days", "2.0")]),
        "an integer out of range": xml_call("get_weather", [city, ("days", "9")]),
        "a string too long": xml_call("get_weather", [("city", "Bernbernbern"), days]),
        "a string the parser reads as null": xml_call("get_weather", [("city", " NULL"), days]),
        "a loose value holding a close tag": xml_call("get_time", [("zone", "</tool_call>")]),
        "text inside the call": GOOD.replace("<parameter=city>", "hey <parameter=city>"),
        "no newline after the open tag": GOOD.replace("<tool_call>\n", "<tool_call>"),
        "a call left open": GOOD.removesuffix("</tool_call>"),
    }
    for why, text in bad.items():
        assert not takes(engine, f"Sure. {text}"), why


def test_each_parameter_type_is_written_as_the_parser_reads_it(engine):
    """integer, number, boolean, null, a string enum, an object: the grammar's text for
    each is what XmlParser's _typed reads back as that type (and nothing else)."""
    schema = {"type": "object", "additionalProperties": False,
              "required": ["n", "x", "ok", "none", "unit", "where"],
              "properties": {
                  "n": {"type": "integer"}, "x": {"type": "number"},
                  "ok": {"type": "boolean"}, "none": {"type": "null"},
                  "unit": {"type": "string", "enum": ["C", "F"]},
                  "where": {"type": "object", "required": ["lat"],
                            "properties": {"lat": {"type": "number"},
                                           "name": {"type": "string"}}},
                  "note": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema,
                                               "strict": True}}]
    values = {"n": "-3", "x": "2.5e1", "ok": "true", "none": "null", "unit": "F",
              "where": '{"lat": 1.5, "name": "a<b"}'}
    text = xml_call("f", list(values.items()))
    assert takes(engine, text, tools), text
    assert parsed(text, tools) == [("f", {"n": -3, "x": 25.0, "ok": True, "none": None,
                                          "unit": "F",
                                          "where": {"lat": 1.5, "name": "a<b"}})]
    assert takes(engine, xml_call("f", [*values.items(), ("note", "x")]), tools)  # optional
    wrong = [("n", "1.5"), ("x", "one"), ("ok", "yes"), ("none", "0"), ("unit", "K"),
             ("where", '{"lat": 1, "name": "</parameter>"}'), ("note", "a</function>b"),
             ("note", " Null")]
    for key, value in wrong:
        text = xml_call("f", list({**values, key: value}.items()))
        assert not takes(engine, text, tools), (key, value)


def test_a_schema_the_plain_text_cannot_hold_is_a_one_line_400():
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.strict_tools import lazy_call_constraint

    for spec in ({"type": "string", "pattern": "^[a-z]+$"}, {"anyOf": [{"type": "string"}]},
                 {"type": "array", "items": {"type": "string", "format": "date"}}):
        schema = {"type": "object", "properties": {"p": spec}, "required": ["p"]}
        tools = ({"type": "function", "function": {"name": "f", "parameters": schema,
                                                   "strict": True}},)
        with pytest.raises(ApiError) as err:
            lazy_call_constraint(tools, "qwen3_xml")
        assert err.value.status == 400 and "'p'" in err.value.message
        assert "\n" not in err.value.message


@pytest.mark.parametrize("name", ["a>b", "two\nlines", " padded", ""])
def test_a_parameter_name_the_format_cannot_write_is_a_400_that_says_what_works(name):
    """The remedy is one that works: forcing the call (its JSON holds the name, as the
    forced constraint's schema shows) or renaming; not dropping strict, after which the
    parser could not read the name back either."""
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.strict_tools import lazy_call_constraint
    from edgeprefill.server.tool_parsers import XmlParser
    from edgeprefill.server.tools import parse_tools

    schema = {"type": "object", "properties": {name: {"type": "integer"}}, "required": [name]}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema,
                                             "strict": True}}
    with pytest.raises(ApiError) as err:
        lazy_call_constraint((tool,), "qwen3_xml")
    message = err.value.message
    assert err.value.status == 400 and repr(name) in message and "\n" not in message
    assert "force the call with tool_choice" in message and "rename" in message
    assert "drop strict" not in message
    forced = parse_tools({"tools": [tool], "tool_choice": {"type": "function",
                                                           "function": {"name": "f"}}})
    assert forced is not None and name in forced.schema()["properties"]
    # Without strict the model's XML could not carry the name: the parser reads another.
    written = f"<tool_call>\n<function=f>\n<parameter={name}>\n1\n</parameter>\n" \
        "</function>\n</tool_call>"
    calls = XmlParser().parse(written).calls
    assert not calls or name not in json.loads(calls[0].arguments)
