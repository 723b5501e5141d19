"""A tool call whose arguments hold numbers a float cannot hold (`1e400`, `-1e999`) through
the server: every API that returns calls sends them as valid JSON (RFC 8259), as the model
wrote them, whole and streamed (server/json_numbers.py).

The model's reply is a script of words (tests/test_serve_tools.py's approach: the backend
runs for real, its logits follow the words) in the Hermes format: a first call whose
arguments stream as written, then one whose arguments come before its name, which the
parser reads whole. The reference for "valid JSON" is JavaScript's JSON.parse (node),
given every body and every line the server sends, as a JavaScript client would read them;
the calls' format and parsing are format-independent past the parser (tests/
test_json_numbers.py covers each format)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from edgeprefill.server import ServerThread  # noqa: E402
from tests.conftest import scripted_server, word_bundle  # noqa: E402
from tests.test_json_numbers import js_parses  # noqa: E402
from tests.test_serve import MODEL  # noqa: E402
from tests.test_serve_tools import TEMPLATE  # noqa: E402

# Words, each once (the script maps a word to the next): the second call opens with its
# tag inside a word, as the tokenizer splits words at blanks only.
SCRIPT = ['<tool_call>', '{"name":', '"get_weather",', '"arguments":', '{"days":', '1e400}}',
          '</tool_call>', '<tool_call>{"arguments":', '{"n":', '-1e999},', '"name":',
          '"get_weather"}</tool_call>']
WORDS = ["assistant:", "answer:", *SCRIPT]
ARGUMENTS = ['{"days": 1e400}', '{"n": -1e999}']  # the calls' arguments, as written
OBJECTS = ['{"days":1e400}', '{"n":-1e999}']  # as objects in a compact body
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"days": {"type": "number"}, "n": {"type": "number"}}}}}]
QUESTION = [{"role": "user", "content": "weather ?"}]


@pytest.fixture(scope="module")
def server(hf_model, tmp_path_factory) -> Iterator[ServerThread]:
    bundle = word_bundle(hf_model, tmp_path_factory, "numbers", WORDS, TEMPLATE)
    with scripted_server(bundle, WORDS, ("assistant:", *SCRIPT)) as server:
        yield server


def post(http, path: str, body: dict) -> str:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.text


def stream(http, path: str, body: dict) -> list[str]:
    """The JSON texts a stream sends: SSE `data:` payloads or NDJSON lines."""
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data:").strip() for line in response.iter_lines()]
    return [line for line in lines if line and line != "[DONE]" and
            not line.startswith("event:")]


def assert_valid_json(texts: list[str]) -> None:
    parsed = js_parses(texts)
    assert all(parsed), [t for t, ok in zip(texts, parsed, strict=True) if not ok]


def chat_body() -> dict:
    return {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "max_tokens": 40}


def test_chat_completions_send_the_numbers_as_written(http):
    body = post(http, "/v1/chat/completions", chat_body())
    assert_valid_json([body])
    choice = json.loads(body)["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ARGUMENTS
    assert_valid_json(ARGUMENTS)
    assert choice["finish_reason"] == "tool_calls"


def test_streamed_chat_completions_send_the_numbers_as_written(http):
    chunks = stream(http, "/v1/chat/completions", chat_body())
    assert_valid_json(chunks)
    arguments: dict[int, str] = {}
    for chunk in map(json.loads, chunks):
        for delta in chunk["choices"][0]["delta"].get("tool_calls") or []:
            text = delta["function"].get("arguments", "")
            arguments[delta["index"]] = arguments.get(delta["index"], "") + text
    assert list(arguments.values()) == ARGUMENTS


def messages_body() -> dict:
    tools = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
    return {"model": MODEL, "messages": QUESTION, "tools": tools, "max_tokens": 40}


def test_the_messages_api_s_input_holds_the_numbers_as_written(http):
    body = post(http, "/v1/messages", messages_body())
    assert_valid_json([body])
    assert body.count('"input":') == 2 and all(o in body for o in OBJECTS), body
    assert json.loads(body)["stop_reason"] == "tool_use"


def test_the_streamed_messages_api_sends_the_numbers_as_written(http):
    events = stream(http, "/v1/messages", messages_body())
    assert_valid_json(events)
    partial = [json.loads(e)["delta"].get("partial_json") for e in events
               if json.loads(e)["type"] == "content_block_delta"]
    assert "".join(p for p in partial if p) == "".join(ARGUMENTS)


def ollama_body() -> dict:
    return {"model": MODEL, "messages": QUESTION, "tools": TOOLS, "stream": False,
            "options": {"temperature": 0, "num_predict": 40}}


def test_ollama_s_arguments_hold_the_numbers_as_written(http):
    body = post(http, "/api/chat", ollama_body())
    assert_valid_json([body])
    assert body.count('"arguments":') == 2 and all(o in body for o in OBJECTS), body


def test_ollama_s_streamed_lines_hold_the_numbers_as_written(http):
    lines = stream(http, "/api/chat", ollama_body())
    assert_valid_json(lines)
    calls = [line for line in lines if '"tool_calls"' in line]
    assert len(calls) == 2 and all(o in c for o, c in zip(OBJECTS, calls, strict=True))


@pytest.mark.parametrize("streamed", [False, True])
def test_the_responses_api_echoes_a_request_s_number_as_sent(http, streamed):
    """A Responses reply echoes the request's tools and metadata: a number a float cannot
    hold there (read as json_numbers reads a body) goes back as sent, valid JSON; the
    stream used to end in a TypeError for it."""
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    tools[0]["parameters"] = {**tools[0]["parameters"], "maximum": "@"}
    body = {"model": MODEL, "input": "weather ?", "max_output_tokens": 1, "tools": tools,
            "metadata": {"a": "@"}, "stream": streamed}
    raw = json.dumps(body).replace('"@"', "1e400").encode()
    headers = {"Content-Type": "application/json"}
    with http.stream("POST", "/v1/responses", content=raw, headers=headers) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data:").strip() for line in response.iter_lines()]
    texts = [t for t in lines if t.startswith("{")]
    assert_valid_json(texts)
    echoed = [t for t in texts if '"metadata":{"a":1e400}' in t]
    assert echoed and all('"maximum":1e400' in t for t in echoed)
    last = json.loads(texts[-1])  # the whole stream, to its end (max_output_tokens)
    assert (last["type"] if streamed else last["status"]) in ("response.incomplete",
                                                               "incomplete")
