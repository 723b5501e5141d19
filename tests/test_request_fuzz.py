"""Property-based: no request body, however malformed, gets a 5xx or a reply outside the
route's error schema (OpenAI's; Anthropic's on the Messages API; Ollama's on /api/...).
The app runs in-process (starlette's TestClient) over the tiny llama bundle with a
64-position context, so every example is quick; the pair-scoring routes over a tiny token
reranker, TEI's /embed over a tiny embedding bundle."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("starlette")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerConfig, create_app  # noqa: E402
from tests.test_embed import embed_bundle, embed_model  # noqa: E402
from tests.test_score import reranker  # noqa: E402

__all__ = ["embed_bundle", "embed_model", "reranker"]  # fixtures, found by their names

MODEL = "tiny"
FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def counts(examples: int) -> list:
    """How many bodies a test tries: a third in the default suite, all in the slow one.
    Derandomized, so each run tries the same bodies and a failure found once recurs."""
    return [examples // 3, pytest.param(examples, marks=pytest.mark.slow)]


# Any JSON value, small: scalars (with awkward text and numbers) nested a few levels.
text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["", "w5 w6", "\ud800", "w1 " * 80, "\x00", "user", "assistant"])
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | text)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(text, inner, max_size=4), max_leaves=10)

small_ints = st.integers(-3, 70)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | json_values},
    optional={"content": st.sampled_from(["w5 w6", ""]) | json_values,
              "name": json_values})
messages = st.lists(message, max_size=3) | json_values
prompt = (st.sampled_from(["w5 w6 w7", "", "w9 " * 70]) | st.lists(small_ints, max_size=8)
          | st.lists(st.lists(small_ints, max_size=3), max_size=2) | json_values)


def field(valid):
    return valid | json_values


COMMON = {
    "model": field(st.sampled_from([MODEL, "other"])),
    "max_tokens": field(small_ints),
    "max_completion_tokens": field(small_ints),
    "temperature": field(st.floats(-1, 3)),
    "top_p": field(st.floats(-0.5, 1.5)),
    "top_k": field(small_ints),
    "seed": field(st.integers(-5, 2**64)),
    "stop": field(st.lists(text, max_size=5)),
    "stream": field(st.booleans()),
    "stream_options": field(st.fixed_dictionaries({"include_usage": field(st.booleans())})),
    "priority": field(st.integers(-(2**40), 2**40)),
    "chunk_size": field(small_ints),
    "ignore_eos": field(st.booleans()),
    "repetition_penalty": field(st.floats(-1, 11)),
    "n": field(st.integers(0, 3)),
    "logprobs": json_values,
    "logit_bias": json_values,
    "presence_penalty": json_values,
    "tools": json_values,
    "response_format": json_values,
}
# The Messages API's (Anthropic's) fields, valid-ish values mixed with any JSON.
block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image"])
     | json_values},
    optional={"text": field(text), "id": json_values, "name": json_values,
              "input": json_values, "tool_use_id": json_values, "content": json_values,
              "thinking": json_values})
anthropic_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]) | json_values},
    optional={"content": st.sampled_from(["w5 w6", ""]) | st.lists(block, max_size=3)
              | json_values})
MESSAGES_API = {
    "model": COMMON["model"],
    "messages": st.lists(anthropic_message, max_size=3) | json_values,
    "system": field(text | st.lists(block, max_size=2)),
    "max_tokens": COMMON["max_tokens"],
    "stop_sequences": COMMON["stop"],
    "temperature": COMMON["temperature"],
    "top_k": COMMON["top_k"],
    "stream": COMMON["stream"],
    "tools": field(st.lists(st.fixed_dictionaries(
        {"name": field(st.just("get_weather"))},
        optional={"input_schema": json_values, "type": json_values}), max_size=2)),
    "tool_choice": field(st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any", "tool", "none"]) | json_values},
        optional={"name": json_values, "disable_parallel_tool_use": json_values})),
    "thinking": field(st.fixed_dictionaries(
        {"type": st.sampled_from(["enabled", "disabled", "adaptive"]) | json_values},
        optional={"budget_tokens": json_values})),
    "metadata": json_values,
}
# Ollama's fields (server/ollama_request.py), valid-ish values mixed with any JSON.
ollama_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | json_values},
    optional={"content": field(text), "thinking": json_values, "images": json_values,
              "tool_name": json_values, "tool_call_id": json_values,
              "tool_calls": field(st.lists(st.fixed_dictionaries(
                  {"function": field(st.fixed_dictionaries(
                      {"name": field(st.just("get_weather"))},
                      optional={"arguments": json_values}))}), max_size=2))})
OLLAMA = {
    "model": field(st.sampled_from([MODEL, f"{MODEL}:latest", "other"])),
    "messages": st.lists(ollama_message, max_size=3) | json_values,
    "prompt": field(text),
    "system": field(text),
    "raw": field(st.booleans()),
    "stream": field(st.booleans()),
    "format": field(st.sampled_from(["json", "", {"type": "object"}])),
    "think": field(st.sampled_from([True, False, "low", "max"])),
    "options": field(st.fixed_dictionaries({}, optional={
        name: field(small_ints) for name in (
            "num_predict", "num_ctx", "top_k", "seed", "temperature", "top_p", "min_p",
            "repeat_penalty", "repeat_last_n", "typical_p", "stop", "num_thread")})),
    "tools": COMMON["tools"],
    "keep_alive": json_values,
    "suffix": field(text),
    "images": json_values,
}
# The Responses API's fields (server/responses_request.py, responses_input.py).
responses_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image"]) | json_values},
    optional={"text": field(text)})
responses_item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output",
                              "reasoning", "item_reference"]) | json_values},
    optional={"role": st.sampled_from(["user", "developer", "assistant"])
              | json_values,
              "content": field(st.sampled_from(["w5 w6", ""])
                               | st.lists(responses_part, max_size=2)),
              "call_id": json_values, "name": field(st.just("get_weather")),
              "arguments": field(st.just("{}")), "output": json_values,
              "summary": json_values})
RESPONSES_API = {
    "model": COMMON["model"],
    "input": field(st.sampled_from(["w5 w6", ""]) | st.lists(responses_item, max_size=3)),
    "instructions": field(text),
    "max_output_tokens": COMMON["max_tokens"],
    "temperature": COMMON["temperature"],
    "top_p": COMMON["top_p"],
    "stream": COMMON["stream"],
    "tools": json_values,
    "tool_choice": field(st.sampled_from(["auto", "none", "required"])),
    "text": field(st.fixed_dictionaries({}, optional={"format": json_values})),
    "reasoning": field(st.fixed_dictionaries({}, optional={"effort": json_values,
                                                            "summary": json_values})),
    "previous_response_id": json_values,
    "store": json_values,
    "include": json_values,
    "truncation": json_values,
    "metadata": json_values,
}
# The pair-scoring and embedding routes' fields (server/score.py, rerank.py, tei.py)
score_text = st.sampled_from(["w5 w6", "", "w7 " * 130, "w9"])
score_side = (score_text | st.lists(score_text, min_size=1, max_size=3)
              | st.lists(score_text, max_size=3) | json_values)
flags = st.booleans() | st.none() | json_values
direction = field(st.sampled_from(["right", "Left", "up"]))
served = st.none() | st.just(MODEL) | COMMON["model"]  # absent, null or named: served
SCORE_API = {"model": served, "use_activation": flags, "user": json_values,
             **{name: score_side for name in ("text_1", "text_2", "queries", "documents",
                                              "items", "data_1", "data_2")}}
RERANK_API = {"model": served, "query": field(score_text), "documents": score_side,
              "texts": score_side, "top_n": field(small_ints), "return_documents": flags,
              "raw_scores": flags, "return_text": flags, "truncate": flags,
              "truncation_direction": direction}
EMBED_API = {"model": served, "inputs": field(score_text) | prompt,
             "normalize": flags, "dimensions": field(small_ints),
             "prompt_name": field(st.sampled_from(["query", "passage"])),
             "truncate": flags, "truncation_direction": direction}


def bodies(api: dict, required: tuple[str, ...], optional: tuple[str, ...]):
    """Bodies of `api`'s fields: half of them a shape's `required` fields and some of its
    `optional` ones (so that many reach the engine), the other half any of them."""
    return (st.fixed_dictionaries({name: api[name] for name in required},
                                  optional={name: api[name] for name in optional})
            | st.fixed_dictionaries({}, optional=api))


score_bodies = (bodies(SCORE_API, ("text_1", "text_2"), ("model", "use_activation", "user"))
                | bodies(SCORE_API, ("queries", "items"), ("use_activation",)))
rerank_bodies = (bodies(RERANK_API, ("query", "texts"), (
    "model", "raw_scores", "return_text", "truncate", "truncation_direction"))
    | bodies(RERANK_API, ("query", "documents"), ("model", "top_n", "return_documents")))
embed_bodies = bodies(EMBED_API, ("inputs",), tuple(set(EMBED_API) - {"inputs"}))
completion_bodies = st.fixed_dictionaries({}, optional={"prompt": prompt, **COMMON})
chat_bodies = st.fixed_dictionaries({}, optional={"messages": messages, **COMMON})


@pytest.fixture(scope="module")
def client(bundle) -> Iterator:
    yield from app_client(bundle("llama"), max_context=64, chunk_size=16)


@pytest.fixture(scope="module")
def score_client(reranker) -> Iterator:
    """A token reranker's app (tests/test_score.py's: a 128-position context)."""
    yield from app_client(reranker[1])


@pytest.fixture(scope="module")
def embed_client(embed_bundle) -> Iterator:
    """An embedding bundle's app (tests/test_embed.py's: a 128-position context)."""
    yield from app_client(embed_bundle)


def app_client(path, **settings) -> Iterator:
    """starlette's TestClient of the app over the bundle at `path`, in-process."""
    from starlette.testclient import TestClient

    engine = Engine.load(path, threads=1, kv_slots=2, **settings)
    app = create_app(engine, ServerConfig(model_name=MODEL, max_pending=4))
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield client
    finally:
        engine.close()


