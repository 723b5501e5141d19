"""`tool_choice: "required"` and a named function, forced through a JSON-schema constraint,
with the official `openai` client: a random model (a locally trained byte-level BPE
tokenizer, so it can spell JSON) calls the tool by construction, and the round trip goes
on with the tool's result. Runs where the SDK has constrained decoding."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("edgeprefill.sdk.constraints")
bpe = pytest.importorskip("tests.bpe_tokenizers")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests.conftest import build_hf_model  # noqa: E402
from tests.test_serve import free_port  # noqa: E402

VOCAB = 400
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city", "days"],
        "properties": {"city": {"type": "string", "maxLength": 8},
                       "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
QUESTION = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[openai.OpenAI]:
    from edgeprefill.export.exporter import ExportOptions, export

    model = build_hf_model("llama", tmp_path_factory.mktemp("bpe-tools"), vocab_size=VOCAB)
    bpe.install(bpe.byte_level_bpe(VOCAB), model)
    out = tmp_path_factory.mktemp("bpe-tools-bundle")
    export(model, out, ExportOptions(chunks=(16, 64), max_context=512, show_progress=False,
                                     overwrite=True))
    engine = Engine.load(out, threads=2, kv_slots=2)
    with ServerThread(create_app(engine, ServerConfig(model_name="bpe")),
                      port=free_port()) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    engine.close()


def check_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "days"} and isinstance(args["city"], str)
    assert len(args["city"]) <= 8 and 1 <= args["days"] <= 7


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_named_function_is_called_by_construction(client, temperature):
    reply = client.chat.completions.create(
        model="bpe", messages=QUESTION, tools=[WEATHER, TIME], temperature=temperature,
        seed=1, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and choice.message.content is None
    check_weather(call.function.arguments)


def test_required_calls_a_listed_tool_and_the_round_trip_goes_on(client):
    reply = client.chat.completions.create(
        model="bpe", messages=QUESTION, tools=[WEATHER, TIME], temperature=1.0, seed=3,
        max_tokens=80, tool_choice="required", parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    if call.function.name == "get_weather":
        check_weather(call.function.arguments)
    else:
        assert json.loads(call.function.arguments)["zone"] in ("UTC", "CET")
    # The tool's result goes back; the model answers (in text: tool_choice none).
    history = [*QUESTION, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    answer = client.chat.completions.create(
        model="bpe", messages=history, tools=[WEATHER, TIME], tool_choice="none",
        max_tokens=5, temperature=0)
    assert answer.choices[0].message.tool_calls is None
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens


def test_a_forced_call_streams_as_tool_call_deltas(client):
    chunks = list(client.chat.completions.create(
        model="bpe", messages=QUESTION, tools=[WEATHER], temperature=0, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True))
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks
             if c.choices and c.choices[0].delta.tool_calls]
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    check_weather("".join(c.function.arguments or "" for c in calls))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def spaceless(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_forced_call_max_tokens_cuts_is_still_a_call(client, choice):
    """max_tokens ends a forced reply early: its calls are still calls (the last with the
    arguments it got, as a streamed call cut short), never the reply's JSON as content;
    one token short of the whole list, the call is whole."""
    def ask(max_tokens: int, stream: bool = False):
        return client.chat.completions.create(
            model="bpe", messages=QUESTION, tools=[WEATHER, TIME], temperature=0,
            max_tokens=max_tokens, tool_choice=choice, parallel_tool_calls=False,
            stream=stream)

    whole = ask(80)
    (call,) = whole.choices[0].message.tool_calls
    tokens = whole.usage.completion_tokens
    for cut in (tokens - 1, tokens // 2):
        reply = ask(cut).choices[0]
        assert reply.finish_reason == "length" and not reply.message.content, reply
        (got,) = reply.message.tool_calls
        assert got.function.name == call.function.name
        assert spaceless(call.function.arguments).startswith(
            spaceless(got.function.arguments)), (got, call)
        streamed = [c.choices[0].delta for c in ask(cut, stream=True) if c.choices]
        assert not "".join(d.content or "" for d in streamed)
        assert "".join(t.function.arguments or "" for d in streamed
                       for t in d.tool_calls or []) == got.function.arguments
    # one token short of `]` (required) or of `}` (named): the whole call / a prefix
    if choice == "required":
        assert ask(tokens - 1).choices[0].message.tool_calls[0].function.arguments == \
            call.function.arguments


def test_a_forced_call_and_response_format_together_are_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="bpe", messages=QUESTION, tools=[WEATHER], tool_choice="required",
            response_format={"type": "json_object"})
    assert err.value.body["param"] == "tool_choice"


def test_a_forced_call_with_ignore_eos_is_a_400_not_a_500(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="bpe", messages=QUESTION, tools=[WEATHER], tool_choice="required",
            extra_body={"ignore_eos": True})
    assert err.value.body["param"] == "tool_choice"


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"},
                                    {"type": "any", "disable_parallel_tool_use": True}])
def test_the_messages_api_s_tool_choice_forces_a_tool_use_block(client, choice):
    """Anthropic's `tool_choice` `tool` is the chat route's named function, `any` its
    `required`."""
    anthropic = pytest.importorskip("anthropic")
    claude = anthropic.Anthropic(base_url=str(client.base_url).removesuffix("/v1/"),
                                 api_key="unused", max_retries=0)
    function = WEATHER["function"]
    # strict: honoured here, where the forced call is constrained to the schema
    tool = {"name": function["name"], "input_schema": function["parameters"], "strict": True}
    reply = claude.messages.create(
        model="bpe", messages=QUESTION, tools=[tool], max_tokens=80,
        tool_choice=choice, extra_body={"temperature": 0})
    assert reply.stop_reason == "tool_use"
    (call,) = reply.content
    assert call.type == "tool_use" and call.name == "get_weather"
    check_weather(json.dumps(call.input))
