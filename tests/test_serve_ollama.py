"""Ollama's native API (`/api/chat`, `/api/generate`, `/api/tags`, ...) with the official
`ollama` client on a live server (the tiny random llama): a reply is the chat route's
(or, raw, the completions route's) greedy reply in Ollama's shape, whole and streamed
as NDJSON; counts, stop strings, num_predict, the model routes and the error shape.
Tool calls and thinking: tests/test_serve_ollama_tools.py; `format`:
tests/test_structured_output.py (its bundle can spell JSON)."""

from __future__ import annotations

import json
import logging
import threading

import pytest

httpx = pytest.importorskip("httpx")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from edgeprefill.server.errors import ApiError  # noqa: E402
from edgeprefill.server.ollama_request import (  # noqa: E402
    parse_ollama_chat,
    parse_ollama_generate,
)
from tests import served_llama  # noqa: E402
from tests.test_serve import (  # noqa: E402
    MODEL,
    NO_EOS,
    free_port,
    slow_down,
)

# The module's live server (tests/served_llama.py), by the names pytest looks up.
engine = served_llama.engine
server = served_llama.server
kv_is_clean_after_each_test = served_llama.kv_is_clean_after_each_test


@pytest.fixture(scope="module")
def llama(server) -> ollama.Client:
    return ollama.Client(host=server.url)


CHAT = [{"role": "system", "content": "w3"}, {"role": "user", "content": "w4 w5"}]


def greedy(num_predict: int, **more) -> dict:
    return {"temperature": 0, "num_predict": num_predict, **NO_EOS, **more}


def openai_chat(client, max_tokens: int, messages=CHAT, **more):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                          max_tokens=max_tokens, extra_body=NO_EOS, **more)


def test_chat_is_the_chat_route_s_greedy_reply_whole_and_streamed(llama, client):
    same = openai_chat(client, 6)
    whole = llama.chat(model=MODEL, messages=CHAT, options=greedy(6), stream=False)
    assert whole.message.role == "assistant"
    assert whole.message.content == same.choices[0].message.content != ""
    assert whole.done and whole.done_reason == "length"
    assert whole.eval_count == same.usage.completion_tokens == 6
    assert whole.prompt_eval_count == same.usage.prompt_tokens
    assert whole.model == MODEL
    chunks = list(llama.chat(model=f"{MODEL}:latest", messages=CHAT, options=greedy(6),
                             stream=True))
    *parts, last = chunks
    assert "".join(c.message.content for c in parts) == whole.message.content
    assert not any(c.done for c in parts) and len(parts) == 6
    assert last.done and last.done_reason == "length" and last.message.content == ""
    assert (last.eval_count, last.prompt_eval_count) == (6, whole.prompt_eval_count)
    assert last.model == f"{MODEL}:latest"
    for name in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert getattr(last, name) > 0, name
    assert last.total_duration >= last.prompt_eval_duration + last.eval_duration


def test_generate_is_the_chat_template_s_reply_or_raw_the_completion(llama, client):
    same = openai_chat(client, 5)
    done = llama.generate(model=MODEL, system="w3", prompt="w4 w5", options=greedy(5))
    assert done.response == same.choices[0].message.content
    assert done.prompt_eval_count == same.usage.prompt_tokens and done.eval_count == 5
    streamed = list(llama.generate(model=MODEL, system="w3", prompt="w4 w5", stream=True,
                                   options=greedy(5)))
    assert "".join(c.response for c in streamed) == done.response
    assert streamed[-1].done_reason == "length"
    completion = client.completions.create(model=MODEL, prompt="w4 w5", max_tokens=5,
                                           temperature=0, extra_body=NO_EOS)
    raw = llama.generate(model=MODEL, prompt="w4 w5", raw=True, options=greedy(5))
    assert raw.response == completion.choices[0].text
    assert raw.prompt_eval_count == completion.usage.prompt_tokens


