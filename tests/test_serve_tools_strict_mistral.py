"""`strict: true` tools under `tool_choice: "auto"` in the Mistral call format: free text,
then `[TOOL_CALLS]` and a JSON list of calls that ends the reply (server/strict_tools.py).

The tiny random model of tests/strict_live.py behind a chat template in the Mistral
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

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from tests import strict_live  # noqa: E402
from tests.strict_live import Live, chat, follows, strict_engine, tool  # noqa: E402

MARKER = "[TOOL_CALLS]"
LIVE = Live(marker=MARKER)
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
    yield from strict_live.serve(engine)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return strict_live.connect(server)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_strict_call_follows_its_schema_and_the_text_before_it_is_free(client, parallel):
    before = strict_live.text_before_the_calls(client, LIVE)
    choice = chat(client, LIVE, [tool("get_weather", True)],
                  parallel_tool_calls=parallel).choices[0]
    calls = strict_live.complete_calls(choice)
    assert calls and choice.finish_reason == "tool_calls", repr(choice.message.content)
    strict_live.assert_weather_calls(calls)
    # The greedy text up to the marker is the model's own (valid UTF-8 here: the text
    # before a special marker must be), and nothing follows the list.
    assert choice.message.content == before


def test_the_text_before_the_calls_streams_as_content(client):
    tools = [tool("get_weather", True)]
    whole = chat(client, LIVE, tools).choices[0]
    streamed = strict_live.stream(client, LIVE, tools)
    texts = [d.content for d in streamed.deltas if d.content]
    first_call = next(i for i, d in enumerate(streamed.deltas) if d.tool_calls)
    assert texts and all(not d.content for d in streamed.deltas[first_call:])  # text, calls
    assert "".join(texts) == whole.message.content
    assert streamed.calls == [c.function.arguments for c in whole.message.tool_calls]
    assert streamed.finish_reason == whole.finish_reason == "tool_calls"


def test_a_strict_and_a_loose_tool_together(client):
    """Once the calls start each names a listed tool; a strict tool's arguments follow
    its schema, a non-strict tool's are any JSON object (the grammar tests below show a
    loose tool's arguments outside its schema pass)."""
    strict_live.check_a_strict_and_a_loose_tool_together(client, LIVE)


def test_the_messages_api_honours_strict_under_auto(server, client):
    claude = strict_live.claude_client(server)
    before = strict_live.text_before_the_calls(client, LIVE)
    reply = strict_live.strict_messages_reply(claude, LIVE)
    uses = strict_live.tool_uses(reply)
    assert uses and reply.content[0].type == "text", reply.content
    assert reply.content[0].text == before
    strict_live.assert_a_valid_weather_use(uses)


# -- the grammar, token by token -------------------------------------------------------

def mask_for(engine, tools: list[dict], parallel: bool = True, special: bool = True):
    """strict_live.mask_for in this format."""
    return strict_live.mask_for(engine, "mistral", tools, parallel, special)


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
    from edgeprefill.server.strict_tools import lazy_call_constraint

    tools = (tool("get_weather", True),)
    ids = engine.tokenizer.special_ids
    with pytest.raises(ApiError) as err:
        lazy_call_constraint(tools, "mistral", True, {**ids, "<think>": 3}, thinks=True)
    assert err.value.status == 400 and "reasoning model" in err.value.message
    assert "\n" not in err.value.message
    lazy_call_constraint(tools, "mistral", True, ids, thinks=True)  # tags in plain text
    lazy_call_constraint(tools, "mistral", True, {**ids, "<think>": 3})  # does not think
