"""`strict: true` tools under `tool_choice: "auto"`: free text, but a call the model starts
follows a lazy grammar (server/strict_tools.py), on the three APIs.

A tiny random model (a locally trained byte-level BPE tokenizer with Qwen's `<tool_call>`
and `</tool_call>` as added, non-special tokens; a chat template in the Hermes format)
rarely calls a tool by itself: a bias on the `<tool_call>` token's logit, added in the
backend, makes it open one after some text. Without strict what follows is the model's
noise; with strict it is a call to a listed tool whose arguments validate against the
tool's schema (checked key by key: the dev environment has no jsonschema), and the text
before it is the unconstrained greedy text. The model, its server and the checks that the
other formats' files share are tests/strict_live.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal

import pytest

openai = pytest.importorskip("openai")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests import strict_live  # noqa: E402
from tests.strict_live import (  # noqa: E402
    MAX_TOKENS,
    QUESTION,
    WEATHER_SCHEMA,
    Live,
    chat,
    strict_engine,
    tool,
    valid,
)
from tests.test_serve import free_port  # noqa: E402

LIVE = Live(marker="<tool_call>")
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


@pytest.mark.parametrize("parallel", [False, True])
def test_a_strict_call_follows_its_schema_and_the_text_before_it_is_free(client, parallel):
    strict_live.check_a_strict_call_then_free_text(client, LIVE, parallel)


def test_streamed_is_the_whole_reply(client):
    strict_live.check_streamed_is_the_whole_reply(client, LIVE)


def test_a_strict_and_a_loose_tool_together(client):
    """Once a call starts its name is a listed tool's; a strict tool's arguments follow
    its schema, a non-strict tool's are any JSON object."""
    strict_live.check_a_strict_and_a_loose_tool_together(client, LIVE)


def test_the_responses_api_honours_strict_under_auto(client):
    before = strict_live.text_before_the_calls(client, LIVE)
    function = {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA,
                "strict": True}
    reply = client.responses.create(model="bpe", input="hello", tools=[function],
                                    temperature=0, max_output_tokens=MAX_TOKENS)
    calls = [item for item in reply.output if item.type == "function_call"]
    texts = [item for item in reply.output if item.type == "message"]
    assert calls and texts[0].content[0].text.startswith(before), reply.output
    assert valid("get_weather", json.loads(calls[0].arguments)), calls[0]


def test_the_messages_api_honours_strict_under_auto(server, client):
    strict_live.check_the_messages_api_text_then_a_strict_use(server, client, LIVE)


def test_strict_with_response_format_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, LIVE, [tool("get_weather", True)], response_format={"type": "json_object"})
    assert err.value.body["param"] == "tools"


def test_a_call_format_without_a_lazy_grammar_refuses_strict_in_one_line():
    from edgeprefill.server.errors import ApiError
    from edgeprefill.server.strict_tools import lazy_call_constraint

    with pytest.raises(ApiError) as err:
        lazy_call_constraint((tool("get_weather", True),), "harmony")
    assert err.value.status == 400 and "harmony" in err.value.message
    assert "\n" not in err.value.message


def test_a_marker_spelled_in_pieces_triggers_the_grammar(engine):
    """`<tool_call>` written as plain-text tokens (`<`, `tool`, `_call`, `>`), not the added
    token, after a token that is half a character: the call is held to the grammar all
    the same."""
    from edgeprefill.sdk.constraints import compile_constraint
    from edgeprefill.server.strict_tools import lazy_call_constraint

    tokenizer = engine.tokenizer
    constraint = lazy_call_constraint((tool("get_weather", True),), "hermes")
    mask = compile_constraint(constraint, tokenizer, sorted(engine.eos))
    vocab = tokenizer.vocab_size
    half = next(i for i in range(vocab) if tokenizer.token_bytes(i) == "好".encode()[:1])
    marker = [tokenizer.encode_plain(c)[0] for c in "<tool_call>"]  # one byte each
    prefix = [*tokenizer.encode_plain("hello"), half, *marker]
    for token in prefix:
        allowed = mask.allowed(vocab)
        # Free text: every token but those llguidance keeps for special tokens (0xFF...).
        refused = [i for i in range(vocab) if not allowed[i]]
        assert all(tokenizer.token_bytes(i).startswith(b"\xff") for i in refused), refused
        mask.accept(token)
    allowed = mask.allowed(vocab)
    opening = {tokenizer.token_bytes(int(i)) for i in allowed.nonzero()[0]}
    assert opening and all(b.strip(b" \n") in (b"", b"{", b'{"') for b in opening), opening


@pytest.mark.parametrize("bound,admitted", [({}, True), ({"maximum": 10}, False),
                                            ({"minimum": -10}, False)])
def test_a_number_a_float_cannot_hold_is_held_to_the_schema(engine, bound, admitted):
    """The strict grammar (llguidance's %json) admits `1e400` for an unbounded number,
    which the parser keeps as written: valid JSON the schema admits (JSON's numbers have
    no range). A bounded number admits no such literal: the call never breaks its
    schema's bound (an exponent is refused at its `e`)."""
    from edgeprefill.server.tool_parsers import TaggedParser

    schema = {"type": "object", "additionalProperties": False, "required": ["x"],
              "properties": {"x": {"type": "number", **bound}}}
    tools = [{"type": "function", "function": {"name": "f", "strict": True,
                                               "parameters": schema}}]
    tokenizer, vocab = engine.tokenizer, engine.tokenizer.vocab_size
    # What the grammar forces as its tokenizer spells it, the number a byte each.
    head = tokenizer.encode_plain('hello<tool_call>\n{"name": "f", "arguments": {"x": 1')
    rest = [*tokenizer.encode_plain("e"), *tokenizer.encode_plain("400"),
            *tokenizer.encode_plain("}}\n</tool_call>")]
    mask = strict_live.mask_for(engine, "hermes", tools)
    assert strict_live.follows(mask, vocab, head)
    assert bool(mask.allowed(vocab)[rest[0]]) is admitted
    if admitted:
        assert strict_live.follows(mask, vocab, rest)
        (parsed,) = TaggedParser().parse(tokenizer.decode([*head, *rest])).calls
        assert parsed.arguments == '{"x": 1e400}'
        assert json.loads(parsed.arguments, parse_float=Decimal) == {"x": Decimal("1e400")}


