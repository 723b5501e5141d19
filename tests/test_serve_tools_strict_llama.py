"""`strict: true` tools under `tool_choice: "auto"` in the Llama 3 JSON call format: a
reply of calls alone (`{"name": ..., "parameters": {...}}`, several separated by "; "),
`<|python_tag|>` first or not, or a text that the parser cannot take for calls
(server/strict_tools.py's llama3_grammar).

The tiny random model of tests/strict_live.py behind a chat template in Llama 3.1's
shape and a tokenizer with `<|python_tag|>` as a special token (as Llama 3's has it); a
bias on the `{` token's logit makes the greedy reply open with `{`. Without strict what
follows is the model's noise, and the whole reply stays text (the parser's rule); with
strict it is calls to listed tools whose arguments validate against their schemas. The
grammar itself is checked token by token."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

openai = pytest.importorskip("openai")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests import strict_live  # noqa: E402
from tests.strict_live import Live, chat, follows, strict_engine, tool  # noqa: E402
from tests.test_serve import free_port  # noqa: E402

TAG = "<|python_tag|>"
LIVE = Live(marker=TAG)  # the reply opens with its calls: no text before them
HEADER_END = "<|end_header_id|>"  # a special token, as in Llama 3's tokenizer
BIAS = 8.0  # on `{`'s logit for a reply's first token: the greedy reply opens with it
# Llama 3.1's shape, shortened (no blank line after a header): the tools in the last
# user turn, a call in the history written back as `{"name": ..., "parameters": ...}`,
# results in ipython turns.
TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'user' %}<|start_header_id|>user<|end_header_id|>"
    "{% if tools and loop.last %}{% for t in tools %}{{ t.function.name }} "
    "{{ t.function.parameters | tojson }} {% endfor %}{% endif %}{{ m.content }}<|eot_id|>"
    "{% elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>"
    "{{ m.content }}<|eot_id|>"
    "{% elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>"
    "{% for c in m.tool_calls %}{\"name\": \"{{ c.function.name }}\", \"parameters\": "
    "{{ c.function.arguments | tojson }}}{% endfor %}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>"
    "{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
    "{% endif %}"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    engine = strict_engine(tmp_path_factory, TEMPLATE, added=(), special=(TAG, HEADER_END),
                           biases={})
    open_with_a_brace(engine)
    yield engine
    engine.close()


def open_with_a_brace(engine: Engine) -> None:
    """A bias on `{` for a reply's first token only (the logits of a row whose last token
    is the prompt's last, the special `<|end_header_id|>`): biased all along, the model
    fills the strings of a loose tool's arguments with `{` until max_tokens."""
    run, brace = engine.backend.run, engine.tokenizer.encode_plain("{")
    header_end = engine.tokenizer.tokenizer.token_to_id(HEADER_END)
    assert len(brace) == 1 and header_end is not None

    def biased(step):
        logits = run(step).copy()
        last = step.input_ids[np.arange(step.rows), step.valid_lens - 1]
        logits[last == header_end, brace[0]] += BIAS
        return logits

    engine.backend.run = biased


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    yield from strict_live.serve(engine)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return strict_live.connect(server)


def test_the_template_is_read_as_the_llama3_json_format(engine):
    from edgeprefill.server.tools import call_format

    assert call_format(engine.manifest) == "llama3_json"


def test_unconstrained_the_reply_opens_with_a_brace_that_is_no_call(client):
    """The bias at work, and what strict must change: a non-strict request's reply opens
    with `{`, is no call, and is text."""
    reply = chat(client, LIVE, [tool("get_weather", None)]).choices[0]
    assert reply.message.tool_calls is None, reply
    assert reply.message.content.lstrip().startswith("{"), reply.message.content


@pytest.mark.parametrize("parallel", [False, True])
def test_a_strict_call_follows_its_schema_and_is_the_whole_reply(client, parallel):
    choice = chat(client, LIVE, [tool("get_weather", True)],
                  parallel_tool_calls=parallel).choices[0]
    calls = strict_live.complete_calls(choice)
    assert calls and choice.finish_reason == "tool_calls", repr(choice.message.content)
    assert len(calls) == 1 or parallel
    strict_live.assert_weather_calls(calls)
    assert not choice.message.content  # the whole reply is calls


