"""LFM2's tool calls through the server: Python calls between two special tokens,
`<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>`.

As in test_serve_tools, the backend runs for real and greedy decoding follows a recorded
reply. What is particular here: the two tags are *special* tokens of the tokenizer (as in
LFM2's tokenizer.json), which a reply's text drops like every other special token unless
the detokenizer keeps them, and the template lists tools the LFM2 way (the call format
comes from its `<|tool_list_start|>` marker)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from tests.conftest import follow_tokens, top_word_id, word_bundle  # noqa: E402
from tests.test_serve import MODEL, serving  # noqa: E402

EOS = 2
START, END = "<|tool_call_start|>", "<|tool_call_end|>"
CALL = ["Checking.", START, '[get_weather(city="Paris",', "days=2)]", END]
WORDS = ["assistant:", *CALL]
TEMPLATE = (
    "{% if tools %}system: List of tools: <|tool_list_start|>{{ tools | tojson }}"
    "<|tool_list_end|> ; {% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }} ; {% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "weather in Paris ?"}]


def word_id(word: str) -> int:
    return top_word_id(WORDS, word)


@pytest.fixture(scope="module")
def pythonic_bundle(hf_model, tmp_path_factory) -> Path:
    """The scripted word bundle, its two tags special tokens as LFM2's are."""
    return word_bundle(hf_model, tmp_path_factory, "pythonic", WORDS, TEMPLATE,
                       special=(START, END))


@pytest.fixture(scope="module")
def server(pythonic_bundle) -> Iterator[ServerThread]:
    engine = Engine.load(pythonic_bundle, threads=1, kv_slots=2)
    ids = [word_id(w) for w in ("assistant:", *CALL)]
    follow_tokens(engine, dict(zip(ids, [*ids[1:], EOS], strict=True)), EOS)
    with serving(engine) as server:
        yield server
    engine.close()


def ask(client, **options):
    return client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                          tools=[WEATHER], **options)


def test_the_tags_are_special_tokens_of_the_bundle(pythonic_bundle):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(pythonic_bundle / "tokenizer.json"))
    ids = [word_id(START), word_id(END)]
    assert tokenizer.decode(ids, skip_special_tokens=True) == ""  # dropped by default


def test_a_python_call_between_special_tags_is_a_tool_call(client):
    choice = ask(client).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}


def test_streamed_the_call_follows_the_text(client):
    chunks = list(ask(client, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Checking."
    # The call's id and name, then its arguments whole (at the close tag), as OpenAI
    # shapes a call's deltas.
    head, arguments = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert head.function.name == "get_weather" and head.function.arguments == ""
    assert json.loads(arguments.function.arguments) == {"city": "Paris", "days": 2}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_without_tools_the_reply_keeps_the_tags_as_text(client, pythonic_bundle):
    """Nothing is parsed without tools: the text is what the model wrote, the tags
    included, as transformers decodes it without skipping special tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(pythonic_bundle / "tokenizer.json"))
    written = tokenizer.decode([word_id(w) for w in CALL], skip_special_tokens=False)
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0)
    assert reply.choices[0].message.content == written
    assert START in written and END in written


def test_an_earlier_call_reaches_the_model_as_it_wrote_it(server, client):
    """LFM2's template renders an assistant turn's content only: the call of the turn
    before a tool result goes into that content in the model's own syntax, so the model
    sees its call before the result (the chat route and /tokenize render the same)."""
    import httpx

    call = {"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}
    history = [*QUESTION, {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    ids = httpx.post(f"{server.url}/tokenize", json={"messages": history, "tools": [WEATHER]}
                     ).json()["tokens"]
    written = [word_id(w) for w in CALL]  # "Checking." then the call, tags included
    assert any(ids[i:i + len(written)] == written for i in range(len(ids)))
    reply = client.chat.completions.create(model=MODEL, messages=history, temperature=0,
                                           tools=[WEATHER], max_tokens=2)
    assert reply.usage.prompt_tokens == len(ids)
