"""`strict: true` tools under `tool_choice: "auto"` in the Mistral call format: free text,
then `[TOOL_CALLS]` and a JSON list of calls that ends the reply (server/strict_tools.py).

The tiny random model of test_serve_tools_strict behind a chat template in the Mistral
format and a tokenizer with `[TOOL_CALLS]` as a special token (as current Mistral
tokenizers have it); a bias on that token's logit makes the greedy reply open the calls
after some text. Without strict what follows is the model's noise; with strict it is a
list of calls to listed tools whose arguments validate against their schemas. The
grammar itself is checked token by token, the marker as the special token and spelled
in plain text."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("edgeprefill.sdk.constraints")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests.test_serve import free_port  # noqa: E402
from tests.test_serve_tools_strict import (  # noqa: E402
    MAX_TOKENS,
    QUESTION,
    WEATHER_SCHEMA,
    chat,
    complete_calls,
    strict_engine,
    tool,
    valid,
)

MARKER = "[TOOL_CALLS]"
BIAS = 5.0  # on [TOOL_CALLS]'s logit: the greedy reply opens the calls after some text
# Mistral's shape: the tools listed up front, [INST] turns, calls after [TOOL_CALLS].
TEMPLATE = (
    "{% if tools %}[AVAILABLE_TOOLS] {% for t in tools %}{{ t.function.name }} "
    "{{ t.function.parameters | tojson }} {% endfor %}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS] {{ m.content }} [/TOOL_RESULTS]"
    "{% elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    "{{ c.function | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}]</s>"
    "{% else %}{{ m.content }}</s>{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    engine = strict_engine(tmp_path_factory, TEMPLATE, added=(), special=(MARKER,),
                           biases={MARKER: BIAS})
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    with ServerThread(create_app(engine, ServerConfig(model_name="bpe")),
                      port=free_port()) as server:
        yield server


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def text_before_the_calls(client, tools: list[dict]) -> str:
    """The unconstrained greedy reply's text before it opens the calls: a non-strict
    request's, whose would-be calls are noise that stays text (the special marker is kept
    in the reply's text: sdk/tokenizer.py's KEPT_SPECIAL_TOKENS)."""
    reply = chat(client, tools).choices[0]
    assert reply.message.tool_calls is None, reply  # the noise does not parse as calls
    text = reply.message.content
    assert MARKER in text, text
    before = text[:text.index(MARKER)].rstrip()
    assert before, "the bias should let some text come first"
    return before


@pytest.mark.parametrize("parallel", [False, True])
def test_a_strict_call_follows_its_schema_and_the_text_before_it_is_free(client, parallel):
    before = text_before_the_calls(client, [tool("get_weather", None)])
    choice = chat(client, [tool("get_weather", True)], parallel_tool_calls=parallel).choices[0]
    calls = complete_calls(choice)
    assert calls and choice.finish_reason == "tool_calls", repr(choice.message.content)
    for call in calls:
        assert call.function.name == "get_weather", call
        assert valid("get_weather", json.loads(call.function.arguments)), call
    # The greedy text up to the marker is the model's own (valid UTF-8 here: the text
    # before a special marker must be), and nothing follows the list.
    assert choice.message.content == before


def test_the_text_before_the_calls_streams_as_content(client):
    tools = [tool("get_weather", True)]
    whole = chat(client, tools).choices[0]
    chunks = list(chat(client, tools, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    texts = [d.content for d in deltas if d.content]
    first_call = next(i for i, d in enumerate(deltas) if d.tool_calls)
    assert texts and all(not d.content for d in deltas[first_call:])  # text, then calls
    assert "".join(texts) == whole.message.content
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for piece in delta.tool_calls or ():
            calls.setdefault(piece.index, []).append(piece.function.arguments or "")
    assert ["".join(c) for c in calls.values()] == \
        [c.function.arguments for c in whole.message.tool_calls]
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "tool_calls"


def test_a_strict_and_a_loose_tool_together(client):
    """Once the calls start each names a listed tool; a strict tool's arguments follow
    its schema, a non-strict tool's are any JSON object (the grammar tests below show a
    loose tool's arguments outside its schema pass)."""
    choice = chat(client, [tool("get_time", None), tool("get_weather", True)]).choices[0]
    calls = complete_calls(choice)
    assert calls, choice
    for call in calls:
        arguments = json.loads(call.function.arguments)
        assert isinstance(arguments, dict)
        assert call.function.name in ("get_time", "get_weather")
        if call.function.name == "get_weather":
            assert valid("get_weather", arguments), call


def test_the_messages_api_honours_strict_under_auto(server, client):
    anthropic = pytest.importorskip("anthropic")
    before = text_before_the_calls(client, [tool("get_weather", None)])
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    reply = claude.messages.create(
        model="bpe", messages=QUESTION, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "input_schema": WEATHER_SCHEMA, "strict": True}])
    uses = [block for block in reply.content if block.type == "tool_use"]
    assert uses and reply.content[0].type == "text", reply.content
    assert reply.content[0].text == before
    assert uses[0].name == "get_weather" and valid("get_weather", uses[0].input), uses[0]


# -- the grammar, token by token -------------------------------------------------------

def mask_for(engine, tools: list[dict], parallel: bool = True, special: bool = True):
    """A fresh mask of the lazy grammar on the engine's tokenizer; `special`: the grammar
    knows the marker's special token (as the server passes it), else only its text."""
    from edgeprefill.sdk.constraints import compile_constraint
    from edgeprefill.server.strict_tools import lazy_call_constraint, special_token_ids

    ids = special_token_ids(engine.tokenizer) if special else {}
    constraint = lazy_call_constraint(tuple(tools), "mistral", parallel, ids)
    return compile_constraint(constraint, engine.tokenizer, sorted(engine.eos))


