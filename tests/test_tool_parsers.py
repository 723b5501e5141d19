"""Tool-call parsing per call format, whole and streamed; the `tools`/`tool_choice` checks.
No model: the replies are recorded texts in each family's format."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("starlette")

from edgeprefill.server.errors import ApiError  # noqa: E402
from edgeprefill.server.tool_parsers import (  # noqa: E402
    PARSERS,
    ForcedNamedParser,
    ForcedRequiredParser,
    ToolParser,
    assemble,
)
from edgeprefill.server.tools import call_format, parse_tools  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {}}}

# (format, reply text, expected content, expected calls as (name, arguments object))
RECORDED = [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
     '"Paris"}}\n</tool_call>', "Let me look.", [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "",
     [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ("hermes", "No tools needed: 2 < 3 and <b>bold</b>.", "No tools needed: 2 < 3 and "
     "<b>bold</b>.", []),
    ("hermes", "<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>",
     []),
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {}}', "", [("get_time", {})]),
    ("hermes", "trailing <tool_ca", "trailing <tool_ca", []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}', "",
     [("get_weather", {"city": "Rome"})]),
    ("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {}}; '
     '{"name": "get_weather", "parameters": {"city": "Lima"}}', "",
     [("get_time", {}), ("get_weather", {"city": "Lima"})]),
    ("llama3_json", "Hello {there}", "Hello {there}", []),
    ("llama3_json", '{"name": "get_time"', '{"name": "get_time"', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Bern"}}]', "",
     [("get_weather", {"city": "Bern"})]),
    ("mistral", '[{"name": "get_time", "arguments": "{}"}]', "", [("get_time", {})]),
    ("mistral", "[1, 2] are numbers", "[1, 2] are numbers", []),
    ("mistral", 'Sure. [TOOL_CALLS] [{"name": "get_time", "arguments": {}}]', "Sure.",
     [("get_time", {})]),  # text first, then the calls (as vLLM parses it)
    ("mistral", "a [TOOL_ reply with no call", "a [TOOL_ reply with no call", []),
    # Mistral's v11+ tokenizers (Mistral Small 3.1+, Ministral 3, Devstral): `name[ARGS]{}`
    # per call, each after its marker (they were the whole reply's text)
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "",
     [("get_weather", {"city": "Paris"})]),
    ("mistral", 'On it.[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time'
     '[ARGS]{}', "On it.", [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ("mistral", '[TOOL_CALLS]get_time[CALL_ID]abc123XYZ[ARGS]{}', "", [("get_time", {})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": NaN}',
     '[TOOL_CALLS]get_weather[ARGS]{"city": NaN}', []),  # no JSON: no call, as before
    # text after the list, or a second list, had made the whole reply text
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}] Let me know.',
     "Let me know.", [("get_time", {})]),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}][TOOL_CALLS][{"name": '
     '"get_weather", "arguments": {"city": "Rome"}}]', "",
     [("get_time", {}), ("get_weather", {"city": "Rome"})]),
    ("pythonic", 'Let me check. <|tool_call_start|>[get_weather(city="Paris", days=3, '
     "metric=True), get_time()]<|tool_call_end|>", "Let me check.",
     [("get_weather", {"city": "Paris", "days": 3, "metric": True}), ("get_time", {})]),
    ("pythonic", "<|tool_call_start|>[get_weather(city='Oslo', hint=null, ok=false)]"
     "<|tool_call_end|> done", " done",
     [("get_weather", {"city": "Oslo", "hint": None, "ok": False})]),  # JSON's names too
    ("pythonic", '<|tool_call_start|>[{"name": "get_time", "arguments": {}}]'
     "<|tool_call_end|>", "", [("get_time", {})]),  # a JSON call object in the list
    ("pythonic", "<|tool_call_start|>[get_weather(city=open('x'))]<|tool_call_end|>",
     "<|tool_call_start|>[get_weather(city=open('x'))]<|tool_call_end|>", []),  # no code
    ("pythonic", "<|tool_call_start|>[get_weather('Rome')]<|tool_call_end|>",
     "<|tool_call_start|>[get_weather('Rome')]<|tool_call_end|>", []),  # positional
    ("pythonic", "<|tool_call_start|>[f(a=1, a=2)]<|tool_call_end|>",
     "<|tool_call_start|>[f(a=1, a=2)]<|tool_call_end|>", []),  # a keyword twice
    ("pythonic", "<|tool_call_start|>[f(a={1, 2})]<|tool_call_end|>",
     "<|tool_call_start|>[f(a={1, 2})]<|tool_call_end|>", []),  # a set is not JSON
    ("pythonic", "<|tool_call_start|>[get_time(", "<|tool_call_start|>[get_time(", []),
    ("pythonic", "x = [1, 2] and f(y=1)", "x = [1, 2] and f(y=1)", []),  # no tags
    # Qwen3.5 / Qwen3-Coder: XML; without a schema every value stays text
    ("qwen3_xml", "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
     "Paris\n</parameter>\n</function>\n</tool_call>", "Let me look.",
     [("get_weather", {"city": "Paris"})]),
    ("qwen3_xml", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n<tool_call>"
     "\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n</function>\n"
     "</tool_call>", "", [("get_time", {}), ("get_weather", {"city": "New York"})]),
    ("qwen3_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo", []),  # cut short
    ("qwen3_xml", "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>", []),  # JSON is not this format
]


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def streamed(parser: ToolParser, text: str, step: int) -> tuple[str, list]:
    pieces = []
    for i in range(0, len(text), step):
        pieces.extend(parser.feed(text[i:i + step]))
    pieces.extend(parser.finish())
    parsed = assemble(pieces)
    return parsed.content, parsed.calls


@pytest.mark.parametrize("fmt, text, content, calls", RECORDED)
def test_whole_reply_parses_into_content_and_calls(fmt, text, content, calls):
    parsed = PARSERS[fmt]().parse(text)
    assert parsed.content == content
    assert calls_of(parsed.calls) == calls
    assert all(c.id.startswith("call_") for c in parsed.calls)


@pytest.mark.parametrize("step", [1, 2, 7])
@pytest.mark.parametrize("fmt, text, content, calls", RECORDED)
def test_streaming_in_any_pieces_gives_the_whole_replys_result(fmt, text, content, calls,
                                                               step):
    got_content, got_calls = streamed(PARSERS[fmt](), text, step)
    assert got_content == content and calls_of(got_calls) == calls


def test_hermes_streams_text_before_a_call_without_waiting_for_the_reply_to_end():
    parser = PARSERS["hermes"]()
    assert [p.text for p in parser.feed("Sure, ")] == ["Sure,"]  # a blank may precede a call
    assert [p.text for p in parser.feed("checking <tool")] == [" checking"]  # tag held back
    assert parser.feed('_call>{"name": "get_ti') == []
    assert parser.feed('me", "arguments": ') == []  # not yet sure the arguments stream
    begin, first = parser.feed('{"zone": "U')
    assert begin.begin.name == "get_time" and begin.begin.arguments == ""
    # The arguments stream as they come, up to the end of their object.
    assert first.arguments == '{"zone": "U'
    assert [p.arguments for p in parser.feed('TC", "x": "}"}')] == ['TC", "x": "}"}']
    assert parser.feed("}\n") == [] and parser.feed("</tool_call>") == []
    assert [p.text for p in parser.feed(" done")] == [" done"]


def test_hermes_sends_a_call_it_cannot_stream_whole_at_its_close_tag():
    parser = PARSERS["hermes"]()
    assert parser.feed('<tool_call>{"arguments": {"a": 1}, "name": "f"}') == []
    (piece,) = parser.feed("</tool_call>")
    assert piece.call.name == "f" and json.loads(piece.call.arguments) == {"a": 1}


def test_forced_replies_parse_to_the_named_or_listed_calls():
    named = ForcedNamedParser("get_weather").parse('{"city": "Paris"}')
    assert calls_of(named.calls) == [("get_weather", {"city": "Paris"})]
    assert named.content == ""
    required = ForcedRequiredParser().parse(
        '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", '
        '"parameters": {"city": "Kyiv"}}]')
    assert calls_of(required.calls) == [("get_time", {}), ("get_weather", {"city": "Kyiv"})]


WHOLE = '[{"name": "get_time", "parameters": {}}, '


@pytest.mark.parametrize("reply, expected", [
    # max_tokens inside the list: the whole calls, then the one cut with what it got
    (WHOLE + '{"name": "get_weather", "parameters": {"ci',
     [("get_time", "{}"), ("get_weather", '{"ci')]),
    (WHOLE + '{"name": "get_weather"', [("get_time", "{}"), ("get_weather", "")]),
    (WHOLE + '{"name": "get_weather", "param', [("get_time", "{}"), ("get_weather", "")]),
    (WHOLE + '{"name": "get_wea', [("get_time", "{}")]),  # no whole name: no call
    (WHOLE.rstrip(", "), [("get_time", "{}")]),  # only the list's `]` missing
    ("[", []),
])
def test_a_forced_required_reply_cut_short_keeps_its_calls(reply, expected):
    parsed = ForcedRequiredParser().parse(reply)
    assert parsed.content == ""
    assert [(c.name, c.arguments) for c in parsed.calls] == expected


def test_a_forced_reply_cut_after_a_call_that_is_none_stays_text():
    """A call that closed with NaN in it is none (as in a whole reply): the cut reply is
    text, not the calls around it."""
    reply = '[{"name": "f", "parameters": {"x": NaN}}, {"name": "g", "parameters": {'
    assert ForcedRequiredParser().parse(reply) == (reply, [])


def test_a_forced_named_reply_cut_short_is_the_call_with_what_it_got():
    parsed = ForcedNamedParser("get_weather").parse('{"city": "Pa')
    assert parsed.content == "" and [(c.name, c.arguments) for c in parsed.calls] == [
        ("get_weather", '{"city": "Pa')]
    # other parsers' replies that are no JSON stay text, as before
    assert PARSERS["llama3_json"]().parse('{"name": "f", "param').content == \
        '{"name": "f", "param'


def manifest(template: str | None, family: str = "llama"):
    return SimpleNamespace(tokenizer=SimpleNamespace(chat_template=template),
                           model=SimpleNamespace(family=family))


@pytest.mark.parametrize("template, family, expected", [
    ("{% if tools %}<tool_call>{% endif %}", "llama", "hermes"),
    ("{{ '[TOOL_CALLS]' }}", "llama", "mistral"),
    ("<|start_header_id|>ipython<|end_header_id|>", "qwen2", "llama3_json"),
    (None, "qwen3", "hermes"),
    (None, "mistral", "mistral"),
    (None, "llama", "llama3_json"),
    ("<|tool_list_start|>{{ tools | tojson }}<|tool_list_end|>", "llama", "pythonic"),
    (None, "lfm2", "pythonic"),
    ("<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>",
     "qwen3", "qwen3_xml"),  # Qwen3.5's and Qwen3-Coder's templates show the XML
    (None, "qwen3_5", "qwen3_xml"),
])
def test_the_call_format_comes_from_the_template_then_the_family(template, family, expected):
    assert call_format(manifest(template, family)) == expected


def test_tool_choice_selects_the_parser_and_what_the_template_sees():
    auto = parse_tools({"tools": [WEATHER, TIME]})
    assert auto.choice == "auto" and auto.template_vars() == {"tools": [WEATHER, TIME]}
    assert type(auto.parser(manifest("<tool_call>"))).__name__ == "TaggedParser"
    none = parse_tools({"tools": [WEATHER], "tool_choice": "none"})
    assert none.template_vars() == {} and none.parser(manifest(None)) is None
    named = parse_tools({"tools": [WEATHER, TIME], "tool_choice": {
        "type": "function", "function": {"name": "get_time"}}})
    assert named.choice == "function" and named.function == "get_time"
    assert named.schema() == {"type": "object", "properties": {}}
    required = parse_tools({"tools": [WEATHER], "tool_choice": "required"})
    item = required.schema()["items"]["anyOf"][0]
    assert item["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert item["properties"]["parameters"] == WEATHER["function"]["parameters"]
    assert "maxItems" not in required.schema()
    single = parse_tools({"tools": [WEATHER], "tool_choice": "required",
                          "parallel_tool_calls": False})
    assert single.schema()["maxItems"] == 1
    assert parse_tools({"messages": []}) is None


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
])
def test_bad_tools_are_a_400_naming_the_field(body, param):
    with pytest.raises(ApiError) as err:
        parse_tools(body)
    assert err.value.status == 400 and err.value.param == param


CUT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'


@pytest.mark.parametrize("text, reason, finish", [
    (CUT, "stop", "stop"),  # the model stopped inside a call: no call to run
    (CUT, "length", "length"),  # max_tokens cut it
    (CUT + 'is"}}\n</tool_call>', "stop", "tool_calls"),
    (CUT + 'is"}}\n</tool_call>\nDone.', "stop", "tool_calls"),  # text after the call
])
def test_a_reply_streamed_or_whole_is_the_same_message(text, reason, finish):
    from edgeprefill.server.responses import Shape

    stream = SimpleNamespace(text=text, finish_reason=reason, logprobs=None, token_ids=[7],
                             metrics=SimpleNamespace(prompt_tokens=1))
    whole = Shape.new(True, "m", PARSERS["hermes"]).whole(stream)
    message = whole["choices"][0]["message"]

    shape = Shape.new(True, "m", PARSERS["hermes"])
    chunks = [c for i in range(0, len(text), 5) for c in shape.chunks(text[i:i + 5])]
    chunks += shape.last_chunks(reason)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    arguments = "".join(t["function"].get("arguments", "")
                        for d in deltas for t in d.get("tool_calls", ()))
    names = [t["function"]["name"] for d in deltas for t in d.get("tool_calls", ())
             if "name" in t["function"]]
    assert [c["function"]["name"] for c in message["tool_calls"]] == names == ["get_weather"]
    assert message["tool_calls"][0]["function"]["arguments"] == arguments
    content = "".join(d.get("content") or "" for d in deltas)
    assert message["content"] == (content or None)
    assert whole["choices"][0]["finish_reason"] == chunks[-1]["choices"][0]["finish_reason"] \
        == finish


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_mistral_calls_get_ids_its_templates_accept(choice):
    # Mistral's templates raise on any tool_call_id but 9 letters or digits: a round trip
    # (the call, then its result with that id) failed with a 400 on the second turn.
    tools = parse_tools({"tools": [WEATHER], "tool_choice": choice})
    make = tools.parser_factory(manifest("{{ '[TOOL_CALLS]' }}", "mistral"))
    marker = "[TOOL_CALLS] " if choice == "auto" else ""
    args = '"parameters"' if choice == "required" else '"arguments"'
    call = make().parse(marker + f'[{{"name": "get_weather", {args}: {{"city": "P"}}}}]').calls[0]
    assert len(call.id) == 9 and call.id.isalnum()
    own = make().parse(marker + f'[{{"name": "get_weather", {args}: {{}}, "id": "abcDEF123"}}]')
    assert own.calls[0].id == "abcDEF123"  # the model's own id, as Mistral's models write
    if choice == "auto":  # v11+: the id after [CALL_ID]
        v11 = make().parse('[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{}')
        assert v11.calls[0].id == "abcDEF123"
    other = parse_tools({"tools": [WEATHER]}).parser_factory(manifest("<tool_call>", "qwen2"))
    assert other().parse('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
                         ).calls[0].id.startswith("call_")


@pytest.mark.parametrize("step", [3, None])
def test_parallel_tool_calls_false_keeps_the_first_call_only(step):
    two = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
           '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    tools = parse_tools({"tools": [WEATHER, TIME], "parallel_tool_calls": False})
    make = tools.parser_factory(manifest("<tool_call>", "qwen2"))
    if step is None:
        calls = make().parse(two).calls
    else:
        calls = streamed(make(), two, step)[1]
    assert calls_of(calls) == [("get_weather", {"city": "Paris"})]
    both = parse_tools({"tools": [WEATHER, TIME]}).parser_factory(manifest("<tool_call>", "qwen2"))
    assert len(both().parse(two).calls) == 2


@pytest.mark.parametrize("template, renders", [
    ("{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}"
     "{% endfor %}", True),
    # Phi-4-mini reads tools from a message, never the request's: the model would not see them.
    ("{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message %}"
     "{{ message['tools'] }}{% endif %}{{ message['content'] }}{% endfor %}", False),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", False),
])
def test_a_template_renders_tools_only_if_it_reads_the_tools_variable(template, renders):
    from edgeprefill.server.tools import renders_tools

    assert renders_tools(template) is renders


def test_a_template_with_a_generation_tag_is_read_by_its_own_environment():
    # SmolLM3-style `{% generation %}` parses only with the environment that renders it: a
    # plain jinja2 parse failed and fell back to finding the word "tools" anywhere.
    from edgeprefill.server.tools import renders_tools

    body = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}"
    assert renders_tools(body + "{% endfor %}{% if tools %}{{ tools }}{% endif %}")
    assert not renders_tools(body + "{{ m['tools'] }}{% endfor %}")


def test_xml_values_are_typed_by_the_tools_schema_as_vllm_types_them():
    """Qwen3.5 writes every value as text; the tool's schema says what it is. The parser
    the request makes carries its tools' schemas."""
    tool = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "code": {"type": "string"}, "nights": {"type": "integer"},
            "price": {"type": "number"}, "late": {"type": "boolean"},
            "guests": {"type": "array"}, "prefs": {"type": "object"}, "note": {"type": "string"},
            "budget": {"type": "number"}}}}}
    values = {"city": "Paris", "code": "007", "nights": "3", "price": "99.5", "late": "True",
              "guests": '["ann", "bo"]', "prefs": "{'view': 'sea'}", "note": "null",
              "budget": "120", "extra": "42"}
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    request = parse_tools({"tools": [tool]})
    parser = request.parser(manifest("<function=", "qwen3"))
    (call,) = parser.parse(f"<tool_call>\n<function=book>\n{body}</function>\n</tool_call>").calls
    assert json.loads(call.arguments) == {
        "city": "Paris", "code": "007", "nights": 3, "price": 99.5, "late": True,
        "guests": ["ann", "bo"], "prefs": {"view": "sea"}, "note": None, "budget": 120,
        "extra": "42"}  # a parameter the schema does not list stays text
