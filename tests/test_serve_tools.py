"""Tool calls through the server with the official `openai` client: a round trip (call ->
tool result message -> answer), whole and streamed.

A random model does not write tool calls, so the model's choices are a recorded reply:
the backend runs for real (the KV cache is written as always) but its logits are
replaced so that greedy decoding follows a script of token ids. The tokenizer has words
for the Hermes call format, and the chat template renders tools, assistant tool calls
and tool results like Qwen's does; everything between the logits and the client (chat
template, detokenizer, parser, response and stream shapes) is the real thing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from edgeprefill.server.tools import _json_schema_constraint  # noqa: E402
from tests.conftest import follow_tokens, top_word_id, word_bundle  # noqa: E402
from tests.test_serve import MODEL, assert_error, serving  # noqa: E402

EOS = 2
CALL = ['<tool_call>', '{"name":', '"get_weather",', '"arguments":', '{"city":', '"Paris"}}',
        '</tool_call>']
ANSWER = ["It", "is", "sunny", "in", "Paris."]
# Words at the top of the vocabulary; w0..w(VOCAB-len-1) stay as in conftest.
WORDS = ["assistant:", "answer:", *CALL, *ANSWER]
TEMPLATE = (
    "{% if tools %}system: {% for t in tools %}{{ t | tojson }} {% endfor %}; {% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<tool_response> {{ m.content }} </tool_response> ; "
    "{% elif m.tool_calls %}assistant: {% for c in m.tool_calls %}<tool_call> "
    "{{ c.function | tojson }} </tool_call> {% endfor %}; "
    "{% else %}{{ m.role }}: {{ m.content }} ; {% endif %}{% endfor %}"
    # After a tool result the prompt ends with its own word, so the script knows to answer.
    "{% if add_generation_prompt %}{% if messages[-1].role == 'tool' %}answer: "
    "{% else %}assistant: {% endif %}{% endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def word_id(word: str) -> int:
    return top_word_id(WORDS, word)


@pytest.fixture(scope="module")
def tool_bundle(hf_model, tmp_path_factory) -> Path:
    return word_bundle(hf_model, tmp_path_factory, "tools", WORDS, TEMPLATE)


def follow_script(engine: Engine) -> None:
    """Greedy decoding now follows CALL after "assistant:" and ANSWER after "answer:"."""
    following: dict[int, int] = {}
    for start, script in (("assistant:", CALL), ("answer:", ANSWER)):
        ids = [word_id(w) for w in (start, *script)]
        following.update(zip(ids, [*ids[1:], EOS], strict=True))
    follow_tokens(engine, following, EOS)


@pytest.fixture(scope="module")
def server(tool_bundle) -> Iterator[ServerThread]:
    engine = Engine.load(tool_bundle, threads=1, kv_slots=2)
    follow_script(engine)
    with serving(engine) as server:
        yield server
    engine.close()


QUESTION = [{"role": "user", "content": "weather in Paris ?"}]


def ask(client, messages, **options):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                          tools=[WEATHER], **options)


def test_a_tool_call_round_trip_whole(client):
    first = ask(client, QUESTION)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert first.usage.completion_tokens == len(CALL)

    history = [*QUESTION, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    second = ask(client, history)
    assert second.choices[0].message.content == " ".join(ANSWER)
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason == "stop"


def test_a_tool_call_round_trip_streamed(client):
    chunks = list(ask(client, QUESTION, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [d.tool_calls for d in deltas if d.tool_calls]
    assert all(not d.content for d in deltas)  # the call's text is not shown as content
    head, pieces = calls[0][0], [c[0] for c in calls[1:]]  # id/name, then arguments
    assert head.index == 0 and head.id.startswith("call_") and head.type == "function"
    assert head.function.name == "get_weather" and head.function.arguments == ""
    assert len(pieces) == 2  # one per generated token of the arguments
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in pieces)
    arguments = "".join(p.function.arguments for p in pieces)
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    message = {"role": "assistant", "tool_calls": [{
        "id": head.id, "type": "function",
        "function": {"name": head.function.name, "arguments": arguments}}]}
    answer = list(ask(client, [*QUESTION, message, {"role": "tool", "tool_call_id": head.id,
                                                    "content": "sunny"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    assert text == " ".join(ANSWER)
    assert answer[-1].choices[0].finish_reason == "stop"


def streamed_logprobs(chunks) -> list:
    """The logprobs entries of a stream's chunks, in the order they came."""
    return [t for c in chunks if c.choices and c.choices[0].logprobs
            for t in c.choices[0].logprobs.content]


