"""`/api/chat` with scripted models and the official `ollama` client: a tool round trip
(a call with its arguments as an object, then its result as a `tool` message naming the
tool), whole and streamed; a thinking model's `thinking` and `think: false`.

The scripts are those of tests/test_serve_tools.py and tests/test_serve_reasoning.py
(the backend runs for real; its logits follow a list of words), as in
tests/test_serve_messages_tools.py, whose fixtures these are."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from tests import test_serve_messages_tools as messages_tools  # noqa: E402
from tests import test_serve_reasoning as thinking  # noqa: E402
from tests.test_serve import MODEL  # noqa: E402
from tests.test_serve_tools import ANSWER, CALL, WEATHER, follow_script  # noqa: E402

tool_bundle = messages_tools.tool_bundle
thinker_server = messages_tools.thinker
QUESTION = [{"role": "user", "content": "weather in Paris ?"}]
GREEDY = {"model": MODEL, "options": {"temperature": 0, "num_predict": 40}}


@pytest.fixture(scope="module")
def tools(tool_bundle) -> Iterator[tuple[ollama.Client, openai.OpenAI]]:
    engine = Engine.load(tool_bundle, threads=1, kv_slots=2)
    follow_script(engine)
    with messages_tools.serve(engine) as server:
        yield ollama.Client(host=server.url), messages_tools.clients(server)[1]
    engine.close()


@pytest.fixture(scope="module")
def thinker(thinker_server) -> ollama.Client:
    return ollama.Client(host=str(thinker_server.base_url).removesuffix("/"))


def test_a_tool_round_trip_whole(tools):
    llama, chat = tools
    first = llama.chat(messages=QUESTION, tools=[WEATHER], **GREEDY)
    assert first.done_reason == "stop" and first.message.content == ""
    (call,) = first.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.arguments == {"city": "Paris"}  # an object, not JSON text
    assert first.eval_count == len(CALL)
    history = [*QUESTION, first.message.model_dump(exclude_none=True),
               {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    second = llama.chat(messages=history, tools=[WEATHER], **GREEDY)
    assert second.message.content == " ".join(ANSWER) and not second.message.tool_calls
    # The history reached the template as the chat route's messages would have: the
    # result answers the call by its id (which the reply gave it).
    (wire,) = llama._client.post("/api/chat", json={
        "messages": QUESTION, "tools": [WEATHER], "stream": False, **GREEDY,
    }).json()["message"]["tool_calls"]
    same = chat.chat.completions.create(model=MODEL, temperature=0, tools=[WEATHER], messages=[
        *QUESTION,
        {"role": "assistant", "tool_calls": [{"id": "call_1_0", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "sunny"}])
    assert second.prompt_eval_count == same.usage.prompt_tokens
    assert wire["id"] and wire["function"]["index"] == 0


def test_a_tool_round_trip_streamed(tools):
    llama, _ = tools
    chunks = list(llama.chat(messages=QUESTION, tools=[WEATHER], stream=True, **GREEDY))
    calls = [c for c in chunks if c.message.tool_calls]
    assert len(calls) == 1 and not calls[0].done  # the call goes out once, whole
    (call,) = calls[0].message.tool_calls
    assert call.function.arguments == {"city": "Paris"}
    assert chunks[-1].done and chunks[-1].done_reason == "stop"
    assert "".join(c.message.content for c in chunks) == ""
    history = [*QUESTION, {"role": "assistant", "content": "",
                           "tool_calls": [call.model_dump()]},
               {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    text = "".join(c.message.content for c in llama.chat(
        messages=history, tools=[WEATHER], stream=True, **GREEDY))
    assert text == " ".join(ANSWER)


def test_the_thinking_comes_apart_from_the_answer(thinker):
    whole = thinker.chat(messages=QUESTION, **GREEDY)
    assert whole.message.thinking == thinking.REASONING
    assert whole.message.content == "It is sunny."
    chunks = list(thinker.chat(messages=QUESTION, stream=True, **GREEDY))
    assert "".join(c.message.thinking or "" for c in chunks) == thinking.REASONING
    assert "".join(c.message.content for c in chunks) == "It is sunny."
    said = thinker.generate(prompt="weather in Paris ?", **GREEDY)
    assert (said.thinking, said.response) == (thinking.REASONING, "It is sunny.")


def test_think_false_turns_the_template_s_switch_off(thinker):
    reply = thinker.chat(messages=QUESTION, think=False, **GREEDY)
    assert not reply.message.thinking and reply.message.content == "It is sunny."
    assert thinker.chat(messages=QUESTION, think=True, **GREEDY).message.thinking


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_num_predict_cut_is_text_not_a_call_without_its_arguments(tools, stream):
    """Cut inside its arguments (`{"city":` of `{"city": "Paris"}`), the call went out as
    get_weather({}), which an Ollama client runs: it is the reply's text now, whole and
    streamed alike."""
    llama, _ = tools
    options = {"temperature": 0, "num_predict": 5}  # <tool_call> {"name": ... {"city":
    replies = llama.chat(model=MODEL, messages=QUESTION, tools=[WEATHER], options=options,
                         stream=stream)
    chunks = list(replies) if stream else [replies]
    assert not any(c.message.tool_calls for c in chunks)
    text = "".join(c.message.content or "" for c in chunks)
    assert text.startswith('{"name": "get_weather", "arguments": ') and '"city"' in text
    assert chunks[-1].done_reason == "length"
