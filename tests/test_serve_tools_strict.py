"""`strict: true` tools under `tool_choice: "auto"`: free text, but a call the model starts
follows a lazy grammar (server/strict_tools.py), on the three APIs.

A tiny random model (a locally trained byte-level BPE tokenizer with Qwen's `<tool_call>`
and `</tool_call>` as added, non-special tokens; a chat template in the Hermes format)
rarely calls a tool by itself: a bias on the `<tool_call>` token's logit, added in the
backend, makes it open one after some text. Without strict what follows is the model's
noise; with strict it is a call to a listed tool whose arguments validate against the
tool's schema (checked key by key: the dev environment has no jsonschema), and the text before it is the unconstrained
greedy text."""

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
BIAS = 2.0  # on <tool_call>'s logit: the greedy reply opens a call after some text
MAX_TOKENS = 120
TEMPLATE = (
    # The tools without `strict`, so that the prompt is the same with and without it.
    "{% if tools %}system: {% for t in tools %}{{ t.function.name }} "
    "{{ t.function.parameters | tojson }} {% endfor %}; {% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<tool_response> {{ m.content }} </tool_response> ; "
    "{% elif m.tool_calls %}assistant: {% for c in m.tool_calls %}<tool_call> "
    "{{ c.function | tojson }} </tool_call> {% endfor %}; "
    "{% else %}{{ m.role }}: {{ m.content }} ; {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
WEATHER_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 8},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TIME_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["zone"],
               "properties": {"zone": {"enum": ["UTC", "CET"]}}}
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
QUESTION = [{"role": "user", "content": "hello"}]


def tool(name: str, strict: bool | None) -> dict:
    function = {"name": name, "parameters": SCHEMAS[name]}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def bias_calls(engine: Engine, token: int, bias: float) -> None:
    """The model leans toward opening a call: `bias` on the logit of `token`."""
    run = engine.backend.run

    def biased(step):
        logits = run(step).copy()
        logits[:, token] += bias
        return logits

    engine.backend.run = biased


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerThread]:
    from tokenizers import AddedToken

    from edgeprefill.export.exporter import ExportOptions, export

    model = build_hf_model("llama", tmp_path_factory.mktemp("strict"), vocab_size=VOCAB)
    tok = bpe.byte_level_bpe(VOCAB)
    tok.add_tokens([AddedToken("<tool_call>", special=False),
                    AddedToken("</tool_call>", special=False)])
    bpe.install(tok, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path_factory.mktemp("strict-bundle")
    export(model, out, ExportOptions(chunks=(16, 64), max_context=512, show_progress=False,
                                     overwrite=True))
    engine = Engine.load(out, threads=2, kv_slots=2)
    bias_calls(engine, tok.token_to_id("<tool_call>"), BIAS)
    with ServerThread(create_app(engine, ServerConfig(model_name="bpe")),
                      port=free_port()) as server:
        yield server
    engine.close()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def chat(client, tools: list[dict], **options):
    return client.chat.completions.create(
        model="bpe", messages=QUESTION, tools=tools, temperature=0, max_tokens=MAX_TOKENS,
        **options)


def raw_text(client, tools: list[dict]) -> str:
    """The unconstrained greedy reply, as the model wrote it (tool_choice none still
    renders no tools, so this asks with the tools rendered and nothing parsed: a plain
    completion of the same prompt)."""
    reply = chat(client, tools)
    return reply.choices[0].message.content or ""


def valid(name: str, arguments: object) -> bool:
    """Whether `arguments` satisfy SCHEMAS[name], keyword by keyword."""
    if not isinstance(arguments, dict):
        return False
    if name == "get_time":
        return set(arguments) == {"zone"} and arguments["zone"] in ("UTC", "CET")
    city, days = arguments.get("city"), arguments.get("days")
    return set(arguments) == {"city", "days"} and isinstance(city, str) and \
        len(city) <= 8 and type(days) is int and 1 <= days <= 7


def complete_calls(choice) -> list:
    """The reply's calls, less a last one max_tokens cut short (its arguments unfinished
    JSON; the bias keeps the model opening calls)."""
    calls = list(choice.message.tool_calls or ())
    if calls and choice.finish_reason == "length":
        try:
            json.loads(calls[-1].function.arguments)
        except ValueError:
            calls.pop()
    return calls


def text_before_the_call(client, tools: list[dict]) -> str:
    """The unconstrained greedy reply's text before it opens a call: a non-strict
    request's, whose would-be call is noise that stays text."""
    reply = chat(client, tools).choices[0]
    assert reply.message.tool_calls is None, reply  # the noise does not parse as a call
    text = reply.message.content
    assert "<tool_call>" in text, text
    before = text[:text.index("<tool_call>")].rstrip()
    assert before, "the bias should let some text come first"
    return before


@pytest.mark.parametrize("parallel", [False, True])
def test_a_strict_call_follows_its_schema_and_the_text_before_it_is_free(client, parallel):
    before = text_before_the_call(client, [tool("get_weather", None)])
    choice = chat(client, [tool("get_weather", True)], parallel_tool_calls=parallel).choices[0]
    calls = complete_calls(choice)
    assert calls and (len(calls) == 1 or parallel), repr(choice.message.content)
    for call in calls:
        assert call.function.name == "get_weather", call
        assert valid("get_weather", json.loads(call.function.arguments)), call
    assert (choice.message.content or "").startswith(before)  # then the text after it
