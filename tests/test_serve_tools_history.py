"""A tool call a client sends back in the conversation reaches the prompt as it was
written, through every API that takes one: a number a float cannot hold (`1e400`,
`-1e-999`) is rendered as that text (Python's json read it as inf and 0.0, and the
template wrote `Infinity` and `-0.0`), and arguments holding `NaN` or `Infinity`, which
are not JSON, are a 400 naming the field (server/history_arguments.py).

The chat template is Qwen2.5's (tests/chat_templates.py CHATML), which renders a call's
arguments with `tojson`; the tokenizer's words (tests/conftest.py write_tokenizer) include
those of the rendered call, so the prompt's token ids, caught on their way into the
engine, spell the rendered text back (a word the tokenizer lacks is w0)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from tests.chat_templates import CHATML  # noqa: E402
from tests.conftest import VOCAB, word_bundle  # noqa: E402
from tests.test_serve import MODEL, assert_error, serving  # noqa: E402

ARGUMENTS = '{"days": 1e400, "n": -1e-999}'  # as the model wrote them (and a client keeps)
# The rendered call, `"arguments": ` + tojson(arguments) + `}`, in the tokenizer's words.
RENDERED = '"arguments": {"days": 1e400, "n": -1e-999}}'
WORDS = RENDERED.split()
CALL_ID = "call_1"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"days": {"type": "number"}, "n": {"type": "number"}}}}}]
QUESTION = {"role": "user", "content": "weather ?"}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """The token ids of each prompt the server submits, in order."""
    return []


@pytest.fixture(scope="module")
def server(hf_model, tmp_path_factory, prompts) -> Iterator[ServerThread]:
    bundle = word_bundle(hf_model, tmp_path_factory, "history", WORDS, CHATML)
    engine = Engine.load(bundle, threads=1, kv_slots=2)
    submit_n = engine.submit_n

    def caught(tokens, *args, **kwargs):
        prompts.append(list(tokens))
        return submit_n(tokens, *args, **kwargs)

    engine.submit_n = caught  # type: ignore[method-assign]
    with serving(engine) as server:
        yield server
    engine.close()


def words(ids: list[int]) -> str:
    """The prompt in the tokenizer's words (w<id> for the rest)."""
    first = VOCAB - len(WORDS)
    return " ".join(WORDS[i - first] if i >= first else f"w{i}" for i in ids)


def rendered(http, prompts, path: str, body: dict) -> str:
    before = len(prompts)
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    assert len(prompts) == before + 1
    return words(prompts[-1])


def chat_body(arguments: Any) -> dict:
    call = {"id": CALL_ID, "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}
    return {"model": MODEL, "tools": TOOLS, "max_tokens": 1, "messages": [
        QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "sunny"}]}


def responses_body(arguments: str) -> dict:
    return {"model": MODEL, "max_output_tokens": 1, "tools": [
        {"type": "function", **TOOLS[0]["function"]}], "input": [
        {"role": "user", "content": "weather ?"},
        {"type": "function_call", "call_id": CALL_ID, "name": "get_weather",
         "arguments": arguments},
        {"type": "function_call_output", "call_id": CALL_ID, "output": "sunny"}]}


def messages_body(arguments: Any) -> dict:
    tools = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
    return {"model": MODEL, "max_tokens": 1, "tools": tools, "messages": [
        QUESTION, {"role": "assistant", "content": [
            {"type": "tool_use", "id": CALL_ID, "name": "get_weather", "input": arguments}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": CALL_ID, "content": "sunny"}]}]}


def ollama_body(arguments: Any) -> dict:
    return {"model": MODEL, "stream": False, "tools": TOOLS,
            "options": {"num_predict": 1}, "messages": [
                QUESTION, {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": arguments}}]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]}


def as_object(body: dict, arguments: str = ARGUMENTS) -> bytes:
    """The body's JSON with the arguments object written as `arguments` says (json.dumps
    cannot write 1e400)."""
    return json.dumps(body).replace('"@arguments"', arguments).encode()


def post_raw(http, path: str, raw: bytes) -> httpx.Response:
    return http.post(path, content=raw, headers={"Content-Type": "application/json"})


def rendered_raw(http, prompts, path: str, raw: bytes) -> str:
    before = len(prompts)
    response = post_raw(http, path, raw)
    assert response.status_code == 200, response.text
    assert len(prompts) == before + 1
    return words(prompts[-1])


def test_the_chat_template_renders_the_numbers_as_written(http, prompts):
    assert RENDERED in rendered(http, prompts, "/v1/chat/completions", chat_body(ARGUMENTS))


def test_arguments_sent_as_an_object_keep_their_numbers_too(http, prompts):
    """OpenAI's schema says text; clients that send the object are accepted as before."""
    raw = as_object(chat_body("@arguments"))
    assert RENDERED in rendered_raw(http, prompts, "/v1/chat/completions", raw)


def test_the_responses_api_s_function_call_renders_as_written(http, prompts):
    assert RENDERED in rendered(http, prompts, "/v1/responses", responses_body(ARGUMENTS))


def test_the_messages_api_s_tool_use_input_renders_as_written(http, prompts):
    raw = as_object(messages_body("@arguments"))
    assert RENDERED in rendered_raw(http, prompts, "/v1/messages", raw)


def test_ollama_s_arguments_render_as_written(http, prompts):
    raw = as_object(ollama_body("@arguments"))
    assert RENDERED in rendered_raw(http, prompts, "/api/chat", raw)
    assert RENDERED in rendered(http, prompts, "/api/chat", ollama_body(ARGUMENTS))


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_arguments_text_is_a_400_naming_the_field(http, constant):
    arguments = f'{{"days": {constant}}}'
    response = http.post("/v1/chat/completions", json=chat_body(arguments))
    error = assert_error(response, 400, "messages[1].tool_calls[0].function.arguments")
    assert "not valid JSON" in error["message"] and constant.lstrip("-") in error["message"]
    response = http.post("/v1/responses", json=responses_body(arguments))
    assert_error(response, 400, "input[1].arguments")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_an_arguments_object_is_a_400_naming_the_field(http, constant):
    """The body's reader names the very value (server/body.py refuses NaN and Infinity
    anywhere in a request, by the field's path)."""
    arguments = f'{{"days": [1, {constant}]}}'
    raw = as_object(chat_body("@arguments"), arguments)
    assert_error(post_raw(http, "/v1/chat/completions", raw), 400,
                 "messages[1].tool_calls[0].function.arguments.days[1]")
    response = post_raw(http, "/v1/messages", as_object(messages_body("@arguments"),
                                                        arguments))
    assert response.status_code == 400
    assert f"'messages[1].content[0].input.days[1]' is {constant}" in \
        response.json()["error"]["message"]
    response = post_raw(http, "/api/chat", as_object(ollama_body("@arguments"), arguments))
    assert response.status_code == 400
    assert f"'messages[1].tool_calls[0].function.arguments.days[1]' is {constant}" in \
        response.json()["error"]