def assert_no_server_error(response, anthropic: bool = False, ollama: bool = False) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400 and ollama:
        body = response.json()
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]
        assert "\n" not in body["error"].strip()
    elif response.status_code >= 400 and anthropic:
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        assert "\n" not in body["error"]["message"].strip()
    elif response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str) and error["message"]
        assert "\n" not in error["message"].strip()


@pytest.mark.parametrize("examples", counts(120))
def test_completions_never_answer_5xx(client, examples):
    @settings(FUZZ, max_examples=examples)
    @given(body=completion_bodies)
    def check(body):
        assert_no_server_error(client.post("/v1/completions", content=dump(body)))
    check()


@pytest.mark.parametrize("examples", counts(120))
def test_chat_never_answers_5xx(client, examples):
    @settings(FUZZ, max_examples=examples)
    @given(body=chat_bodies)
    def check(body):
        assert_no_server_error(client.post("/v1/chat/completions", content=dump(body)))
    check()


@pytest.mark.parametrize("examples", counts(80))
def test_messages_never_answer_5xx(client, examples):
    @settings(FUZZ, max_examples=examples)
    @given(body=st.fixed_dictionaries({}, optional=MESSAGES_API))
    def check(body):
        assert_no_server_error(client.post("/v1/messages", content=dump(body)),
                               anthropic=True)
        body.pop("max_tokens", None)
        body.pop("stream", None)
        assert_no_server_error(client.post("/v1/messages/count_tokens", content=dump(body)),
                               anthropic=True)
    check()


