"""`POST /v1/messages`, Anthropic's Messages API, with the official `anthropic` client on
a live server (the tiny random llama): the Message is the chat route's greedy reply in
Anthropic's shape, whole and streamed; stop reasons, usage, count_tokens, the API key
headers and the error schema. Tool calls: tests/test_serve_messages_tools.py."""

from __future__ import annotations

import json
import threading

import pytest

httpx = pytest.importorskip("httpx")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests import served_llama  # noqa: E402
from tests.test_serve import (  # noqa: E402
    MODEL,
    NO_EOS,
    assert_leaving_stops_the_reply,
    free_port,
    slow_down,
)

# The module's live server (tests/served_llama.py), by the names pytest looks up.
engine = served_llama.engine
server = served_llama.server
kv_is_clean_after_each_test = served_llama.kv_is_clean_after_each_test


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


# Anthropic's SDK no longer has sampling arguments: they go in the body as extra fields.
GREEDY = {"model": MODEL, "extra_body": {"temperature": 0, **NO_EOS}}
SYSTEM = "w3"
USER = [{"role": "user", "content": "w4 w5"}]
CHAT = [{"role": "system", "content": SYSTEM}, *USER]


def chat_reply(client, messages=CHAT, max_tokens: int = 5):
    return client.chat.completions.create(messages=messages, max_tokens=max_tokens,
                                          model=MODEL, temperature=0, extra_body=NO_EOS)


def ask(claude, max_tokens: int = 5, **options):
    return claude.messages.create(system=SYSTEM, messages=USER, max_tokens=max_tokens,
                                  **GREEDY, **options)


def test_a_message_is_the_chat_route_s_greedy_reply_in_anthropic_s_shape(claude, client):
    reply = ask(claude)
    chat = chat_reply(client)
    assert reply.id.startswith("msg_") and reply.type == "message"
    assert reply.role == "assistant" and reply.model == MODEL
    (block,) = reply.content
    assert block.type == "text" and block.text == chat.choices[0].message.content != ""
    assert reply.stop_reason == "max_tokens" and reply.stop_sequence is None
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == 5


def test_content_blocks_and_system_blocks_are_the_same_messages(claude, client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "w4"},
                                             {"type": "text", "text": " w5"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "w6"}]},
                {"role": "user", "content": "w7"}]
    reply = claude.messages.create(
        system=[{"type": "text", "text": "w3", "cache_control": {"type": "ephemeral"}}],
        messages=messages, max_tokens=4, metadata={"user_id": "u1"}, **GREEDY)
    chat = chat_reply(client, [*CHAT, {"role": "assistant", "content": "w6"},
                               {"role": "user", "content": "w7"}], 4)
    assert reply.content[0].text == chat.choices[0].message.content
    assert reply.usage.input_tokens == chat.usage.prompt_tokens


def test_streamed_text_deltas_add_up_to_the_whole_message(claude):
    whole = ask(claude, max_tokens=6)
    with claude.messages.stream(system=SYSTEM, messages=USER, max_tokens=6,
                                **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_the_raw_stream_is_anthropic_s_event_sequence(http):
    body = {"model": MODEL, "system": SYSTEM, "messages": USER, "max_tokens": 3,
            "stream": True, "temperature": 0, **NO_EOS}
    with http.stream("POST", "/v1/messages", json=body,
                     headers={"anthropic-version": "2023-06-01"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    names, data = [n[7:] for n in lines[0::2]], [json.loads(d[6:]) for d in lines[1::2]]
    assert names == [d["type"] for d in data]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = data[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0
    assert data[2] == {"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in data[3:-3])
    assert data[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert data[-2]["usage"] == {"output_tokens": 3}


def test_a_stop_sequence_ends_the_reply_and_is_named(claude):
    text = ask(claude, max_tokens=8).content[0].text
    words = text.split()
    stop = f" {words[3]}"  # a later word, with the space before it
    assert stop in text
    reply = ask(claude, max_tokens=8, stop_sequences=["never there", stop])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    assert reply.content[0].text == text[:text.index(stop)]
    with claude.messages.stream(system=SYSTEM, messages=USER, max_tokens=8,
                                stop_sequences=[stop], **GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == reply.content[0].text
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


def test_count_tokens_is_the_prompt_s_token_count(claude, client):
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=USER)
    assert counted.input_tokens == chat_reply(client).usage.prompt_tokens
    assert counted.input_tokens == ask(claude).usage.input_tokens


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]["message"]


@pytest.mark.parametrize(("body", "words"), [
    ({"messages": USER}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}]}], "max_tokens": 2},
     "image"),
    ({"messages": USER, "max_tokens": 2, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "max_tokens": 2, "stop_sequences": "w5"}, "stop_sequences"),
    ({"messages": USER, "max_tokens": 2, "tools": [{"type": "web_search_20250305",
                                                    "name": "web_search"}]}, "custom"),
    ({"messages": USER, "max_tokens": 2, "thinking": {"type": "sometimes"}}, "thinking"),
    # a type JSON cannot use as a key (a list or an object) was a 500: unhashable type
    ({"messages": USER, "max_tokens": 2, "thinking": {"type": ["enabled"]}}, "thinking"),
    ({"messages": USER, "max_tokens": 2, "thinking": {"type": {}}}, "thinking"),
    ({"messages": USER, "max_tokens": 2, "tools": [{"name": "f", "strict": "yes",
                                                    "input_schema": {"type": "object"}}]},
     "tools[0].strict must be true or false"),
    ({"messages": USER, "max_tokens": 2, "container": "c1"}, "container"),
    ({"messages": [{"role": "system", "content": "w3"}], "max_tokens": 2}, "role"),
    ({"messages": USER, "max_tokens": 100_000}, "context"),
])
def test_bad_requests_are_400s_in_anthropic_s_error_schema(http, body, words):
    message = assert_anthropic_error(http.post("/v1/messages", json=body), 400,
                                     "invalid_request_error")
    assert words in message