def reply_ids(engine, text: str, calls: str, marker: str = "token") -> list[int]:
    """Token ids of `text`, the marker (its special token, or its text one byte a token)
    and `calls`."""
    tokenizer = engine.tokenizer
    if marker == "token":
        opening = [tokenizer.tokenizer.token_to_id(MARKER)]
    else:
        opening = [tokenizer.encode_plain(c)[0] for c in MARKER]
    assert tokenizer.decode(opening) == MARKER
    return [*tokenizer.encode_plain(text), *opening, *tokenizer.encode_plain(calls)]


def call(name: str, arguments: dict) -> dict:
    return {"name": name, "arguments": arguments}


GOOD = [call("get_weather", {"city": "Bern", "days": 2})]


def follows(mask, vocab: int, ids: list[int]) -> bool:
    """Whether the mask allows each token in turn, as sampling meets them (llguidance's
    validate_tokens refuses a special token that its mask allows in free text)."""
    for token in ids:
        if not mask.allowed(vocab)[token]:
            return False
        mask.accept(token)
    return True


def ends_here(mask, vocab: int, eos: set[int]) -> bool:
    """Whether the reply must end now: the mask allows the end of a turn and nothing else."""
    return set(mask.allowed(vocab).nonzero()[0].tolist()) <= eos and mask.allowed(vocab).any()


@pytest.mark.parametrize("marker", ["token", "text"])
def test_the_grammar_takes_text_then_a_list_of_valid_calls_then_the_end(engine, marker):
    vocab, eos = engine.tokenizer.vocab_size, set(engine.eos)
    tools = [tool("get_weather", True), tool("get_time", None)]
    two = [*GOOD, call("get_time", {"zone": "Mars", "extra": [1]})]  # loose: any object
    for calls in (GOOD, two):
        mask = mask_for(engine, tools)
        ids = reply_ids(engine, "Sure, 好.", json.dumps(calls), marker)
        assert follows(mask, vocab, ids), engine.tokenizer.decode(ids)
        assert ends_here(mask, vocab, eos)  # nothing after the list
    mask = mask_for(engine, tools)
    assert follows(mask, vocab, engine.tokenizer.encode_plain("No call."))
    assert mask.allowed(vocab)[min(eos)]  # a reply of text alone


@pytest.mark.parametrize("marker", ["token", "text"])
def test_the_grammar_refuses_what_breaks_the_format(engine, marker):
    vocab = engine.tokenizer.vocab_size
    tools = [tool("get_weather", True), tool("get_time", None)]
    bad = {
        "an unlisted tool": [call("get_news", {})],
        "an extra property": [call("get_weather", {"city": "Bern", "days": 2, "x": 1})],
        "a value off the schema": [call("get_weather", {"city": "Bern", "days": 9})],
        "no call": [],
    }
    for why, calls in bad.items():
        ids = reply_ids(engine, "Sure.", json.dumps(calls), marker)
        assert not follows(mask_for(engine, tools), vocab, ids), why


def test_without_parallel_calls_the_list_holds_one(engine):
    vocab, eos = engine.tokenizer.vocab_size, set(engine.eos)
    tools = [tool("get_weather", True)]
    two = reply_ids(engine, "Sure.", json.dumps([*GOOD, *GOOD]), "token")
    assert follows(mask_for(engine, tools), vocab, two)
    assert not follows(mask_for(engine, tools, parallel=False), vocab, two)
    mask = mask_for(engine, tools, parallel=False)
    assert follows(mask, vocab, reply_ids(engine, "Sure.", json.dumps(GOOD), "token"))
    assert ends_here(mask, vocab, eos)


def test_a_grammar_that_knows_only_the_marker_s_text_leaves_the_token_free(engine):
    """Why the server passes the special tokens: llguidance matches a special token only
    as a token, never as the text `[TOOL_CALLS]`; a grammar without it takes the model's
    own marker as free text, and what follows is unconstrained."""
    vocab = engine.tokenizer.vocab_size
    tools = [tool("get_weather", True)]
    unlisted = json.dumps([call("get_news", {})])
    assert follows(mask_for(engine, tools, special=False), vocab,
                   reply_ids(engine, "Sure.", unlisted, "token"))
    assert not follows(mask_for(engine, tools, special=False), vocab,
                       reply_ids(engine, "Sure.", unlisted, "text"))


def test_a_bundle_that_thinks_with_special_think_tags_refuses_strict_in_one_line(engine):
    """With `[TOOL_CALLS]` a special token the text before the calls is valid UTF-8, which
    no special token is: a `<think>` token could never open the reasoning (nor `</think>`
    close it). Refused, as LFM2's pythonic format refuses it; tags in plain text hold."""
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.strict_tools import lazy_call_constraint, special_token_ids

    tools = (tool("get_weather", True),)
    ids = special_token_ids(engine.tokenizer)
    with pytest.raises(ApiError) as err:
        lazy_call_constraint(tools, "mistral", True, {**ids, "<think>": 3}, thinks=True)
    assert err.value.status == 400 and "reasoning model" in err.value.message
    assert "\n" not in err.value.message
    lazy_call_constraint(tools, "mistral", True, ids, thinks=True)  # tags in plain text
    lazy_call_constraint(tools, "mistral", True, {**ids, "<think>": 3})  # does not think
