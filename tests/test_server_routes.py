"""/tokenize, /detokenize, /v1/models/{id}, /version and the per-request log line, on a
live loopback server; `serve --backend/--device/--log-level` through the command."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

import edgeprefill  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402
from tests import served_llama  # noqa: E402
from tests.test_serve import MODEL, NO_EOS, assert_error, free_port  # noqa: E402

# The live server the API test modules share (tests/served_llama.py).
engine = served_llama.engine
server = served_llama.server
kv_is_clean_after_each_test = served_llama.kv_is_clean_after_each_test


# -- /tokenize and /detokenize ---------------------------------------------------------


def test_tokenize_in_vllm_shape_counts_the_tokenizers_ids(http, engine):
    reply = http.post("/tokenize", json={"model": MODEL, "prompt": "w5 w6 w7"}).json()
    tokenizer = engine.tokenizer.tokenizer  # the bundle's tokenizers.Tokenizer
    assert reply["tokens"] == tokenizer.encode("w5 w6 w7", add_special_tokens=True).ids
    assert reply["count"] == len(reply["tokens"]) == 3
    assert reply["max_model_len"] == engine.capacity


def test_tokenize_in_llama_server_shape_and_with_pieces(http):
    reply = http.post("/tokenize", json={"content": "w9 w10", "with_pieces": True}).json()
    assert reply["tokens"] == [{"id": 9, "piece": "w9"}, {"id": 10, "piece": "w10"}]
    strs = http.post("/tokenize", json={"prompt": "w9", "return_token_strs": True}).json()
    assert strs["token_strs"] == ["w9"]


def test_tokenize_messages_renders_the_chat_template(http, engine):
    messages = [{"role": "user", "content": "w4 w5"}]
    with_prompt = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    bare = http.post("/tokenize", json={"messages": messages,
                                        "add_generation_prompt": False}).json()["tokens"]
    # The conftest template: "user: w4 w5 ; assistant: " (unknown words are w0).
    encode = engine.tokenizer.encode_plain
    assert with_prompt == encode("user: w4 w5 ; assistant: ")
    assert bare == encode("user: w4 w5 ; ")
    # Content parts as the chat route takes them (joined), so /tokenize shows what runs.
    parts = [{"role": "user", "content": [{"type": "text", "text": "w4 "},
                                          {"type": "text", "text": "w5"}]}]
    assert http.post("/tokenize", json={"messages": parts}).json()["tokens"] == with_prompt
    chat = http.post("/v1/chat/completions", json={"messages": parts, "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == len(with_prompt)


def test_detokenize_inverts_tokenize(http):
    ids = http.post("/tokenize", json={"prompt": "w5 w60 w7"}).json()["tokens"]
    reply = http.post("/detokenize", json={"model": MODEL, "tokens": ids}).json()
    assert reply["prompt"] == reply["content"] == "w5 w60 w7"
    assert http.post("/detokenize", json={"tokens": []}).json()["prompt"] == ""


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"prompt": "w5", "content": "w5"}, 400, None),
    ("/tokenize", {}, 400, None),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"prompt": "w5", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "w5", "bogus": 1}, 400, "bogus"),
    ("/tokenize", {"messages": "hi"}, 400, "messages"),
    ("/tokenize", {"prompt": "w5", "model": "gpt-4"}, 404, "model"),
    ("/detokenize", {"tokens": "w5"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, 99999]}, 400, "tokens"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "prompt": "x"}, 400, "prompt"),
])
def test_bad_tokenize_and_detokenize_requests_get_openai_errors(http, path, body, status,
                                                                param):
    assert_error(http.post(path, json=body), status, param)


def test_tokenize_refuses_a_body_that_is_not_json(http):
    assert_error(http.post("/tokenize", content=b"{nope"), 400, code="invalid_json")


# -- /v1/models/{id} and /version -------------------------------------------------------


def test_retrieve_model_with_the_openai_client(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.owned_by == "edgeprefill"
    assert model.model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_version_names_the_package_version_and_backend(http):
    assert http.get("/version").json() == {"version": edgeprefill.__version__,
                                           "backend": "onnxruntime", "device": "cpu"}


# -- one log line per request -------------------------------------------------------------


def wait_for_lines(caplog, count: int, timeout: float = 5.0) -> list[str]:
    """The line is written after the last byte is sent, so it may trail the reply."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [r.getMessage() for r in caplog.records
                 if r.name == "edgeprefill.server" and r.levelno >= logging.INFO]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def settle_log(http, caplog) -> None:
    """Lines trail their replies: an earlier test's last line may land after this test
    starts capturing. Wait for a sentinel request's own line, then start clean."""
    http.get("/v1/models/log-sentinel")
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and not any(
            "/v1/models/log-sentinel" in r.getMessage() for r in caplog.records):
        time.sleep(0.01)
    caplog.clear()


