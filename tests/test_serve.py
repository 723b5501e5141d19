"""`edgeprefill serve`: a live server on a free loopback port, driven by the official
`openai` client and by raw HTTP (httpx)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, ServerThread, create_app  # noqa: E402

MODEL = "tiny"
# Random weights end a reply with EOS now and then; tests that count tokens ignore it.
NO_EOS = {"ignore_eos": True}


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(engine: Engine) -> ServerThread:
    """`engine` behind the app, as MODEL, on a free port: `with serving(engine) as server`."""
    return ServerThread(create_app(engine, ServerConfig(model_name=MODEL)), port=free_port())


def assert_leaving_stops_the_reply(http, engine: Engine, path: str, body: dict,
                                   lines: int) -> None:
    """A client that reads `lines` lines of a long streamed reply (400 tokens, slowed down)
    and closes the connection stops it long before its end."""
    before = engine.metrics().decode_tokens
    with http.stream("POST", path, json=body) as response:
        read = response.iter_lines()
        for _ in range(lines):
            next(read)
        assert engine.metrics().kv_active == 1
    # Leaving the block closed the connection mid-stream.
    wait_idle(engine)
    assert engine.metrics().decode_tokens - before < 200  # stopped long before 400


@pytest.fixture(scope="module")
def engine(bundle) -> Iterator[Engine]:
    # The conftest's tiny llama: words w0..w127, context 512, chunk buckets 16 and 64.
    # A fixed chunk makes the long prompt below a predictable run of 16-token chunks.
    engine = Engine.load(bundle("llama"), threads=2, kv_slots=4, policy="chunked+priority",
                         chunk_size=16)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    app = create_app(engine, ServerConfig(model_name=MODEL, max_pending=16))
    with ServerThread(app, port=free_port()) as server:
        yield server


@pytest.fixture(autouse=True)
def kv_is_clean_after_each_test(request) -> Iterator[None]:
    yield
    if "engine" in request.fixturenames:
        wait_idle(request.getfixturevalue("engine"))


def wait_idle(engine: Engine, timeout: float = 10.0) -> None:
    """Wait until no request runs and no KV slot is active, then check the bookkeeping."""
    deadline = time.monotonic() + timeout
    while True:
        m = engine.metrics()
        if m.running == 0 and m.kv_active == 0:
            break
        assert time.monotonic() < deadline, f"engine still busy: {m}"
        time.sleep(0.01)
    engine.check_integrity()


def slow_down(monkeypatch, engine: Engine, seconds: float) -> None:
    """Make every engine call take at least `seconds`, so a test can act mid-request."""
    run = engine.backend.run

    def slow_run(batch):
        time.sleep(seconds)
        return run(batch)

    monkeypatch.setattr(engine.backend, "run", slow_run)


def assert_error(response: httpx.Response, status: int, param: str | None = None,
                 code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


# -- completions and chat through the openai client ------------------------------------


def test_completion_reports_text_usage_and_length(client, engine):
    prompt = "w5 w6 w7 w8"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                      extra_body=NO_EOS)
    choice = reply.choices[0]
    assert reply.object == "text_completion" and reply.model == MODEL
    assert choice.finish_reason == "length" and choice.text.strip()
    assert reply.usage.prompt_tokens == len(engine.tokenizer.encode(prompt))
    assert reply.usage.completion_tokens == 6
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 6


def test_streamed_completion_matches_the_whole_one(client):
    args = dict(model=MODEL, prompt="w10 w11", max_tokens=8, temperature=0, extra_body=NO_EOS)
    whole = client.completions.create(**args).choices[0].text
    chunks = list(client.completions.create(stream=True, **args))
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"


def test_stop_string_ends_the_reply_with_stop(client):
    args = dict(model=MODEL, prompt="w5 w6 w7", max_tokens=8, temperature=0, extra_body=NO_EOS)
    words = client.completions.create(**args).choices[0].text.split()
    stop = words[2]
    if stop in words[:2]:
        pytest.skip("greedy output repeats its first words")
    reply = client.completions.create(stop=[stop], **args).choices[0]
    assert reply.finish_reason == "stop"
    assert reply.text.split() == words[:2]


def test_chat_completion_whole_and_streamed(client):
    messages = [{"role": "system", "content": "w3"}, {"role": "user", "content": "w4 w5"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5,
                                           temperature=0, extra_body=NO_EOS)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 5

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=NO_EOS,
    ))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


def test_raw_stream_is_http_sent_events_ending_with_done(http):
    body = {"model": MODEL, "prompt": "w9", "max_tokens": 3, "stream": True, **NO_EOS}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_models_health_and_token_id_prompts(client, http):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert http.get("/health").json()["status"] == "ok"
    reply = client.completions.create(model=MODEL, prompt=[1, 30, 31, 32], max_tokens=2)
    assert reply.usage.prompt_tokens == 4


def test_high_priority_stream_overtakes_a_long_low_priority_prompt(
    client, engine, monkeypatch
):
    slow_down(monkeypatch, engine, 0.004)  # 25 chunks of 16 tokens: ~100 ms of prefill
    long_prompt = [10 + i % 40 for i in range(400)]
    first_token: dict[str, float] = {}
    texts: dict[str, str] = {}

    def consume(name: str, prompt, priority: int) -> None:
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                           stream=True, extra_body={"priority": priority, **NO_EOS})
        pieces = []
        for chunk in stream:
            if chunk.choices[0].text and name not in first_token:
                first_token[name] = time.perf_counter()
            pieces.append(chunk.choices[0].text)
        texts[name] = "".join(pieces)

    before = engine.metrics().prefill_tokens
    low = threading.Thread(target=consume, args=("low", long_prompt, 0))
    low.start()
    while engine.metrics().prefill_tokens == before:  # the long prefill has begun
        time.sleep(0.001)
    high = threading.Thread(target=consume, args=("high", "w20 w21", "high"))
    high.start()
    low.join(30)
    high.join(30)
    assert first_token["high"] < first_token["low"]
    assert texts["low"] and texts["high"]


# -- errors -----------------------------------------------------------------------------

BAD_COMPLETIONS = [
    # (raw body, status, param, code)
    (b"{not json", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, None),
    (b'"a string"', 400, None, None),
    (b'{"prompt": ""}', 400, "prompt", None),
    (b'{"prompt": "  \\n "}', 400, "prompt", None),  # this tokenizer drops it: the BOS alone
    (b'{"prompt": []}', 400, "prompt", None),
    (b'{"prompt": 5}', 400, "prompt", None),
    (b'{"prompt": ["a", "b"]}', 400, "prompt", None),
    (b'{"prompt": "w5", "max_tokens": "5"}', 400, "max_tokens", None),
    (b'{"prompt": "w5", "max_tokens": 0}', 400, "max_tokens", None),
    (b'{"prompt": "w5", "max_tokens": 512}', 400, "max_tokens", "context_length_exceeded"),
    (b'{"prompt": "w5", "temperature": "hot"}', 400, "temperature", None),
    (b'{"prompt": "w5", "temperature": NaN}', 400, "temperature", None),
    (b'{"prompt": "w5", "temperature": 3}', 400, "temperature", None),
    (b'{"prompt": "w5", "top_p": Infinity}', 400, "top_p", None),
    (b'{"prompt": "w5", "top_p": 0}', 400, "top_p", None),
    (b'{"prompt": "w5", "top_k": -1}', 400, "top_k", None),
    (b'{"prompt": "w5", "seed": -1}', 400, "seed", None),
    (b'{"prompt": "w5", "repetition_penalty": -Infinity}', 400, "repetition_penalty", None),
    (b'{"prompt": "w5", "stream": "yes"}', 400, "stream", None),
    (b'{"prompt": "w5", "stop": 5}', 400, "stop", None),
    (b'{"prompt": "w5", "priority": 1.5}', 400, "priority", None),
    (b'{"prompt": "w5", "n": 17}', 400, "n", None),
    (b'{"prompt": "w5", "user": 5}', 400, "user", None),
    (b'{"prompt": "w5", "stream_options": {"include_usage": true}}', 400, "stream_options",
     None),
    (b'{"prompt": "w5", "stream": true, "stream_options": {"continuous_usage_stats": true}}',
     400, "stream_options", None),
    (b'{"prompt": [1, 99999]}', 400, "prompt", None),
    (b'{"prompt": "w5", "model": "gpt-4"}', 404, "model", "model_not_found"),
]
BAD_CHATS = [
    (b'{"messages": []}', 400, "messages", None),
    (b'{"messages": "hi"}', 400, "messages", None),
    (b'{"messages": [{"content": "w5"}]}', 400, "messages[0]", None),
    (b'{"messages": [{"role": "user", "content": 7}]}', 400, "messages[0].content", None),
    (b'{"messages": [{"role": "user", "content": "w5"}], "max_tokens": 1000}', 400,
     "max_tokens", "context_length_exceeded"),
]


@pytest.mark.parametrize("body, status, param, code", BAD_COMPLETIONS)
def test_bad_completion_requests_get_openai_errors(http, body, status, param, code):
    response = http.post("/v1/completions", content=body,
                          headers={"Content-Type": "application/json"})
    assert_error(response, status, param, code)


@pytest.mark.parametrize("body, status, param, code", BAD_CHATS)
def test_bad_chat_requests_get_openai_errors(http, body, status, param, code):
    response = http.post("/v1/chat/completions", content=body)
    assert_error(response, status, param, code)


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt="w5", temperature=5)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="w5")


def test_unknown_route_is_a_404_in_the_error_schema(http):
    assert_error(http.get("/v1/nothing"), 404)
    assert_error(http.get("/v1/completions"), 405)
    # not a 307 to a URL built from the Host header
    slash = http.post("/v1/completions/", json={"prompt": "w5"}, headers={"Host": "evil.example"})
    assert_error(slash, 404)
    assert "location" not in slash.headers


def test_a_body_over_the_limit_is_a_413_with_or_without_a_length(engine):
    app = create_app(engine, ServerConfig(model_name=MODEL, max_body_bytes=100))
    small = json.dumps({"model": MODEL, "prompt": "w5", "max_tokens": 1}).encode()
    big = json.dumps({"model": MODEL, "prompt": "w5 " * 100, "max_tokens": 1}).encode()
    with ServerThread(app, port=free_port()) as server:
        url = f"{server.url}/v1/completions"
        assert httpx.post(url, content=small).status_code == 200
        assert_error(httpx.post(url, content=big), 413, code="request_too_large")
        chunked = iter([big[:60], big[60:]])  # a generator body is sent without a length
        assert_error(httpx.post(url, content=chunked), 413, code="request_too_large")


def test_a_closed_engine_answers_503(bundle):
    engine = Engine.load(bundle("llama"), threads=1, kv_slots=1)
    app = create_app(engine, ServerConfig(model_name=MODEL))
    with ServerThread(app, port=free_port()) as server:
        engine.close()
        response = httpx.post(f"{server.url}/v1/completions",
                              json={"model": MODEL, "prompt": "w5", "max_tokens": 2})
        assert_error(response, 503, code="engine_closed")
        assert response.headers["retry-after"]


def test_bad_requests_never_disturb_a_running_stream(client, http, engine, monkeypatch):
    slow_down(monkeypatch, engine, 0.002)
    result: dict[str, object] = {}

    def consume() -> None:
        chunks = list(client.completions.create(model=MODEL, prompt="w7 w8 w9", max_tokens=40,
                                                stream=True, extra_body=NO_EOS))
        result["tokens"] = sum(1 for c in chunks if c.choices[0].text)
        result["finish"] = chunks[-1].choices[0].finish_reason

    worker = threading.Thread(target=consume)
    worker.start()
    for body, status, _, _ in BAD_COMPLETIONS:
        assert http.post("/v1/completions", content=body).status_code == status
    worker.join(30)
    assert result == {"tokens": 40, "finish": "length"}


# -- admission, authentication, disconnects ----------------------------------------------


def test_full_server_answers_429_and_recovers(engine, monkeypatch):
    slow_down(monkeypatch, engine, 0.005)
    app = create_app(engine, ServerConfig(model_name=MODEL, max_pending=1))
    # 300 tokens at >= 5 ms each: the first request is still generating when the second
    # arrives, even on a loaded machine (at 30 it sometimes finished first).
    body = {"model": MODEL, "prompt": "w5", "max_tokens": 300, "stream": True, **NO_EOS}
    with ServerThread(app, port=free_port()) as server:
        url = f"{server.url}/v1/completions"
        with httpx.stream("POST", url, json=body) as first:
            # Keep the iterator: a dropped one closes the connection, cancelling the request.
            lines = first.iter_lines()
            next(lines)  # admitted and generating
            busy = httpx.post(url, json={"model": MODEL, "prompt": "w6"})
            assert_error(busy, 429, code="queue_full")
            assert busy.headers["retry-after"]
            rest = list(lines)
        assert "data: [DONE]" in rest
        assert httpx.post(url, json={"model": MODEL, "prompt": "w6"}).status_code == 200


def test_api_key_is_required_except_for_health(engine):
    app = create_app(engine, ServerConfig(model_name=MODEL, api_key="s3cret"))
    with ServerThread(app, port=free_port()) as server:
        url = f"{server.url}/v1/models"
        assert_error(httpx.get(url), 401, code="invalid_api_key")
        assert_error(httpx.get(url, headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(httpx.get(f"{server.url}/metrics"), 401)
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(f"{server.url}/health").status_code == 200
        good = openai.OpenAI(base_url=f"{server.url}/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="w5", max_tokens=2).choices
        bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=MODEL, prompt="w5", max_tokens=2)


def test_client_leaving_mid_stream_cancels_the_request_and_frees_its_kv(
    http, engine, monkeypatch
):
    slow_down(monkeypatch, engine, 0.005)
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 400, "stream": True, **NO_EOS}
    assert_leaving_stops_the_reply(http, engine, "/v1/completions", body, lines=3)
    assert engine.kv.usage().active == 0


def test_client_timing_out_on_a_whole_reply_cancels_it(http, engine, monkeypatch):
    slow_down(monkeypatch, engine, 0.005)
    before = engine.metrics().decode_tokens
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 400, **NO_EOS}
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json=body, timeout=0.3)
    wait_idle(engine)
    assert engine.metrics().decode_tokens - before < 200


def test_a_queued_request_whose_client_leaves_is_dropped_from_the_queue(
    http, engine, monkeypatch
):
    slow_down(monkeypatch, engine, 0.005)
    body = {"model": MODEL, "prompt": "w5", "max_tokens": 200, "stream": True, **NO_EOS}
    with ExitStack() as running:
        for _ in range(4):  # every KV slot busy
            running.enter_context(http.stream("POST", "/v1/completions", json=body))
        with http.stream("POST", "/v1/completions", json=body):
            wait_for(lambda: engine.metrics().queue_depth == 1)
        wait_for(lambda: engine.metrics().queue_depth == 0)
        assert engine.metrics().kv_active == 4  # the others still run
    wait_idle(engine)


def test_an_engine_failure_is_a_500_or_an_error_event(client, http, engine, monkeypatch):
    def broken(batch):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.backend, "run", broken)
    whole = http.post("/v1/completions", json={"model": MODEL, "prompt": "w5"})
    assert "device lost" in assert_error(whole, 500)["message"]
    with pytest.raises(openai.APIError, match="device lost"):
        list(client.completions.create(model=MODEL, prompt="w5", stream=True))


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


# -- metrics ------------------------------------------------------------------------------


def test_metrics_are_prometheus_text_with_latency_histograms(client, http):
    client.completions.create(model=MODEL, prompt="w5 w6", max_tokens=4, extra_body=NO_EOS)
    text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("edgeprefill_request_ttft_seconds",
                 "edgeprefill_request_inter_token_latency_seconds"):
        assert families[name].type == "histogram"
        count = next(s for s in families[name].samples if s.name == f"{name}_count")
        assert count.value >= 1
    assert families["edgeprefill_kv_slots"].samples[0].value == 4
    assert families["edgeprefill_prefill_tokens"].type == "counter"
    assert families["edgeprefill_decode_tokens"].samples[0].value > 0
    assert "edgeprefill_max_decode_stall_seconds" in families
    requests = families["edgeprefill_http_requests"].samples
    assert any(s.labels["finish_reason"] == "length" for s in requests)
    # The README names every metric the server exports.
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    missing = [name for name in families if not name.endswith("_created")  # the client's
               and f"`{name.removeprefix('edgeprefill_')}" not in readme]
    assert missing == []


def rejected_by_status(metrics_text: str) -> dict[str, float]:
    family = next(f for f in text_string_to_metric_families(metrics_text)
                  if f.name == "edgeprefill_http_rejected")
    return {s.labels["status"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_every_refused_request_is_counted_once_by_its_status_whichever_layer_refused_it(
        engine):
    # README: http_rejected_total{status} counts the 4xx/5xx answers. The reference is the
    # status each client got: a refused body (the chat route), a key check's 401, a
    # model route's 404, a tokenize route's 400, the router's own 404 and 405.
    app = create_app(engine, ServerConfig(model_name=MODEL, api_key="k"))
    key = {"Authorization": "Bearer k"}
    with ServerThread(app, port=free_port()) as server:
        with httpx.Client(base_url=server.url, headers=key) as http:
            before = rejected_by_status(http.get("/metrics").text)
            answers = [
                http.post("/v1/completions", json={"prompt": "w1", "bogus": 1}),
                http.get("/v1/models", headers={"Authorization": "Bearer wrong"}),
                http.get("/v1/models/nope"),
                http.post("/tokenize", content=b"{not json"),
                http.get("/no/such/route"),
                http.get("/v1/completions"),
                http.post("/api/show", json={"model": "nope"}),
            ]
            after = rejected_by_status(http.get("/metrics").text)
    expected: dict[str, float] = {}
    for answer in answers:
        expected[str(answer.status_code)] = expected.get(str(answer.status_code), 0) + 1
    assert sorted(expected) == ["400", "401", "404", "405"]
    assert {status: after[status] - before.get(status, 0) for status in after} == expected


def finished_requests(http: httpx.Client, reason: str) -> float:
    text = http.get("/metrics").text
    samples = next(f for f in text_string_to_metric_families(text)
                   if f.name == "edgeprefill_http_requests").samples
    return sum(s.value for s in samples if s.labels["finish_reason"] == reason)


def histogram_count(http: httpx.Client, name: str) -> float:
    families = text_string_to_metric_families(http.get("/metrics").text)
    samples = next(f for f in families if f.name == name).samples
    return next(s.value for s in samples if s.name == f"{name}_count")


def requests_counted(api) -> float:
    """Every request edgeprefill_http_requests counts, whatever its endpoint and end."""
    family = next(f for f in text_string_to_metric_families(api.metrics.render().decode())
                  if f.name == "edgeprefill_http_requests")
    return sum(s.value for s in family.samples if s.name.endswith("_total"))


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "w5", "max_tokens": 3, **NO_EOS}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}],
                              "max_tokens": 3, **NO_EOS}),
    # greedy: the two routes without ignore_eos sampled, and an early EOS or a token of no
    # text leaves a single chunk, the last (the ollama case failed so once, stop 57)
    ("/v1/messages", {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 3,
                      "temperature": 0}),
    ("/api/generate", {"prompt": "w5", "options": {"num_predict": 3, "temperature": 0}}),
], ids=["completions", "chat", "messages", "ollama"])
def test_a_streamed_reply_frees_its_place_and_is_counted_before_its_last_bytes(
        engine, monkeypatch, path, body):
    """The place under --max-pending and the request's metrics had waited for the response
    to end after its last bytes: a client's next request could get a 429, and a scrape
    right after `[DONE]` missed the request (16 of 200 times). What the server holds is
    read as each chunk of the body is handed to the connection."""
    slow_down(monkeypatch, engine, 0.02)  # its first chunk goes out while it generates
    app = create_app(engine, ServerConfig(model_name=MODEL, max_pending=1))
    api = app.state.api
    seen: list[tuple[int, float]] = []  # (places taken, requests counted) at each chunk

    async def watched(scope, receive, send):
        async def send_watched(message):
            if message["type"] == "http.response.body" and message.get("body"):
                seen.append((api.pending, requests_counted(api)))
            await send(message)
        await app(scope, receive, send_watched)

    with ServerThread(watched, port=free_port()) as server:
        before = requests_counted(api)
        with httpx.stream("POST", f"{server.url}{path}",
                          json={"model": MODEL, "stream": True, **body}) as response:
            assert response.status_code == 200
            response.read()
    assert len(seen) >= 2 and seen[0] == (1, before)  # held while it generates
    assert seen[-1] == (0, before + 1)  # the last bytes: given back, counted


def test_every_choice_s_gaps_are_inter_token_latencies(http):
    itl = "edgeprefill_request_inter_token_latency_seconds"
    before = histogram_count(http, itl)
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 4, "n": 3, **NO_EOS}
    assert http.post("/v1/completions", json=body).status_code == 200
    assert histogram_count(http, itl) - before == 3 * 3  # not only the first choice's


def test_n_choices_left_while_one_still_waits_count_as_cancelled(http, engine, monkeypatch):
    """One KV slot free: choice 1 runs once choice 0 has ended with `length`. The request
    was counted as that though its client left while choice 1 ran."""
    slow_down(monkeypatch, engine, 0.005)
    before = finished_requests(http, "cancelled")
    busy = {"model": MODEL, "prompt": "w5", "max_tokens": 400, "stream": True, **NO_EOS}
    with ExitStack() as running:
        for _ in range(3):  # one KV slot left: choice 0 runs, choice 1 waits for it
            running.enter_context(http.stream("POST", "/v1/completions", json=busy))
        body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 50, "n": 2, "stream": True,
                **NO_EOS}
        with http.stream("POST", "/v1/completions", json=body) as response:
            for line in response.iter_lines():  # leave at choice 1's first token
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["index"]:
                    break
        wait_for(lambda: finished_requests(http, "cancelled") == before + 1)
    wait_idle(engine)


# -- the command ---------------------------------------------------------------------------


def test_serve_command_runs_with_the_api_key_from_the_environment(bundle):
    port = free_port()
    env = {**os.environ, "EDGEPREFILL_API_KEY": "from-env"}
    command = [sys.executable, "-c", "from edgeprefill.cli.main import main; main()",
               "serve", str(bundle("llama")), "--port", str(port), "--model-name", MODEL]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read()
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.1)
        assert_error(httpx.get(f"{url}/v1/models"), 401)
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer from-env"})
        assert models.json()["data"][0]["id"] == MODEL
    finally:
        process.send_signal(signal.SIGINT)  # uvicorn shuts down gracefully on Ctrl-C
        assert process.wait(timeout=30) == 0


def test_serve_on_port_0_serves_on_the_port_the_os_picked_and_prints_it(bundle):
    """The line naming the address names the port served (uvicorn's own, which only debug
    shows, is not logged for a socket handed to it)."""
    command = [sys.executable, "-c", "from edgeprefill.cli.main import main; main()",
               "serve", str(bundle("llama")), "--port", "0", "--log-level", "debug"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr or ()],
                     daemon=True).start()

    def line_with(text: str) -> str:  # queue.Empty where none comes within a minute
        return next(line for line in iter(lambda: lines.get(timeout=60), None) if text in line)

    try:
        port = int(re.search(r"serving .* on http://127\.0\.0\.1:(\d+)/v1 ",
                             line_with("serving "))[1])
        line_with("Application startup complete")
        assert port != 0 and httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0


def test_serve_command_says_which_port_is_taken(bundle):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli
    from edgeprefill.errors import EdgeprefillError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", str(bundle("llama")), "--port", str(port)])
    assert isinstance(result.exception, EdgeprefillError)
    assert f"cannot listen on 127.0.0.1:{port}" in str(result.exception)


def test_n_choices_count_against_max_pending(engine, monkeypatch):
    # Each choice runs as a request of its own in the engine, whose queue `serve` makes
    # max_pending long: admitting n on one place let later choices fail halfway (a 500).
    slow_down(monkeypatch, engine, 0.005)
    app = create_app(engine, ServerConfig(model_name=MODEL, max_pending=3))
    body = {"model": MODEL, "prompt": "w5", "max_tokens": 300, "stream": True, **NO_EOS}
    with ServerThread(app, port=free_port()) as server:
        url = f"{server.url}/v1/completions"
        assert_error(httpx.post(url, json={"model": MODEL, "prompt": "w5", "n": 4}), 400, "n")
        with httpx.stream("POST", url, json={**body, "n": 2}) as first:
            lines = first.iter_lines()
            next(lines)  # admitted: two of three places taken
            busy = httpx.post(url, json={"model": MODEL, "prompt": "w6", "n": 2})
            assert_error(busy, 429, code="queue_full")
            one = httpx.post(url, json={"model": MODEL, "prompt": "w6", "max_tokens": 2})
            assert one.status_code == 200
            rest = list(lines)
        assert "data: [DONE]" in rest
        wait_idle(engine)
        again = httpx.post(url, json={"model": MODEL, "prompt": "w6", "max_tokens": 2, "n": 3})
        assert len(again.json()["choices"]) == 3
