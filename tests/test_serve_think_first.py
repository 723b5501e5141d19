"""Structured output on a model that thinks: the think block free, the answer held to the
schema (sdk/think_first.py), and the reply split as reasoning and content.

The model is tests/strict_live.py's: a tiny random model behind a byte-level BPE
tokenizer with Qwen's `<think>` and `</think>` as added, non-special tokens, and a bias
on `</think>`'s logit, so that greedy decoding writes a short thought and closes it. Two
chat templates: Qwen3's way (the reply may open its block; with enable_thinking false
the prompt holds an empty, closed one) and DeepSeek-R1's (the prompt opens the block).
The JSON is checked against the schema key by key (no jsonschema here)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("edgeprefill.sdk.constraints")
pytest.importorskip("tests.bpe_tokenizers")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.sdk.constraints import Constraint, compile_constraint  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests.strict_live import strict_engine  # noqa: E402
from tests.test_serve import free_port  # noqa: E402

TAGS = ("<think>", "</think>")
CLOSE_BIAS = 3.0  # on </think>: the greedy thought is a dozen tokens, then closed
QWEN3 = (
    "{% for m in messages %}{{ m.role }}: {% if m.reasoning_content %}<think>"
    "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% if enable_thinking is defined and "
    "not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
R1 = QWEN3.replace("{% if enable_thinking is defined and not enable_thinking %}"
                   "<think>\n\n</think>\n\n{% endif %}", "<think>\n")
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
QUESTION = [{"role": "user", "content": "hello"}]
MAX_TOKENS = 60


def valid(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and \
        isinstance(value["n"], int) and not isinstance(value["n"], bool)


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> Iterator[dict[str, Engine]]:
    engines = {name: strict_engine(tmp_path_factory, template, TAGS,
                                   {"</think>": CLOSE_BIAS})
               for name, template in (("qwen3", QWEN3), ("r1", R1))}
    yield engines
    for engine in engines.values():
        engine.close()


def serve(engine: Engine, **config) -> ServerThread:
    app = create_app(engine, ServerConfig(model_name="bpe", **config))
    return ServerThread(app, port=free_port())


@pytest.fixture(scope="module")
def servers(engines) -> Iterator[dict[str, ServerThread]]:
    with serve(engines["qwen3"]) as qwen3, serve(engines["r1"]) as r1:
        yield {"qwen3": qwen3, "r1": r1}


def chat(server: ServerThread, **options):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(model="bpe", messages=QUESTION, temperature=0,
                                          max_tokens=MAX_TOKENS, **options)


def parts(message) -> tuple[str, str]:
    """A message's or a delta's (reasoning_content, content)."""
    return (message.model_extra or {}).get("reasoning_content") or "", message.content or ""


@pytest.mark.parametrize("style", ["qwen3", "r1"])
def test_response_format_lets_a_thinking_model_think_then_holds_the_answer(servers, style):
    """It was a grammar from the first token: no `<think>` block could be written, and
    the reply was not split. Now the thought is reasoning_content and the JSON the
    content, whole and streamed."""
    reply = chat(servers[style], response_format=FORMAT)
    thought, answer = parts(reply.choices[0].message)
    assert thought and "</think>" not in thought and valid(answer), (thought, answer)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.model_extra["reasoning"] == thought
    chunks = list(chat(servers[style], response_format=FORMAT, stream=True))
    deltas = [parts(c.choices[0].delta) for c in chunks if c.choices]
    assert ("".join(d[0] for d in deltas), "".join(d[1] for d in deltas)) == (thought, answer)


def test_the_grammar_leaves_the_model_s_own_thought_alone(servers):
    """Where the prompt opens the block, the free reply's reasoning is the constrained
    reply's: the grammar masks nothing before `</think>`."""
    free = parts(chat(servers["r1"]).choices[0].message)
    constrained = parts(chat(servers["r1"], response_format=FORMAT).choices[0].message)
    assert free[0] and constrained[0] == free[0]
    assert not valid_or_none(free[1]) and valid(constrained[1])


def valid_or_none(text: str) -> bool:
    try:
        return valid(text)
    except (ValueError, AttributeError):
        return False