def test_each_request_logs_one_line_with_tokens_ttft_and_duration(http, caplog):
    caplog.set_level(logging.DEBUG, logger="edgeprefill.server")
    settle_log(http, caplog)
    # Each line is awaited before the next request: a streamed reply's line is written
    # after its last byte, so under load it could land after the next request's.
    reply = http.post("/v1/completions", json={"prompt": "w5 w6", "max_tokens": 4, **NO_EOS})
    wait_for_lines(caplog, 1)
    streamed = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "w7"}], "max_tokens": 3, "stream": True,
        **NO_EOS})
    wait_for_lines(caplog, 2)
    http.post("/v1/completions", json={"prompt": ""})
    wait_for_lines(caplog, 3)
    http.get("/health")  # a probe: logged at debug only
    http.get("/v1/nothing")
    lines = wait_for_lines(caplog, 4)
    assert len(lines) == 4, lines
    first, chat, bad, missing = (line.split() for line in lines)
    usage = reply.json()["usage"]
    assert first[:5] == ["POST", "/v1/completions", "200",
                         f"prompt_tokens={usage['prompt_tokens']}", "completion_tokens=4"]
    assert float(first[5].removeprefix("ttft_ms=")) > 0
    assert float(first[6].removeprefix("duration_ms=")) >= float(first[5][8:])
    assert streamed.status_code == 200
    assert chat[:3] == ["POST", "/v1/chat/completions", "200"] and chat[4] == \
        "completion_tokens=3"
    assert bad[:5] == ["POST", "/v1/completions", "400", "prompt_tokens=-",
                       "completion_tokens=-"]
    assert missing[:3] == ["GET", "/v1/nothing", "404"]
    probes = [r.levelno for r in caplog.records if r.getMessage().startswith("GET /health ")]
    assert probes == [logging.DEBUG]


# -- the command ---------------------------------------------------------------------------


def serve_process(bundle_path, *options: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "edgeprefill", "serve", str(bundle_path), "--port",
               str(port), "--model-name", MODEL, "--threads", "1", *options]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)


def stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0
    return process.stderr.read()


@pytest.mark.parametrize("level, logged", [("info", True), ("warning", False)])
def test_serve_log_level_and_engine_options(bundle, level, logged):
    process, url = serve_process(bundle("llama"), "--backend", "onnxruntime", "--device",
                                 "cpu", "--kv-slots", "1", "--max-context", "64",
                                 "--log-level", level)
    try:
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["context_length"] == 64
        httpx.post(f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 2})
    finally:
        err = stop(process)
    request_lines = [line for line in err.splitlines() if "POST /v1/completions 200" in line]
    assert len(request_lines) == (1 if logged else 0), err
    if logged:
        assert "prompt_tokens=1 completion_tokens=" in request_lines[0]


def test_the_server_listens_once_its_prompt_workers_run(engine):
    """Started in the background, they made the first request after startup wait ~0.2 s."""
    app = create_app(engine, ServerConfig(model_name=MODEL, prompt_workers=2))
    with ServerThread(app, port=free_port()):
        assert app.state.api.prompts.running == 2


def test_a_request_the_shutdown_cancels_is_logged_with_the_503_it_got(engine, caplog,
                                                                      monkeypatch):
    import asyncio

    from edgeprefill.server.app import OpenAIApi

    async def cancelled(self, request, chat):  # what uvicorn's shutdown timeout does
        raise asyncio.CancelledError

    monkeypatch.setattr(OpenAIApi, "_complete", cancelled)
    caplog.set_level(logging.INFO, logger="edgeprefill.server")
    app = create_app(engine, ServerConfig(model_name=MODEL))

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await client.post("/v1/completions", json={"prompt": "w5"})

    response = asyncio.run(post())
    assert_error(response, 503, code="shutting_down")
    lines = [r.getMessage() for r in caplog.records if r.name == "edgeprefill.server"]
    assert [line.split()[:3] for line in lines] == [["POST", "/v1/completions", "503"]]


def test_chat_template_variables_reach_the_template(http):
    messages = [{"role": "user", "content": "w4 w5"}]
    bare = http.post("/tokenize", json={"messages": messages,
                                        "add_generation_prompt": False}).json()["count"]
    assert http.post("/tokenize", json={"messages": messages, "chat_template_kwargs": {
        "add_generation_prompt": False}}).json()["count"] == bare
    for extra in ({"add_generation_prompt": False},
                  {"chat_template_kwargs": {"add_generation_prompt": False}}):
        reply = http.post("/v1/chat/completions",
                          json={"messages": messages, "max_tokens": 1, **extra})
        assert reply.json()["usage"]["prompt_tokens"] == bare, extra
    refused = http.post("/v1/chat/completions", json={
        "messages": messages, "chat_template_kwargs": {"messages": []}})
    assert_error(refused, 400, "chat_template_kwargs")
    chat_only = http.post("/v1/completions", json={"prompt": "w4",
                                                   "chat_template_kwargs": {"x": 1}})
    assert_error(chat_only, 400, "chat_template_kwargs")