def test_the_raw_stream_is_ndjson_ending_in_done_with_the_timings(http):
    body = {"model": MODEL, "messages": CHAT, "options": greedy(3)}  # stream: true unsaid
    with http.stream("POST", "/api/chat", json=body) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * 3 + [True]
    assert set(lines[0]) == {"model", "created_at", "message", "done"}
    assert lines[0]["created_at"].endswith("Z")
    last = lines[-1]
    assert set(last) == {"model", "created_at", "message", "done", "done_reason",
                         "total_duration", "load_duration", "prompt_eval_count",
                         "prompt_eval_duration", "eval_count", "eval_duration"}
    assert all(isinstance(last[k], int) for k in last if k.endswith(("_duration", "_count")))


def test_stop_strings_and_an_unlimited_num_predict(llama):
    text = llama.chat(model=MODEL, messages=CHAT, options=greedy(8)).message.content
    words = text.split()
    stop = f" {words[3]}"
    assert stop in text
    reply = llama.chat(model=MODEL, messages=CHAT, options=greedy(8, stop=["nowhere", stop]))
    assert reply.message.content == text[:text.index(stop)]
    assert reply.done_reason == "stop"
    # num_predict -1 is Ollama's default, no limit: the reply runs to the stop string
    reply = llama.chat(model=MODEL, messages=CHAT, options=greedy(-1, stop=[stop]))
    assert reply.message.content == text[:text.index(stop)]


def test_an_empty_request_loads_the_model(http):
    reply = http.post("/api/generate", json={"model": MODEL}).json()
    assert reply["done"] and reply["done_reason"] == "load" and reply["response"] == ""
    reply = http.post("/api/chat", json={"model": MODEL, "messages": []}).json()
    assert reply["done_reason"] == "load" and reply["message"]["content"] == ""


def test_the_model_routes_describe_the_served_model(llama, http, engine):
    assert http.get("/").text == "Ollama is running"
    assert http.head("/").status_code == 200
    assert http.get("/api/version").json()["version"].count(".") == 2
    (listed,) = llama.list().models
    assert listed.model == f"{MODEL}:latest"
    assert listed.size == sum(r.bytes for r in engine.manifest.files.values()) > 0
    assert listed.details.family == "llama" and listed.details.format == "onnx"
    assert len(listed.digest) == 64
    shown = llama.show(MODEL)
    assert shown.modelinfo["llama.context_length"] == engine.capacity
    assert "completion" in shown.capabilities and shown.template
    # no default system message (an Ollama export's SYSTEM): none shown, as Ollama omits it
    assert "system" not in http.post("/api/show", json={"model": MODEL}).json()
    (running,) = llama.ps().models
    assert running.context_length == engine.capacity and running.digest == listed.digest