def test_the_calls_stream_as_they_come(client):
    tools = [tool("get_weather", True)]
    whole = chat(client, LIVE, tools).choices[0]
    streamed = strict_live.stream(client, LIVE, tools)
    assert not any(d.content for d in streamed.deltas)
    assert streamed.calls and \
        streamed.calls == [c.function.arguments for c in whole.message.tool_calls]
    assert streamed.finish_reason == whole.finish_reason == "tool_calls"


def test_the_format_refuses_strict_for_a_bundle_that_thinks():
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.strict_tools import lazy_call_constraint

    lazy_call_constraint((tool("get_weather", True),), "llama3_json")  # a grammar
    with pytest.raises(ApiError) as err:
        lazy_call_constraint((tool("get_weather", True),), "llama3_json", thinks=True)
    assert err.value.status == 400 and "reasoning model" in err.value.message
    assert "\n" not in err.value.message


@pytest.mark.slow  # its own export and server (~5 s): the server passes bundle_thinks
def test_a_reasoning_model_in_this_format_refuses_strict_in_one_line(tmp_path_factory):
    """A bundle whose replies may open with a think block (the template renders a past
    turn's reasoning in <think> tags, as DeepSeek-R1-Distill-Llama's does): the grammar's
    choice of calls or text would be the think block's, so strict under auto is the same
    one-line 400 the formats without a grammar give, not half a grammar."""
    thinking = TEMPLATE.replace(
        "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>",
        "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>"
        "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}")
    engine = strict_engine(tmp_path_factory, thinking, added=(), special=(TAG, HEADER_END),
                           biases={})
    try:
        with ServerThread(create_app(engine, ServerConfig(model_name="bpe")),
                          port=free_port()) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.BadRequestError) as err:
                chat(client, LIVE, [tool("get_weather", True)])
            assert err.value.body["param"] == "tools"
            assert "reasoning model" in err.value.body["message"], err.value.body
            loose = chat(client, LIVE, [tool("get_weather", None)]).choices[0]  # as before
            assert loose.finish_reason in ("stop", "length", "tool_calls")
    finally:
        engine.close()


def test_a_strict_and_a_loose_tool_together(client):
    """Each call names a listed tool; a strict tool's arguments follow its schema, a
    non-strict tool's are any JSON object."""
    strict_live.check_a_strict_and_a_loose_tool_together(client, LIVE)


def test_the_messages_api_honours_strict_under_auto(server):
    reply = strict_live.strict_messages_reply(strict_live.claude_client(server), LIVE)
    uses = strict_live.tool_uses(reply)
    assert uses and reply.stop_reason == "tool_use", reply.content
    strict_live.assert_a_valid_weather_use(uses)


# -- the grammar, token by token -------------------------------------------------------

def mask_for(engine, tools: list[dict], parallel: bool = True, special: bool = True):
    """strict_live.mask_for in this format."""
    return strict_live.mask_for(engine, "llama3_json", tools, parallel, special)


def reply_ids(engine, text: str, tag: str = "") -> list[int]:
    """Token ids of `tag` (its special token: "token"; its text one byte a token: "text";
    none: "") and then `text`."""
    tokenizer = engine.tokenizer
    opening = {"": [], "token": [tokenizer.tokenizer.token_to_id(TAG)],
               "text": [tokenizer.encode_plain(c)[0] for c in TAG]}[tag]
    return [*opening, *tokenizer.encode_plain(text)]


def call(name: str, parameters: dict) -> str:
    return json.dumps({"name": name, "parameters": parameters})


GOOD = call("get_weather", {"city": "Bern", "days": 2})
TOOLS = [tool("get_weather", True), tool("get_time", None)]


def ends_here(mask, engine, or_separator: bool = False) -> bool:
    """Whether the reply must end now: the mask allows the end of a turn and nothing else
    (`or_separator`: or a token that opens the separator of another call)."""
    allowed = set(mask.allowed(engine.tokenizer.vocab_size).nonzero()[0].tolist())
    eos = set(engine.eos)
    others = {engine.tokenizer.token_bytes(i) for i in allowed - eos}
    return bool(allowed & eos) and all(or_separator and b"; ".startswith(b) for b in others)