@pytest.mark.parametrize("examples", counts(80))
def test_responses_never_answer_5xx(client, examples):
    @settings(FUZZ, max_examples=examples)
    @given(body=st.fixed_dictionaries({}, optional=RESPONSES_API))
    def check(body):
        assert_no_server_error(client.post("/v1/responses", content=dump(body)))
    check()


@pytest.mark.parametrize("examples", counts(60))
def test_ollama_never_answers_5xx(client, examples):
    @settings(FUZZ, max_examples=examples)
    @given(body=st.fixed_dictionaries({}, optional=OLLAMA))
    def check(body):
        for path in ("/api/chat", "/api/generate", "/api/show"):
            assert_no_server_error(client.post(path, content=dump(body)), ollama=True)
    check()


@pytest.mark.parametrize("examples", counts(60))
def test_pair_scores_never_answer_5xx(score_client, examples):
    """vLLM's /score, and /rerank in Jina's and TEI's shapes, on a score bundle."""
    @settings(FUZZ, max_examples=examples)
    @given(score=score_bodies, rerank=rerank_bodies)
    def check(score, rerank):
        assert_no_server_error(score_client.post("/score", content=dump(score)))
        assert_no_server_error(score_client.post("/rerank", content=dump(rerank)))
    check()


@pytest.mark.parametrize("examples", counts(60))
def test_tei_embed_and_score_never_answer_5xx(embed_client, examples):
    """TEI's /embed, and vLLM's /score (cosines), on an embedding bundle."""
    @settings(FUZZ, max_examples=examples)
    @given(body=embed_bodies, score=score_bodies)
    def check(body, score):
        assert_no_server_error(embed_client.post("/embed", content=dump(body)))
        assert_no_server_error(embed_client.post("/score", content=dump(score)))
    check()


@pytest.mark.parametrize("examples", counts(60))
def test_any_bytes_never_answer_5xx(client, examples):
    @settings(FUZZ, max_examples=examples)
    @given(raw=st.binary(max_size=64) | json_values.map(lambda value: dump(value)))
    def check(raw):
        for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses",
                     "/v1/embeddings", "/v1/rerank", "/rerank", "/score", "/embed"):
            assert_no_server_error(client.post(path, content=raw))
        assert_no_server_error(client.post("/v1/messages", content=raw), anthropic=True)
        assert_no_server_error(client.post("/api/chat", content=raw), ollama=True)
    check()


def dump(value) -> bytes:
    """JSON as a client would send it; lone surrogates go out as \\ud800 escapes."""
    return json.dumps(value, allow_nan=True).encode()