def assert_ollama_error(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and words in body["error"], body
    assert "\n" not in body["error"]


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/api/chat", {"model": "llama3.2", "messages": CHAT}, 404, "'llama3.2' not found"),
    ("/api/chat", {"messages": CHAT}, 400, "model is required"),
    ("/api/chat", {"model": MODEL, "messages": "hi"}, 400, "'messages'"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "w4",
                                                 "images": ["iVBORw0KGgo="]}]}, 400,
     "images"),
    ("/api/chat", {"model": MODEL, "messages": CHAT, "options": {"temperature": "hot"}},
     400, "'options.temperature' must be a number"),
    ("/api/chat", {"model": MODEL, "messages": CHAT, "options": {"num_ctx": 100_000}},
     400, "fixed when the bundle is exported"),
    ("/api/chat", {"model": MODEL, "messages": CHAT, "options": {"typical_p": 0.5}},
     400, "typical_p"),
    ("/api/chat", {"model": MODEL, "messages": CHAT, "think": "sometimes"}, 400, "think"),
    # Ollama's words for a model without the capability (/api/show lists none): clients
    # ask again without `think` (it was taken and ignored)
    ("/api/chat", {"model": MODEL, "messages": CHAT, "think": True}, 400,
     '"tiny" does not support thinking'),
    ("/api/generate", {"model": MODEL + ":latest", "prompt": "w4", "think": "high"}, 400,
     '"tiny:latest" does not support thinking'),
    # and tools (the chat route's advice, tool_choice, is no Ollama field)
    ("/api/chat", {"model": MODEL, "messages": CHAT, "tools": [{"type": "function",
     "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]}, 400,
     '"tiny" does not support tools'),
    ("/api/chat", {"model": MODEL, "messages": CHAT, "format": "yaml"}, 400, "format"),
    ("/api/chat", {"model": MODEL, "messages": CHAT, "options": {"num_predict": 100_000}},
     400, "lower options.num_predict"),
    ("/api/generate", {"model": MODEL, "prompt": "w4", "suffix": "w9"}, 400, "suffix"),
    ("/api/generate", {"model": MODEL, "prompt": "w4", "raw": True, "system": "w3"}, 400,
     "raw"),
    ("/api/generate", {"model": MODEL, "prompt": 5}, 400, "'prompt' must be a string"),
    ("/api/show", {"model": "other"}, 404, "not found"),
    ("/api/nowhere", {}, 404, "no route"),
])
def test_bad_requests_get_ollama_s_error_shape(http, path, body, status, words):
    assert_ollama_error(http.post(path, json=body), status, words)


def test_the_client_raises_its_own_error_with_the_server_s_message(llama):
    with pytest.raises(ollama.ResponseError) as missing:
        llama.chat(model="llama3.2", messages=CHAT)
    assert missing.value.status_code == 404 and "not found" in missing.value.error
    assert_ollama_error(httpx.post(f"{llama._client.base_url}/api/chat",
                                   content=b"{not json"), 400, "JSON")


def test_unknown_options_are_ignored_as_ollama_ignores_them(llama, caplog):
    plain = llama.chat(model=MODEL, messages=CHAT, options=greedy(4))
    with caplog.at_level(logging.WARNING, logger="edgeprefill.server"):
        more = llama.chat(model=MODEL, messages=CHAT, keep_alive="5m",
                          options=greedy(4, temprature=2, num_thread=8, num_ctx=256))
    assert more.message.content == plain.message.content
    warned = [r.getMessage() for r in caplog.records if r.name == "edgeprefill.server"
              and "invalid option" in r.getMessage()]
    assert len(warned) == 1 and "options 'temprature'" in warned[0], warned


def test_only_a_name_ollama_does_not_know_is_warned_of(caplog):
    """Ollama's own names (api/types.go's Options and Runner) are taken quietly, used or
    not; a typo or a name it dropped (mirostat) gets one line naming it."""
    known = {"num_keep": 4, "num_batch": 8, "num_gpu": 1, "main_gpu": 0, "use_mmap": True,
             "num_thread": 2, "draft_num_predict": 3, "seed": 1, "min_p": 0.1,
             "ignore_eos": True}  # edgeprefill's own, as on the other routes
    with caplog.at_level(logging.WARNING, logger="edgeprefill.server"):
        parse_ollama_chat({"model": MODEL, "messages": CHAT, "options": known}, MODEL, 512)
        assert caplog.records == []
        parse_ollama_generate({"model": MODEL, "prompt": "w4", "options": {
            "temprature": 0, "mirostat": 2, "top_k": 5}}, MODEL, 512)
    warned = sorted(r.getMessage() for r in caplog.records)
    assert len(warned) == 2 and "options 'mirostat' is not" in warned[0] and \
        "options 'temprature' is not" in warned[1], warned
    assert all(r.levelno == logging.WARNING and r.name == "edgeprefill.server"
               for r in caplog.records)


def test_the_api_key_guards_ollama_s_routes_but_not_its_probe(engine):
    app = create_app(engine, ServerConfig(model_name=MODEL, api_key="k1"))
    with ServerThread(app, port=free_port()) as server, httpx.Client(
            base_url=server.url) as http:
        assert http.get("/").status_code == 200
        assert_ollama_error(http.get("/api/tags"), 401, "API key")
        ok = http.get("/api/tags", headers={"Authorization": "Bearer k1"})
        assert ok.status_code == 200


def test_tool_messages_answer_the_calls_before_them():
    """A tool result naming only its tool gets the id of that tool's call (templates
    pair results with calls by id); arguments go to the template as objects."""
    request = parse_ollama_chat({"model": MODEL, "messages": [
        {"role": "user", "content": "w4"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "a", "arguments": {"x": 1}}},
            {"function": {"name": "b", "arguments": {}}}]},
        {"role": "tool", "content": "w5", "tool_name": "b"},
        {"role": "tool", "content": "w6"}]}, MODEL, 512)
    _, assistant, first, second = request.prompt
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_1_0", "call_1_1"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert (first["tool_call_id"], first["name"]) == ("call_1_1", "b")
    assert (second["tool_call_id"], second["name"]) == ("call_1_0", "a")