def takes(engine, text: str, tag: str = "", parallel: bool = True) -> bool:
    """Whether the grammar takes `text` (after `tag`) as a whole reply."""
    vocab, eos = engine.tokenizer.vocab_size, set(engine.eos)
    mask = mask_for(engine, TOOLS, parallel)
    return follows(mask, vocab, reply_ids(engine, text, tag)) and \
        bool(mask.allowed(vocab)[min(eos)])


@pytest.mark.parametrize("tag", ["", "token", "text"])
def test_the_grammar_takes_calls_then_the_end(engine, tag):
    vocab = engine.tokenizer.vocab_size
    loose = call("get_time", {"zone": "Mars", "extra": [1]})  # a loose tool: any object
    for calls in (GOOD, f" {GOOD}", f"{GOOD}; {loose}"):
        mask = mask_for(engine, TOOLS)
        ids = reply_ids(engine, calls, tag)
        assert follows(mask, vocab, ids), engine.tokenizer.decode(ids)
        assert ends_here(mask, engine, or_separator=True)  # nothing but another call


def test_the_grammar_takes_a_text_that_does_not_open_with_a_brace(engine):
    for text in ("No call.", "  好 {not a call}", "\n\nSure: {\"name\": 1}", "", " ",
                 "<|python"):
        assert takes(engine, text), text


@pytest.mark.parametrize("tag", ["", "token", "text"])
def test_the_grammar_refuses_what_breaks_the_format(engine, tag):
    bad = {
        "an unlisted tool": call("get_news", {}),
        "an extra property": call("get_weather", {"city": "Bern", "days": 2, "x": 1}),
        "a value off the schema": call("get_weather", {"city": "Bern", "days": 9}),
        "the arguments under another key": json.dumps(
            {"name": "get_weather", "arguments": {"city": "Bern", "days": 2}}),
        "text after the call": f"{GOOD} Done.",
        "a second call after another separator": f"{GOOD}\n{GOOD}",
        "a text that opens with a brace": "{the weather}",
        "a brace after blanks that Python strips": "\u3000\t{}",
        "text after the tag": "Sure.",
    }
    for why, text in bad.items():
        if why == "text after the tag" and not tag:
            continue
        assert not takes(engine, text, tag), why


def test_without_parallel_calls_the_reply_holds_one(engine):
    two = f"{GOOD}; {GOOD}"
    assert takes(engine, two) and not takes(engine, two, parallel=False)
    mask = mask_for(engine, TOOLS, parallel=False)
    assert follows(mask, engine.tokenizer.vocab_size, reply_ids(engine, GOOD))
    assert ends_here(mask, engine)


def test_the_blanks_are_those_python_strips():
    """The parser strips str.strip's blanks before it looks for `{`; the grammar's class
    is every one of them (none lies above the range it scans)."""
    from edgeprefill.server.strict_tools import PY_BLANKS

    blanks = {chr(int(code, 16)) for code in PY_BLANKS.strip("\\x{}").split("}\\x{")}
    assert blanks == {chr(c) for c in range(0x110000) if chr(c).isspace()}


def test_the_grammar_s_calls_are_what_the_parser_reads(engine):
    """An independent check on the format: what the grammar takes as calls, the server's
    Llama 3 parser reads as those calls, the tag dropped by the detokenizer or not."""
    from edgeprefill.server.tool_parsers import Llama3JsonParser

    two = f"{GOOD}; {call('get_time', {'zone': 'UTC'})}"
    for tag in ("", "token", "text"):
        assert takes(engine, two, tag)
        parser = Llama3JsonParser()
        text = engine.tokenizer.decode(reply_ids(engine, two, tag))
        pieces = [*parser.feed(text), *parser.finish()]
        assert [(p.call.name, json.loads(p.call.arguments)) for p in pieces if p.call] == [
            ("get_weather", {"city": "Bern", "days": 2}), ("get_time", {"zone": "UTC"})]
