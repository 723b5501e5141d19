"""Tool calls' arguments nested very deep (100,000 `[`) through the server: Python's JSON
reader overflows the stack on them (RecursionError, which is no ValueError), and so did
every later reader and writer of such a value, a 500. Now they nest at most
json_numbers.MAX_DEPTH deep: a model's call deeper stays the reply's text as any call that
does not parse, and a client's, sent back in the conversation, is a 400 naming the field.

The model's reply is a script of words (tests/test_serve_tools_numbers.py's approach) in
the Hermes format: a first call whose arguments stream as written (sent as generated, so
they stay a call whose arguments are not JSON, and the reply does not finish with
`tool_calls`), then one whose arguments come before its name, which the parser reads
whole: that one stays text."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from edgeprefill.json_numbers import MAX_DEPTH  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from tests.conftest import scripted_server, word_bundle  # noqa: E402
from tests.test_serve import MODEL, assert_error  # noqa: E402
from tests.test_serve_tools import TEMPLATE  # noqa: E402

DEPTH = 100_000  # the model's
CLIENT_DEPTH = 20_000  # within the test server's body limit (80 kB)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# Words, each once (the script maps a word to the next).
STREAMED = ['<tool_call>', '{"name":', '"get_weather",', '"arguments":', '{"days":',
            nested(DEPTH) + "}}", '</tool_call>']
WHOLE = ['<tool_call>{"arguments":', '{"n":', nested(DEPTH) + "},", '"name":',
         '"get_weather"}</tool_call>']
SCRIPT = [*STREAMED, *WHOLE]
WORDS = ["assistant:", *SCRIPT]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"days": {"type": "array"}, "n": {"type": "array"}}}}}]
QUESTION = [{"role": "user", "content": "weather ?"}]


@pytest.fixture(scope="module")
def server(hf_model, tmp_path_factory) -> Iterator[ServerThread]:
    bundle = word_bundle(hf_model, tmp_path_factory, "deep", WORDS, TEMPLATE)
    with scripted_server(bundle, WORDS, ("assistant:", *SCRIPT)) as server:
        yield server


def post(http, path: str, body: dict) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text[:300]
    return response.json()


def no_traceback(capfd) -> None:
    err = capfd.readouterr().err
    assert "Traceback" not in err and "RecursionError" not in err, err[-2000:]


def chat_body(**more) -> dict:
    return {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "max_tokens": 40, **more}


def test_a_model_s_call_nested_too_deep_is_the_reply_s_text(http, capfd):
    choice = post(http, "/v1/chat/completions", chat_body())["choices"][0]
    (call,) = choice["message"]["tool_calls"]  # the streamed one: sent as generated
    assert call["function"]["arguments"] == '{"days": ' + nested(DEPTH) + "}"
    assert choice["message"]["content"] == " ".join(WHOLE)
    assert choice["finish_reason"] == "stop"  # a call whose arguments are not JSON
    no_traceback(capfd)


def test_the_streamed_reply_sends_the_deep_call_as_generated(http, capfd):
    with http.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data: ") for line in response.iter_lines()
                 if line.startswith("data: {")]
    deltas = [json.loads(line)["choices"][0] for line in lines]
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    assert content == " ".join(WHOLE)
    assert deltas[-1]["finish_reason"] == "stop"
    no_traceback(capfd)


def test_the_messages_api_and_ollama_answer_the_deep_call(http, capfd):
    tools = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
    message = post(http, "/v1/messages", {"model": MODEL, "messages": QUESTION,
                                          "tools": tools, "max_tokens": 40})
    assert [b["type"] for b in message["content"]] == ["tool_use", "text"]
    assert message["content"][0]["input"] == {}  # its arguments are not JSON
    assert message["content"][1]["text"] == " ".join(WHOLE)
    reply = post(http, "/api/chat", {"model": MODEL, "messages": QUESTION, "tools": TOOLS,
                                     "stream": False, "options": {"num_predict": 40}})
    # Ollama's clients run every call they get: the streamed call, whose arguments are no
    # JSON object, is the reply's text (it had been a call with `{}`, run without them)
    deep = '{"name": "get_weather", "arguments": {"days": ' + nested(DEPTH) + "}}"
    assert reply["message"]["content"] == deep + " ".join(WHOLE)
    assert not reply["message"].get("tool_calls")
    no_traceback(capfd)


def history(arguments: str) -> list[dict]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}
    return [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


@pytest.mark.parametrize("depth", [MAX_DEPTH, CLIENT_DEPTH])  # one level too deep, and far
def test_a_client_s_call_nested_too_deep_is_a_400_naming_the_field(http, capfd, depth):
    arguments = '{"days": ' + nested(depth) + "}"
    response = http.post("/v1/chat/completions",
                         json=chat_body(messages=history(arguments), max_tokens=1))
    error = assert_error(response, 400, "messages[1].tool_calls[0].function.arguments")
    assert f"deeper than {MAX_DEPTH} levels" in error["message"]
    item = {"type": "function_call", "call_id": "c", "name": "get_weather",
            "arguments": arguments}
    response = http.post("/v1/responses", json={"model": MODEL, "input": [item]})
    assert_error(response, 400, "input[0].arguments")
    no_traceback(capfd)


def test_a_client_s_call_as_deep_as_allowed_is_rendered(http):
    arguments = '{"days": ' + nested(MAX_DEPTH - 1) + "}"  # the object is one level more
    post(http, "/v1/chat/completions", chat_body(messages=history(arguments), max_tokens=1))