@pytest.mark.parametrize("parse, body, name", [
    (parse_ollama_chat, {"messages": [{"role": "user", "content": "w4"}], "stream": "no"},
     "stream"),
    (parse_ollama_generate, {"prompt": "w4", "stream": 0}, "stream"),
    (parse_ollama_generate, {"prompt": "w4", "raw": "true"}, "raw"),
])
def test_a_flag_that_is_no_boolean_is_refused_naming_its_field(parse, body, name):
    # The routes' own copy of bool_field had left the field out of its error.
    with pytest.raises(ApiError, match=f"^'{name}' must be true or false$") as refused:
        parse({"model": MODEL, **body}, MODEL, 512)
    assert refused.value.param == name
    # null is the default, as in Ollama's Go structs (a nil *bool)
    assert parse({"model": MODEL, **body, name: None}, MODEL, 512).stream


def test_generate_defaults_to_no_limit_and_streaming():
    request = parse_ollama_generate({"model": MODEL, "prompt": "w4", "raw": True}, MODEL,
                                    512)
    assert request.stream and request.params.max_new_tokens is None
    assert request.prompt == "w4"
    with pytest.raises(ApiError, match="'options.num_predict' must be"):
        parse_ollama_generate({"model": MODEL, "prompt": "w4",
                               "options": {"num_predict": -5}}, MODEL, 512)


def test_a_stream_the_shutdown_cuts_ends_with_an_error_line(engine, monkeypatch):
    from tests.test_server_hardening import TIMEOUTS

    slow_down(monkeypatch, engine, 0.05)
    lines: list[dict] = []
    first = threading.Event()

    def read(url: str) -> None:
        body = {"model": MODEL, "messages": CHAT, "options": greedy(200)}
        with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=30) as response:
            for text in response.iter_lines():
                if text:
                    lines.append(json.loads(text))
                    first.set()

    app = create_app(engine, ServerConfig(model_name=MODEL))
    with ServerThread(app, port=free_port(), timeouts=TIMEOUTS) as server:
        reader = threading.Thread(target=read, args=(server.url,))
        reader.start()
        assert first.wait(30)
    reader.join(30)
    assert not lines[0]["done"] and len(lines) < 200
    assert set(lines[-1]) == {"error"} and "shutting down" in lines[-1]["error"]


def test_an_engine_failure_is_a_500_or_an_error_line(llama, http, engine, monkeypatch):
    def broken(batch):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.backend, "run", broken)
    assert_ollama_error(http.post("/api/chat", json={"model": MODEL, "messages": CHAT,
                                                     "stream": False}), 500, "device lost")
    with pytest.raises(ollama.ResponseError, match="device lost"):
        list(llama.generate(model=MODEL, prompt="w5", stream=True))


@pytest.mark.parametrize("text", ["a\u2028b", "a\u2029b", "a\x85b", "a\nb\u2028\u2028"])
def test_a_streamed_line_holding_a_unicode_line_break_reads_as_one_line(text):
    # The ollama client splits a stream with httpx's iter_lines, which (as str.splitlines)
    # ends a line at U+2028, U+2029 and U+0085 too: raw, they cut a reply in two.
    from edgeprefill.server.ollama_stream import line

    sent = line({"response": text, "done": False})
    lines = list(httpx.Response(200, content=sent).iter_lines())
    assert len(lines) == 1 and json.loads(lines[0])["response"] == text