def test_with_thinking_off_the_grammar_governs_the_whole_reply_as_before(servers):
    """enable_thinking false: the prompt closes the block, and the grammar rules from the
    first token (the model cannot open a block; left to it, it does: see above)."""
    for off in ({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
                {"reasoning_effort": "none"}):
        message = chat(servers["qwen3"], response_format=FORMAT, **off).choices[0].message
        assert parts(message)[0] == "" and valid(message.content), message
        assert "reasoning_content" not in (message.model_extra or {})


def test_without_the_reasoning_parser_the_grammar_governs_the_whole_reply(engines):
    with serve(engines["qwen3"], reasoning_parser="none") as server:
        message = chat(server, response_format=FORMAT).choices[0].message
    assert valid(message.content) and "reasoning_content" not in (message.model_extra or {})


def test_a_forced_tool_choice_still_governs_the_whole_reply(servers):
    tool = {"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}
    message = chat(servers["r1"], tools=[tool], tool_choice="required").choices[0].message
    assert valid(message.tool_calls[0].function.arguments)
    assert "reasoning_content" not in (message.model_extra or {})


def test_a_thinking_budget_closes_the_block_and_the_grammar_holds_the_answer(servers,
                                                                             engines):
    """It was a 400 (a budget beside a grammar over the whole reply): the grammar now
    leaves the block free, so the budget's forced close is text it takes."""
    free = parts(chat(servers["r1"], response_format=FORMAT).choices[0].message)
    capped = chat(servers["r1"], response_format=FORMAT,
                  extra_body={"thinking_token_budget": 3}).choices[0].message
    thought, answer = parts(capped)
    assert thought and free[0].startswith(thought.rstrip("\ufffd")) and \
        len(thought) < len(free[0]), (thought, free)
    assert valid(answer)
    with serve(engines["r1"], reasoning_budget=3) as server:  # the server's default budget
        default = chat(server, response_format=FORMAT).choices[0].message
    assert parts(default) == (thought, answer)


def test_a_budget_beside_a_grammar_over_the_whole_reply_is_still_a_400(servers):
    off = {"chat_template_kwargs": {"enable_thinking": False}, "thinking_token_budget": 3}
    with pytest.raises(openai.BadRequestError) as err:
        chat(servers["qwen3"], response_format=FORMAT, extra_body=off)
    assert err.value.body["param"] == "thinking_token_budget"
    assert "\n" not in err.value.body["message"]


def test_ollama_s_format_with_think_returns_thinking_and_json_content(servers):
    body = {"model": "bpe", "messages": QUESTION, "format": SCHEMA, "think": True,
            "stream": False, "options": {"temperature": 0, "num_predict": MAX_TOKENS}}
    reply = httpx.post(f"{servers['qwen3'].url}/api/chat", json=body, timeout=60).json()
    message = reply["message"]
    assert message.get("thinking") and valid(message["content"]), reply
    off = httpx.post(f"{servers['qwen3'].url}/api/chat", json={**body, "think": False},
                     timeout=60).json()["message"]
    assert not off.get("thinking") and valid(off["content"]), off


def test_the_responses_api_s_text_format_thinks_first_too(servers):
    body = {"model": "bpe", "input": "hello", "temperature": 0, "max_output_tokens": 60,
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}}
    reply = httpx.post(f"{servers['r1'].url}/v1/responses", json=body, timeout=60).json()
    kinds = [item["type"] for item in reply["output"]]
    assert kinds == ["reasoning", "message"], reply
    assert reply["output"][0]["content"][0]["text"]
    assert valid(reply["output"][1]["content"][0]["text"])


# -- the mask, token by token (llguidance's own matcher) -----------------------------------


def mask_of(engine: Engine, opened: bool):
    constraint = Constraint.json_schema(SCHEMA).thinking_first()
    return compile_constraint(constraint, engine.tokenizer, sorted(engine.eos), opened)


def allowed_bytes(engine: Engine, mask) -> set[bytes]:
    vocab = engine.tokenizer.vocab_size
    return {engine.tokenizer.token_bytes(int(i)) for i in mask.allowed(vocab).nonzero()[0]}


def accept_text(engine: Engine, mask, text: str) -> None:
    """`text` written as the sampler would: at each step a token the mask allows, the
    longest that spells the text's next bytes (llguidance allows only its own spelling
    of bytes the grammar forces: after the blanks, `{"` of `{"ok":`, not `{`)."""
    tokenizer, data = engine.tokenizer, text.encode()
    while data:
        allowed = mask.allowed(tokenizer.vocab_size).nonzero()[0]
        spelled = [int(i) for i in allowed if tokenizer.token_bytes(int(i))
                   and data.startswith(tokenizer.token_bytes(int(i)))]
        assert spelled, (text, data)
        token = max(spelled, key=lambda i: len(tokenizer.token_bytes(i)))
        mask.accept(token)
        data = data[len(tokenizer.token_bytes(token)):]


def free(engine: Engine, allowed: set[bytes]) -> bool:
    """Every token but those llguidance keeps for special tokens (0xFF...)."""
    vocab = engine.tokenizer.vocab_size
    every = {engine.tokenizer.token_bytes(i) for i in range(vocab)}
    return all(b.startswith(b"\xff") for b in every - allowed)


def blanks_then_object(allowed: set[bytes]) -> bool:
    """Each allowed token is at most two blanks, then at most the object's `{"`."""
    def fits(piece: bytes) -> bool:
        rest = piece.lstrip(b" \n")
        return len(piece) - len(rest) <= 2 and rest in (b"", b"{", b'{"')
    return bool(allowed) and all(fits(b) for b in allowed) and b"{" in allowed


def answer_only(allowed: set[bytes], *starts: bytes) -> bool:
    """Each allowed token is a prefix of one of `starts`, or runs on past one."""
    return bool(allowed) and all(any(s.startswith(b) or b.startswith(s) for s in starts)
                                 for b in allowed)


def test_the_mask_is_free_inside_the_block_and_the_schema_s_after_it(engines):
    engine = engines["qwen3"]
    tokenizer = engine.tokenizer
    mask = mask_of(engine, opened=False)
    # The reply opens a block, or goes straight to the answer.
    assert answer_only(allowed_bytes(engine, mask), b"<think>", b"{")
    accept_text(engine, mask, "<think>")
    half = next(i for i in range(tokenizer.vocab_size)
                if tokenizer.token_bytes(i) == "好".encode()[:1])
    for token in [*tokenizer.encode_plain('hmm {"no": <think> json'), half]:
        assert free(engine, allowed_bytes(engine, mask))  # (this step's mask)
        mask.accept(token)
    accept_text(engine, mask, "</think>")
    # Two blanks at most, then the schema's object: its keys, compact.
    assert blanks_then_object(allowed_bytes(engine, mask))
    accept_text(engine, mask, '\n\n{"ok":')
    assert answer_only(allowed_bytes(engine, mask), b"true", b"false")
    accept_text(engine, mask, 'true,"n":7}')
    assert mask.finished


def test_a_block_the_prompt_opened_is_free_text_from_the_first_token(engines):
    engine = engines["r1"]
    mask = mask_of(engine, opened=True)
    assert free(engine, allowed_bytes(engine, mask))  # no `<think>` to write, no answer yet
    accept_text(engine, mask, "a thought")
    accept_text(engine, mask, "</think>")
    assert blanks_then_object(allowed_bytes(engine, mask))


@pytest.fixture(scope="module")
def special_engine(tmp_path_factory) -> Iterator[Engine]:
    """The qwen3 template's model with the think tags as special tokens, as some
    tokenizers register them."""
    engine = strict_engine(tmp_path_factory, QWEN3, (), {"</think>": CLOSE_BIAS},
                           special=TAGS)
    yield engine
    engine.close()


@pytest.mark.parametrize("opened", [False, True])
def test_think_tags_that_are_special_tokens_open_and_close_the_block(special_engine,
                                                                    opened):
    """llguidance matches a special token only as a token, never as the text of a
    literal: the block opens with the `<think>` token (it had allowed only the tag's
    text, which the model does not write) and the `</think>` token closes it, after
    which the answer is held (it had run on as free reasoning text)."""
    engine, vocab = special_engine, special_engine.tokenizer.vocab_size
    open_id, close_id = (engine.tokenizer.special_ids[tag] for tag in TAGS)
    mask = mask_of(engine, opened)
    if not opened:
        assert mask.allowed(vocab)[open_id]
        mask.accept(open_id)
    for token in engine.tokenizer.encode_plain("a thought"):
        mask.allowed(vocab)
        mask.accept(token)
    assert mask.allowed(vocab)[close_id]
    mask.accept(close_id)
    assert blanks_then_object(allowed_bytes(engine, mask))


def test_with_no_block_the_answer_is_held_from_the_first_token(engines):
    engine = engines["qwen3"]
    mask = mask_of(engine, opened=False)
    accept_text(engine, mask, "{")
    assert answer_only(allowed_bytes(engine, mask), b'"ok":', b'"n":')
    accept_text(engine, mask, '"ok":false,"n":1}')
    assert mask.finished
