"""A user turn with no text is refused in one 400 line on every chat-shaped route: it
used to be answered (200) from the chat template's scaffolding alone. Each API's own
words: Anthropic's for the Messages API, OpenAI's empty-array refusal on chat; Ollama's
empty generate prompt stays a load (tests/test_serve_ollama.py)."""

from __future__ import annotations

import pytest

from edgeprefill.server.errors import ApiError
from edgeprefill.server.messages_request import count_body, parse_messages_api
from edgeprefill.server.ollama_request import parse_ollama_chat, parse_ollama_generate
from edgeprefill.server.responses_request import parse_responses
from edgeprefill.server.schemas import parse_chat

MODEL = "tiny"
BLANKS = ("", " \n", [{"type": "text", "text": ""}], [{"type": "text", "text": " "}])


def refusal(parse, body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(body)
    assert caught.value.status == 400 and "\n" not in caught.value.message
    return caught.value


@pytest.mark.parametrize("content", [*BLANKS, None])
def test_chat_refuses_a_user_message_without_text(content):
    body = {"messages": [{"role": "system", "content": "w3"},
                         {"role": "user", "content": content}]}
    err = refusal(parse_chat, body)
    assert err.message == "messages[1].content is empty: a user message needs text"
    assert err.param == "messages[1].content"


def test_chat_refuses_an_empty_content_array_as_openai_does():
    err = refusal(parse_chat, {"messages": [{"role": "user", "content": []}]})
    assert err.message.startswith("messages[0].content is an empty array")


def test_chat_keeps_empty_assistant_and_system_turns_and_blank_free_user_text():
    request = parse_chat({"messages": [
        {"role": "system", "content": ""}, {"role": "user", "content": "w4"},
        {"role": "assistant", "content": None}, {"role": "user", "content": " w5 "}]})
    assert [m["content"] for m in request.prompt] == ["", "w4", "", " w5 "]


@pytest.mark.parametrize("content", ["", []])
def test_messages_api_refuses_empty_user_content_in_anthropic_s_words(content):
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    counted = {"model": MODEL, "messages": body["messages"]}
    for parse, sent in ((parse_messages_api, body), (count_body, counted)):
        assert refusal(parse, sent).message == (
            "messages[0]: all messages must have non-empty content except for the optional "
            "final assistant message")


@pytest.mark.parametrize("content", [" ", [{"type": "text", "text": ""}]])
def test_messages_api_refuses_a_blank_text_block(content):
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    assert "must contain non-whitespace text" in refusal(parse_messages_api, body).message


def test_messages_api_keeps_a_user_turn_of_tool_results_and_an_empty_final_assistant():
    body = {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": "w4"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "w5"}]},
        {"role": "assistant", "content": ""}]}
    roles = [m["role"] for m in parse_messages_api(body).prompt]
    assert roles == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize("content", ["", "  ", [{"type": "input_text", "text": ""}]])
def test_responses_refuses_a_user_input_message_without_text(content):
    body = {"model": MODEL, "input": [{"role": "user", "content": content}]}
    err = refusal(parse_responses, body)
    assert err.message == "input[0].content is empty: a user message needs text"


def test_responses_refuses_a_blank_input_string_as_an_empty_one():
    for blank in ("", " \n"):
        err = refusal(parse_responses, {"model": MODEL, "input": blank})
        assert (err.message, err.param) == ("'input' is empty", "input")


def test_ollama_generate_refuses_a_blank_prompt_and_chat_an_empty_user_message():
    err = refusal(lambda b: parse_ollama_generate(b, MODEL, 512),
                  {"model": MODEL, "prompt": " \n", "system": "w3"})
    assert err.message.startswith("'prompt' is blank: send text, or an empty prompt to")
    # raw: the text is the prompt, whitespace and all (a base model may continue it)
    raw = parse_ollama_generate({"model": MODEL, "prompt": "\n", "raw": True}, MODEL, 512)
    assert raw.prompt == "\n"
    err = refusal(lambda b: parse_ollama_chat(b, MODEL, 512),
                  {"model": MODEL, "messages": [{"role": "user", "content": ""}]})
    assert err.message == "messages[0].content is empty: a user message needs text"


def test_tokenize_still_counts_an_empty_user_message():
    """/tokenize measures prompts (a template's overhead with an empty turn included):
    only the generating routes refuse it."""
    from edgeprefill.server.schemas import parse_messages

    assert parse_messages([{"role": "user", "content": ""}]) == [
        {"role": "user", "content": ""}]