def test_ollama_s_chat_honours_strict_too(server, client):
    """/api/chat passes its function tools to the chat route as they are, `strict` too."""
    httpx = pytest.importorskip("httpx")
    before = strict_live.text_before_the_calls(client, LIVE)
    reply = httpx.post(f"{server.url}/api/chat", timeout=60, json={
        "model": "bpe", "messages": QUESTION, "tools": [tool("get_weather", True)],
        "stream": False, "options": {"temperature": 0, "num_predict": MAX_TOKENS}}).json()
    calls = reply["message"].get("tool_calls") or []
    assert calls and reply["message"]["content"].startswith(before), reply
    function = calls[0]["function"]
    assert function["name"] == "get_weather" and valid("get_weather", function["arguments"])


# -- strict tools and a thinking budget ----------------------------------------------------

# TEMPLATE with Qwen3.5's reasoning: the generation prompt opens the think block, and an
# earlier reply's reasoning is written back inside its tags.
THINKING = TEMPLATE.replace(
    "{% else %}{{ m.role }}: {{ m.content }} ; {% endif %}",
    "{% else %}{{ m.role }}: {% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
    "</think>{% endif %}{{ m.content }} ; {% endif %}").replace(
    "{% if add_generation_prompt %}assistant: {% endif %}",
    "{% if add_generation_prompt %}assistant: <think>{% endif %}")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory) -> Iterator[Engine]:
    """The biased model thinking first: it never closes its block by itself, and opens
    calls inside it."""
    assert THINKING.count("<think>") == 2
    engine = strict_engine(tmp_path_factory, THINKING)
    yield engine
    engine.close()


def thinking_server(engine: Engine, budget: int = -1) -> ServerThread:
    config = ServerConfig(model_name="bpe", reasoning_budget=budget)
    return ServerThread(create_app(engine, config), port=free_port())


def test_a_thinking_budget_caps_the_reasoning_of_a_strict_reply(thinker):
    """It was a 400 (the SDK refused a budget beside any constraint) and the server's
    --reasoning-budget was left out of such a reply: the lazy grammar leaves the text
    free, so the close is forced there as in a reply without tools."""
    httpx = pytest.importorskip("httpx")
    body = {"model": "bpe", "messages": QUESTION, "tools": [tool("get_weather", True)],
            "temperature": 0, "max_tokens": 40}
    with thinking_server(thinker) as server:
        url = f"{server.url}/v1/chat/completions"
        free = httpx.post(url, json=body, timeout=60).json()["choices"][0]["message"]
        capped = httpx.post(url, json={**body, "thinking_token_budget": 3}, timeout=60)
    assert capped.status_code == 200, capped.text
    message = capped.json()["choices"][0]["message"]
    # The model's own first 3 reasoning tokens (their last character may be cut), then
    # the answer after the forced close.
    reasoning = message["reasoning_content"]
    assert reasoning and free["reasoning_content"].startswith(reasoning.rstrip("\ufffd"))
    assert len(reasoning) < len(free["reasoning_content"]) and message["content"]
    with thinking_server(thinker, budget=3) as server:
        default = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert default.json()["choices"][0]["message"] == message


def test_a_budget_spent_inside_a_call_closes_the_block_after_the_call(thinker):
    """A call the reasoning opened is held by the lazy grammar; a close forced into it
    would have cut `</think>` into the call's JSON. It waits for the call's end: the
    reply is the model's own up to `</tool_call>`, then exactly the closing tokens."""
    from dataclasses import replace

    from edgeprefill.sdk import GenerationParams
    from edgeprefill.sdk.thinking_budget import FORCED_CLOSE
    from edgeprefill.server.strict_tools import lazy_call_constraint

    tokenizer = thinker.tokenizer
    tools = [tool("get_weather", True)]
    # The server's prompt; it ends in <think>: every reply token is reasoning.
    prompt = tokenizer.encode(QUESTION, tools=tools)
    lazy = lazy_call_constraint(tuple(tools), "hermes")
    greedy = GenerationParams(temperature=0, max_new_tokens=MAX_TOKENS, constraint=lazy)
    free = thinker.submit(prompt, greedy, 0, None).result().token_ids

    def end_of(text: str) -> int:
        return next(i for i in range(len(free)) if text in tokenizer.decode(free[:i + 1]))

    opened, closed = end_of("<tool_call>"), end_of("</tool_call>")
    assert closed > opened + 3, tokenizer.decode(free)
    budget = opened + 2  # spent inside the call
    capped = thinker.submit(prompt, replace(greedy, thinking_budget=budget), 0, None)
    tokens = capped.result().token_ids
    close = tokenizer.encode_plain(FORCED_CLOSE)
    assert tokens[:closed + 1] == free[:closed + 1]
    assert tokens[closed + 1:closed + 1 + len(close)] == close
    call = tokenizer.decode(tokens[opened + 1:closed + 1]).removesuffix("</tool_call>")
    arguments = json.loads(call)["arguments"]
    assert valid("get_weather", arguments), call
