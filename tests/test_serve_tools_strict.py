"""`strict: true` tools under `tool_choice: "auto"`: free text, but a call the model starts
follows a lazy grammar (server/strict_tools.py), on the three APIs.

A tiny random model (a locally trained byte-level BPE tokenizer with Qwen's `<tool_call>`
and `</tool_call>` as added, non-special tokens; a chat template in the Hermes format)
rarely calls a tool by itself: a bias on the `<tool_call>` token's logit, added in the
backend, makes it open one after some text. Without strict what follows is the model's
noise; with strict it is a call to a listed tool whose arguments validate against the
tool's schema (checked key by key: the dev environment has no jsonschema), and the text
before it is the unconstrained greedy text."""

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
TOOL_TAGS = ("<tool_call>", "</tool_call>")


def tool(name: str, strict: bool | None) -> dict:
    function = {"name": name, "parameters": SCHEMAS[name]}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def bias_calls(engine: Engine, biases: dict[int, float]) -> None:
    """The model leans toward opening a call: a bias on the logit of each token."""
    run = engine.backend.run

    def biased(step):
        logits = run(step).copy()
        for token, bias in biases.items():
            logits[:, token] += bias
        return logits

    engine.backend.run = biased


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Engine]:
    engine = strict_engine(tmp_path_factory, TEMPLATE)
    yield engine
    engine.close()


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


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    with ServerThread(create_app(engine, ServerConfig(model_name="bpe")),
                      port=free_port()) as server:
        yield server


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


def test_streamed_is_the_whole_reply(client):
    tools = [tool("get_weather", True)]
    whole = chat(client, tools).choices[0]
    chunks = list(chat(client, tools, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    text = "".join(d.content or "" for d in deltas)
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for piece in delta.tool_calls or ():
            calls.setdefault(piece.index, []).append(piece.function.arguments or "")
    assert text == (whole.message.content or "")
    assert ["".join(c) for c in calls.values()] == \
        [c.function.arguments for c in whole.message.tool_calls]
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_a_strict_and_a_loose_tool_together(client):
    """Once a call starts its name is a listed tool's; a strict tool's arguments follow
    its schema, a non-strict tool's are any JSON object."""
    choice = chat(client, [tool("get_time", None), tool("get_weather", True)]).choices[0]
    calls = complete_calls(choice)
    assert calls, choice
    for call in calls:
        arguments = json.loads(call.function.arguments)
        assert isinstance(arguments, dict)
        assert call.function.name in ("get_time", "get_weather")
        if call.function.name == "get_weather":
            assert valid("get_weather", arguments), call


def test_the_responses_api_honours_strict_under_auto(client):
    before = text_before_the_call(client, [tool("get_weather", None)])
    function = {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA,
                "strict": True}
    reply = client.responses.create(model="bpe", input="hello", tools=[function],
                                    temperature=0, max_output_tokens=MAX_TOKENS)
    calls = [item for item in reply.output if item.type == "function_call"]
    texts = [item for item in reply.output if item.type == "message"]
    assert calls and texts[0].content[0].text.startswith(before), reply.output
    assert valid("get_weather", json.loads(calls[0].arguments)), calls[0]


def test_the_messages_api_honours_strict_under_auto(server, client):
    anthropic = pytest.importorskip("anthropic")
    before = text_before_the_call(client, [tool("get_weather", None)])
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    reply = claude.messages.create(
        model="bpe", messages=QUESTION, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "input_schema": WEATHER_SCHEMA, "strict": True}])
    uses = [block for block in reply.content if block.type == "tool_use"]
    assert uses and reply.content[0].type == "text", reply.content
    assert reply.content[0].text.startswith(before)
    assert uses[0].name == "get_weather" and valid("get_weather", uses[0].input), uses[0]


def test_strict_with_response_format_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, [tool("get_weather", True)], response_format={"type": "json_object"})
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


def test_ollama_s_chat_honours_strict_too(server, client):
    """/api/chat passes its function tools to the chat route as they are, `strict` too."""
    httpx = pytest.importorskip("httpx")
    before = text_before_the_call(client, [tool("get_weather", None)])
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