@pytest.mark.parametrize("top", [0, 2])
def test_a_streamed_tool_call_carries_every_tokens_logprobs_once_in_order(client, top):
    """With tools the stream had sent no logprobs at all: the tokens the parser holds
    back, those of the call's deltas and the swallowed tags each have theirs, as in the
    whole reply, one chunk per token (vLLM's shape)."""
    options = {"logprobs": True, "top_logprobs": top}
    whole = ask(client, QUESTION, **options).choices[0].logprobs.content
    assert [t.token for t in whole] == CALL  # the script, tags included
    assert all(len(t.top_logprobs) == top for t in whole)
    chunks = list(ask(client, QUESTION, stream=True, **options))
    assert [t.model_dump() for t in streamed_logprobs(chunks)] == \
        [t.model_dump() for t in whole]
    with_logprobs = [c for c in chunks if c.choices and c.choices[0].logprobs]
    assert all(len(c.choices[0].logprobs.content) == 1 for c in with_logprobs)

    # The deltas add up to the same call as without logprobs.
    calls = [d.tool_calls[0] for c in chunks if c.choices
             for d in [c.choices[0].delta] if d.tool_calls]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(c.function.arguments or "" for c in calls)) == {"city": "Paris"}
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_openai_stream_helper_accumulates_the_call(client):
    with client.chat.completions.stream(model=MODEL, messages=QUESTION, tools=[WEATHER],
                                        temperature=0) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_tools_are_rendered_into_the_prompt_unless_tool_choice_is_none(client):
    with_tools = ask(client, QUESTION, max_tokens=1)
    without = ask(client, QUESTION, max_tokens=1, tool_choice="none")
    tool_words = len(json.dumps(WEATHER).split()) + 2  # "system:" and ";"
    assert with_tools.usage.prompt_tokens == without.usage.prompt_tokens + tool_words
    # With "none" nothing is parsed: the same script comes back as plain text.
    plain = ask(client, QUESTION, tool_choice="none").choices[0].message
    assert plain.tool_calls is None and plain.content == " ".join(CALL)


@pytest.mark.skipif(_json_schema_constraint() is not None,
                    reason="the SDK has constrained decoding: the forced path runs instead")
def test_forced_tool_choice_without_constrained_decoding_is_a_400(server):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        response = httpx.post(f"{server.url}/v1/chat/completions", json={
            "messages": QUESTION, "tools": [WEATHER], "tool_choice": choice})
        error = assert_error(response, 400, "tool_choice", "unsupported_tool_choice")
        assert "edgeprefill.sdk.constraints" in error["message"]


def test_tool_fields_are_checked(server):
    url = f"{server.url}/v1/chat/completions"
    assert_error(httpx.post(url, json={"messages": QUESTION, "tools": [{"type": "x"}]}), 400,
                 "tools[0]")
    bad_history = [*QUESTION, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{nope"}}]}]
    assert_error(httpx.post(url, json={"messages": bad_history}), 400,
                 "messages[1].tool_calls[0].function.arguments")
    assert_error(httpx.post(f"{server.url}/v1/completions", json={
        "prompt": "w5", "tools": [WEATHER]}), 400, "tools")


def test_each_of_n_choices_carries_its_own_tool_call(client):
    whole = ask(client, QUESTION, n=2)
    assert [c.finish_reason for c in whole.choices] == ["tool_calls", "tool_calls"]
    ids = {c.message.tool_calls[0].id for c in whole.choices}
    assert len(ids) == 2  # one call per choice, each with its own id
    chunks = list(ask(client, QUESTION, n=2, stream=True))
    for index in (0, 1):
        deltas = [c.choices[0].delta for c in chunks
                  if c.choices and c.choices[0].index == index]
        calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
        assert calls[0].function.name == "get_weather" and calls[0].index == 0
        arguments = "".join(c.function.arguments or "" for c in calls)
        assert json.loads(arguments) == {"city": "Paris"}
    finals = [c.choices[0].finish_reason for c in chunks if c.choices
              and c.choices[0].finish_reason]
    assert finals == ["tool_calls", "tool_calls"]
