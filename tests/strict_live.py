"""What the `strict: true` tool tests share across call formats (test_serve_tools_strict*):
the tiny biased model behind a byte-level BPE tokenizer, its server and client, the
request, and the checks that read the same in every format that has them. Each format's
few differences (the text that opens its calls, its question, the room for a reply) are
a `Live`; the checks take it.

A tiny random model rarely calls a tool by itself: a bias on the logit of the token that
opens a call, added in the backend, makes it open one after some text. Arguments are
checked against the schemas key by key (the dev environment has no jsonschema)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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
WEATHER_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 8},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TIME_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["zone"],
               "properties": {"zone": {"enum": ["UTC", "CET"]}}}
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
QUESTION = [{"role": "user", "content": "hello"}]
TOOL_TAGS = ("<tool_call>", "</tool_call>")


@dataclass(frozen=True)
class Live:
    """A call format's differences in the live tests: `marker` opens its calls in a reply
    (kept in the reply's text when it is a special token: sdk/tokenizer.py's
    KEPT_SPECIAL_TOKENS), `question` is asked, `max_tokens` is the room for a reply."""

    marker: str
    question: list[dict] = field(default_factory=lambda: QUESTION)
    max_tokens: int = MAX_TOKENS


def tool(name: str, strict: bool | None) -> dict:
    function = {"name": name, "parameters": SCHEMAS[name]}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def valid(name: str, arguments: object) -> bool:
    """Whether `arguments` satisfy SCHEMAS[name], keyword by keyword."""
    if not isinstance(arguments, dict):
        return False
    if name == "get_time":
        return set(arguments) == {"zone"} and arguments["zone"] in ("UTC", "CET")
    city, days = arguments.get("city"), arguments.get("days")
    return set(arguments) == {"city", "days"} and isinstance(city, str) and \
        len(city) <= 8 and type(days) is int and 1 <= days <= 7


# -- the model, its server and client -----------------------------------------------------

def bias_calls(engine: Engine, biases: dict[int, float]) -> None:
    """The model leans toward opening a call: a bias on the logit of each token."""
    run = engine.backend.run

    def biased(step):
        logits = run(step).copy()
        for token, bias in biases.items():
            logits[:, token] += bias
        return logits

    engine.backend.run = biased


def strict_engine(tmp_path_factory, template: str, added: tuple[str, ...] = TOOL_TAGS,
                  biases: dict[str, float] | None = None,
                  special: tuple[str, ...] = ()) -> Engine:
    """The biased model (below) behind a byte-level BPE tokenizer and `template`:
    `added` are added, non-special tokens (as Qwen's tags are), `special` added special
    tokens (as Mistral's `[TOOL_CALLS]` is); `biases` (by token) on their logits, BIAS on
    <tool_call>'s by default."""
    from tokenizers import AddedToken

    from edgeprefill.export.exporter import ExportOptions, export

    model = build_hf_model("llama", tmp_path_factory.mktemp("strict"), vocab_size=VOCAB)
    tok = bpe.byte_level_bpe(VOCAB)
    tok.add_tokens([AddedToken(tag, special=False) for tag in added])
    tok.add_special_tokens([AddedToken(tag, special=True) for tag in special])
    bpe.install(tok, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path_factory.mktemp("strict-bundle")
    export(model, out, ExportOptions(chunks=(16, 64), max_context=512, show_progress=False,
                                     overwrite=True))
    engine = Engine.load(out, threads=2, kv_slots=2)
    biases = {"<tool_call>": BIAS} if biases is None else biases
    bias_calls(engine, {tok.token_to_id(tag): bias for tag, bias in biases.items()})
    return engine


def serve(engine: Engine) -> Iterator[ServerThread]:
    """A module's `server` fixture: the engine behind the HTTP server as `bpe`."""
    with ServerThread(create_app(engine, ServerConfig(model_name="bpe")),
                      port=free_port()) as server:
        yield server


def connect(server: ServerThread) -> openai.OpenAI:
    """A module's `client` fixture: the OpenAI client of the server, no retries."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def claude_client(server: ServerThread):
    """The Anthropic client of the server (skips where the package is missing)."""
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


# -- requests -------------------------------------------------------------------------------

def chat(client, live: Live, tools: list[dict], **options):
    """A greedy chat completion of the format's question with `tools`."""
    return client.chat.completions.create(
        model="bpe", messages=live.question, tools=tools, temperature=0,
        max_tokens=live.max_tokens, **options)


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


def all_calls(choice) -> list:
    """The reply's calls, every one (a format whose calls end in a close tag)."""
    return list(choice.message.tool_calls or ())


def text_before_the_calls(client, live: Live) -> str:
    """The unconstrained greedy reply's text before it opens the calls: a request with a
    non-strict get_weather, whose would-be calls are noise that stays text."""
    reply = chat(client, live, [tool("get_weather", None)]).choices[0]
    assert reply.message.tool_calls is None, reply  # the noise does not parse as calls
    text = reply.message.content
    assert live.marker in text, text
    before = text[:text.index(live.marker)].rstrip()
    assert before, "the bias should let some text come first"
    return before


class Streamed(NamedTuple):
    deltas: list  # each chunk's delta, in order
    calls: list[str]  # each call's arguments, its pieces joined, by index
    finish_reason: str | None  # the last chunk's


def stream(client, live: Live, tools: list[dict]) -> Streamed:
    """The same request as `chat`, streamed."""
    chunks = list(chat(client, live, tools, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for piece in delta.tool_calls or ():
            calls.setdefault(piece.index, []).append(piece.function.arguments or "")
    return Streamed(deltas, ["".join(c) for c in calls.values()],
                    chunks[-1].choices[0].finish_reason)


def strict_messages_reply(claude, live: Live):
    """A greedy Messages API reply to the format's question with a strict get_weather."""
    return claude.messages.create(
        model="bpe", messages=live.question, max_tokens=live.max_tokens,
        extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "input_schema": WEATHER_SCHEMA, "strict": True}])


def tool_uses(reply) -> list:
    return [block for block in reply.content if block.type == "tool_use"]


# -- the checks that read the same in several formats ---------------------------------------

def assert_weather_calls(calls: list) -> None:
    """Each call is get_weather's, its arguments valid against its schema."""
    for call in calls:
        assert call.function.name == "get_weather", call
        assert valid("get_weather", json.loads(call.function.arguments)), call


def assert_a_valid_weather_use(uses: list) -> None:
    assert uses[0].name == "get_weather" and valid("get_weather", uses[0].input), uses[0]


def check_a_strict_call_then_free_text(client, live: Live, parallel: bool,
                                       calls_of: Callable[[Any], list] = complete_calls):
    """A strict get_weather's calls follow its schema (one unless `parallel`), and the
    reply's text opens with the unconstrained greedy text before the calls."""
    before = text_before_the_calls(client, live)
    choice = chat(client, live, [tool("get_weather", True)],
                  parallel_tool_calls=parallel).choices[0]
    calls = calls_of(choice)
    assert calls and (len(calls) == 1 or parallel), repr(choice.message.content)
    assert_weather_calls(calls)
    assert (choice.message.content or "").startswith(before)  # then the text after it


def check_streamed_is_the_whole_reply(client, live: Live):
    """The streamed reply's text, calls and finish reason are the whole reply's; returns
    the whole reply's choice."""
    tools = [tool("get_weather", True)]
    whole = chat(client, live, tools).choices[0]
    streamed = stream(client, live, tools)
    assert "".join(d.content or "" for d in streamed.deltas) == (whole.message.content or "")
    assert streamed.calls == [c.function.arguments for c in whole.message.tool_calls]
    assert streamed.finish_reason == whole.finish_reason
    return whole


def check_a_strict_and_a_loose_tool_together(client, live: Live,
                                             calls_of: Callable[[Any], list] = complete_calls):
    """With a loose get_time and a strict get_weather: each call names one of them, its
    arguments a JSON object, get_weather's valid against its schema."""
    choice = chat(client, live, [tool("get_time", None), tool("get_weather", True)]).choices[0]
    calls = calls_of(choice)
    assert calls, choice
    for call in calls:
        arguments = json.loads(call.function.arguments)
        assert isinstance(arguments, dict)
        assert call.function.name in ("get_time", "get_weather")
        if call.function.name == "get_weather":
            assert valid("get_weather", arguments), call


def check_the_messages_api_text_then_a_strict_use(server, client, live: Live) -> None:
    """The Messages API's reply opens with the unconstrained greedy text, then a
    get_weather use whose input follows its schema."""
    claude = claude_client(server)
    before = text_before_the_calls(client, live)
    reply = strict_messages_reply(claude, live)
    uses = tool_uses(reply)
    assert uses and reply.content[0].type == "text", reply.content
    assert reply.content[0].text.startswith(before)
    assert_a_valid_weather_use(uses)


# -- the grammar, token by token --------------------------------------------------------------

def mask_for(engine, call_format: str, tools: list[dict], parallel: bool = True,
             special: bool = True):
    """A fresh mask of the format's lazy grammar on the engine's tokenizer; `special`: the
    grammar knows the marker's special token (as the server passes it), else only its
    text."""
    from edgeprefill.sdk.constraints import compile_constraint
    from edgeprefill.server.strict_tools import lazy_call_constraint

    ids = engine.tokenizer.special_ids if special else {}
    constraint = lazy_call_constraint(tuple(tools), call_format, parallel, ids)
    return compile_constraint(constraint, engine.tokenizer, sorted(engine.eos))


def follows(mask, vocab: int, ids: list[int]) -> bool:
    """Whether the mask allows each token in turn, as sampling meets them (llguidance's
    validate_tokens refuses a special token that its mask allows in free text)."""
    for token in ids:
        if not mask.allowed(vocab)[token]:
            return False
        mask.accept(token)
    return True