def test_the_sdk_raises_its_own_errors_with_the_server_s_message(claude):
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL, messages=USER, max_tokens=2,
                               extra_body={"top_k": -1})
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "top_k" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="claude-opus-4", messages=USER, max_tokens=2)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model=MODEL, messages=[])


def test_other_failures_on_its_paths_are_in_anthropic_s_schema_too(http):
    assert_anthropic_error(http.post("/v1/messages", content=b"{not json"), 400,
                           "invalid_request_error")
    assert_anthropic_error(http.post("/v1/messages/batches", json={}), 404, "not_found_error")
    assert_anthropic_error(http.get("/v1/messages"), 405, "invalid_request_error")
    # The OpenAI routes keep OpenAI's schema.
    assert set(http.post("/v1/chat/completions", json={}).json()) == {"error"}


def test_the_api_key_is_read_from_x_api_key_or_bearer(engine):
    app = create_app(engine, ServerConfig(model_name=MODEL, api_key="sekret"))
    with ServerThread(app, port=free_port()) as server:
        good = anthropic.Anthropic(base_url=server.url, api_key="sekret", max_retries=0)
        reply = good.messages.create(model=MODEL, messages=USER, max_tokens=1)
        assert reply.usage.output_tokens <= 1
        bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            bad.messages.create(model=MODEL, messages=USER, max_tokens=1)
        assert refused.value.body["error"]["type"] == "authentication_error"
        bearer = {"Authorization": "Bearer sekret"}
        body = {"model": MODEL, "messages": USER, "max_tokens": 1}
        assert httpx.post(f"{server.url}/v1/messages", json=body,
                          headers=bearer).status_code == 200
        assert httpx.post(f"{server.url}/v1/models",
                          headers={"x-api-key": "sekret"}).status_code == 405
        assert httpx.get(f"{server.url}/v1/models",
                         headers={"x-api-key": "sekret"}).status_code == 200
        assert httpx.get(f"{server.url}/v1/models").status_code == 401


def test_a_client_leaving_mid_stream_cancels_the_message(http, engine, monkeypatch):
    slow_down(monkeypatch, engine, 0.005)
    body = {"model": MODEL, "messages": USER, "max_tokens": 400, "stream": True, **NO_EOS}
    assert_leaving_stops_the_reply(http, engine, "/v1/messages", body, lines=12)


def test_an_engine_failure_is_a_500_or_an_error_event(claude, http, engine, monkeypatch):
    def broken(batch):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.backend, "run", broken)
    body = {"model": MODEL, "messages": USER, "max_tokens": 4}
    assert "device lost" in assert_anthropic_error(http.post("/v1/messages", json=body), 500,
                                                   "api_error")
    with pytest.raises(anthropic.APIStatusError) as failed:
        with claude.messages.stream(model=MODEL, messages=USER, max_tokens=4) as stream:
            stream.get_final_message()
    assert failed.value.body["error"]["type"] == "api_error"
    assert "device lost" in failed.value.body["error"]["message"]


def test_a_stream_the_shutdown_cuts_ends_with_anthropic_s_error_event(engine, monkeypatch):
    from tests.test_server_hardening import TIMEOUTS

    slow_down(monkeypatch, engine, 0.05)
    events: list[dict] = []
    first = threading.Event()

    def read(url: str) -> None:
        body = {"model": MODEL, "messages": USER, "max_tokens": 200, "stream": True,
                **NO_EOS}
        with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    first.set()

    app = create_app(engine, ServerConfig(model_name=MODEL))
    with ServerThread(app, port=free_port(), timeouts=TIMEOUTS) as server:
        reader = threading.Thread(target=read, args=(server.url,))
        reader.start()
        assert first.wait(30)
    reader.join(30)
    assert events[0]["type"] == "message_start" and len(events) < 200
    assert events[-1] == {"type": "error", "error": {
        "type": "overloaded_error", "message": events[-1]["error"]["message"]}}
    assert "shutting down" in events[-1]["error"]["message"]


def test_messages_are_counted_under_their_route(claude, http):
    ask(claude, max_tokens=3)
    assert 'edgeprefill_http_requests_total{endpoint="messages",finish_reason="length"}' \
        in http.get("/metrics").text
