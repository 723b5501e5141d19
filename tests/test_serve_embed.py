"""The embedding routes on a live server (server/embeddings.py): OpenAI's /v1/embeddings
through the official openai client (which asks for base64) and as float JSON, Ollama's
/api/embed and /api/embeddings through the ollama client; their vectors are transformers'
(tests/test_embed.py's reference). An embedding bundle answers the generating routes with
a 400, and a generation bundle the embedding routes, in one line each."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from tests.test_embed import (  # noqa: E402
    CONTEXT,
    QUERY,
    TEXTS,
    embed_bundle,
    embed_model,
    reference,
)
from tests.test_serve import (  # noqa: E402
    MODEL,
    assert_error,
    rejected_by_status,
    serving,
    wait_idle,
)

__all__ = ["embed_bundle", "embed_model"]  # the module's fixtures, found by these names


@pytest.fixture(scope="module")
def engine(embed_bundle) -> Iterator[Engine]:
    engine = Engine.load(embed_bundle, threads=1, kv_slots=2)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine) -> Iterator[ServerThread]:
    with serving(engine) as server:
        yield server


@pytest.fixture(autouse=True)
def kv_is_clean_after_each_test(engine) -> Iterator[None]:
    yield
    wait_idle(engine)
    engine.check_integrity()


@pytest.fixture(scope="module")
def expected(embed_model) -> np.ndarray:
    return reference(embed_model, TEXTS)


def ids_of(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text.strip())


# -- OpenAI's /v1/embeddings -----------------------------------------------------------


def test_the_openai_client_gets_transformers_vectors(client, expected, engine):
    reply = client.embeddings.create(model=MODEL, input=TEXTS)  # base64 on the wire
    got = np.array([d.embedding for d in reply.data])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == MODEL
    tokens = sum(len(ids_of(engine, t)) for t in TEXTS)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens


def test_float_json_one_string_and_token_ids(http, expected, engine):
    one = http.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "float"})
    assert one.status_code == 200, one.text
    np.testing.assert_allclose(one.json()["data"][0]["embedding"], expected[0], atol=1e-5)
    packed = http.post("/v1/embeddings", json={"input": TEXTS[0],
                                               "encoding_format": "base64"}).json()
    row = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(row, np.float32(one.json()["data"][0]["embedding"]))
    ids = [ids_of(engine, t) for t in TEXTS[:2]]
    for sent, rows in ((ids[0], expected[:1]), (ids, expected[:2])):
        reply = http.post("/v1/embeddings", json={"input": sent, "model": MODEL}).json()
        np.testing.assert_allclose([d["embedding"] for d in reply["data"]], rows, atol=1e-5)


def test_dimensions_are_the_first_ones_normalized_again(client, expected):
    reply = client.embeddings.create(model=MODEL, input=TEXTS[:2], dimensions=8)
    cut = expected[:2, :8] / np.linalg.norm(expected[:2, :8], axis=1, keepdims=True)
    np.testing.assert_allclose([d.embedding for d in reply.data], cut, atol=1e-5)


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [["w5"]]}, "input"),
    ({"input": [1, "w5"]}, "input"),
    ({"input": "w5", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "w5", "dimensions": 65}, "dimensions"),
    ({"input": "w5", "dimensions": "8"}, "dimensions"),
    ({"input": "w5", "bogus": 1}, "bogus"),
    ({"input": [100000]}, "input"),
    ({"input": ["w5"] * 2049}, "input"),  # OpenAI's limit: 2048 items a request
    ({"input": "w5", "prompt_name": "passage"}, "prompt_name"),
    ({"input": "w5", "prompt_name": 3}, "prompt_name"),
    ({"input": [5, 6], "prompt_name": "query"}, "prompt_name"),  # ids take no prompt
])
def test_bad_requests_are_400s_naming_the_field(http, body, param):
    error = assert_error(http.post("/v1/embeddings", json=body), 400, param)
    assert "\n" not in error["message"]


def test_prompt_name_puts_the_model_s_prompt_before_each_text(http, embed_model, engine):
    # text-embeddings-inference's field; the ids of a text with its prompt are counted
    want = reference(embed_model, [QUERY + text for text in TEXTS])
    reply = http.post("/v1/embeddings", json={"input": TEXTS, "prompt_name": "query"}).json()
    np.testing.assert_allclose([d["embedding"] for d in reply["data"]], want, atol=1e-5)
    assert reply["usage"]["prompt_tokens"] == sum(len(ids_of(engine, QUERY + t)) for t in TEXTS)
    ollama_embed = http.post("/api/embed", json={"model": MODEL, "input": TEXTS,
                                                 "prompt_name": "query"}).json()
    np.testing.assert_allclose(ollama_embed["embeddings"], want, atol=1e-5)
    older = http.post("/api/embeddings", json={"model": MODEL, "prompt": TEXTS[2],
                                               "prompt_name": "query"}).json()
    np.testing.assert_allclose(older["embedding"], want[2], atol=1e-5)
    refused = http.post("/api/embed", json={"model": MODEL, "input": "w5",
                                            "prompt_name": "passage"})
    assert refused.status_code == 400 and "none of the model's prompts" in \
        refused.json()["error"]


def test_a_batch_of_short_texts_fits_the_body_limit(http, engine):
    """An embedding bundle's limit holds 16 contexts' worth of batched texts: one context's
    worth (the generating routes') had refused 2,000 short texts with a 413."""
    from edgeprefill.server.config import BATCH_CONTEXTS, BODY_BASE_BYTES, BODY_BYTES_PER_TOKEN

    one_context = BODY_BASE_BYTES + BODY_BYTES_PER_TOKEN * engine.capacity
    texts = [" ".join(f"w{5 + (i + j) % 60}" for j in range(12)) for i in range(2000)]
    body = json.dumps({"input": texts, "model": MODEL})
    assert one_context < len(body)
    reply = http.post("/v1/embeddings", content=body.encode())
    assert reply.status_code == 200, reply.text[:200]
    assert len(reply.json()["data"]) == 2000
    limit = BODY_BASE_BYTES + BODY_BYTES_PER_TOKEN * engine.capacity * BATCH_CONTEXTS
    over = json.dumps({"input": "w5", "pad": "x" * limit})
    assert_error(http.post("/v1/embeddings", content=over.encode()), 413,
                 code="request_too_large")


def test_a_text_past_the_context_is_a_400(http):
    long = " ".join(["w7"] * (CONTEXT + 5))
    assert_error(http.post("/v1/embeddings", json={"input": ["w5", long]}), 400, "input",
                 "context_length_exceeded")
    assert_error(http.post("/v1/embeddings", json={"input": [5] * (CONTEXT + 1)}), 400,
                 "input", "context_length_exceeded")


def test_each_refused_embedding_request_is_counted_once(http):
    # the reference: the 400s the client got, one per request on each embedding route
    before = rejected_by_status(http.get("/metrics").text).get("400", 0)
    answers = [http.post(path, json=body) for path, body in [
        ("/v1/embeddings", {"input": " ".join(["w7"] * (CONTEXT + 5))}),
        ("/api/embed", {"model": MODEL, "input": "w5", "truncate": "no"}),
        ("/api/embeddings", {"model": MODEL, "prompt": 5})]]
    assert [answer.status_code for answer in answers] == [400] * 3
    assert rejected_by_status(http.get("/metrics").text)["400"] - before == 3


def test_another_model_is_a_404(http):
    assert_error(http.post("/v1/embeddings", json={"input": "w5", "model": "gpt"}), 404,
                 "model", "model_not_found")


# -- Ollama's /api/embed and /api/embeddings --------------------------------------------


@pytest.fixture(scope="module")
def llama(server) -> ollama.Client:
    return ollama.Client(host=server.url)


def test_ollama_embed_and_embeddings(llama, expected, engine):
    reply = llama.embed(model=MODEL, input=TEXTS)
    np.testing.assert_allclose(reply.embeddings, expected, atol=1e-5)
    assert reply.prompt_eval_count == sum(len(ids_of(engine, t)) for t in TEXTS)
    one = llama.embed(model=MODEL, input=TEXTS[1], dimensions=8)
    cut = expected[1, :8] / np.linalg.norm(expected[1, :8])
    np.testing.assert_allclose(one.embeddings[0], cut, atol=1e-5)
    older = llama.embeddings(model=MODEL, prompt=TEXTS[2])
    np.testing.assert_allclose(older.embedding, expected[2], atol=1e-5)


def test_ollama_truncates_to_the_context_unless_told_not_to(llama, http, engine):
    long = " ".join(["w7"] * (CONTEXT + 5))
    cut = llama.embed(model=MODEL, input=long).embeddings[0]
    # cut before the appended end token, which stays: CONTEXT - 1 words and w2
    assert ids_of(engine, " ".join(["w7"] * (CONTEXT - 1)))[-1] == 2
    np.testing.assert_allclose(cut, engine.embed(" ".join(["w7"] * (CONTEXT - 1)))[0],
                               atol=1e-6)
    # null is the default (true), as Ollama's *bool reads it; it had been a 400
    unset = http.post("/api/embed", json={"model": MODEL, "input": long, "truncate": None})
    assert unset.status_code == 200, unset.text
    np.testing.assert_allclose(unset.json()["embeddings"][0], cut, atol=1e-6)
    refused = http.post("/api/embed", json={"model": MODEL, "input": long, "truncate": False})
    assert refused.status_code == 400
    assert "exceeds the context" in refused.json()["error"]
    assert set(refused.json()) == {"error"}


def test_ollama_loads_and_shows_the_embedding_capability(http):
    assert http.post("/api/embed", json={"model": MODEL}).json() == {
        "model": MODEL, "embeddings": []}
    assert http.post("/api/embeddings", json={"model": MODEL}).json() == {"embedding": []}
    show = http.post("/api/show", json={"model": MODEL}).json()
    assert show["capabilities"] == ["embedding"]


# -- what each kind of bundle refuses -----------------------------------------------------


GENERATING = [
    ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": 2}),
    ("/v1/chat/completions", {"model": MODEL, "max_tokens": 2,
                              "messages": [{"role": "user", "content": "w5"}]}),
    ("/v1/responses", {"model": MODEL, "input": "w5"}),
    ("/api/generate", {"model": MODEL, "prompt": "w5", "stream": False}),
    ("/api/chat", {"model": MODEL, "stream": False,
                   "messages": [{"role": "user", "content": "w5"}]}),
]


@pytest.mark.parametrize("path, body", GENERATING)
def test_an_embedding_bundle_answers_the_generating_routes_400(http, path, body):
    reply = http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    assert "is an embedding model" in reply.text and "\\n" not in reply.text


@pytest.fixture(scope="module")
def generation_server(bundle) -> Iterator[ServerThread]:
    engine = Engine.load(bundle("llama"), threads=1, kv_slots=1)
    try:
        with serving(engine) as server:
            yield server
    finally:
        engine.close()


@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", {"model": MODEL, "input": "w5"}),
    ("/api/embed", {"model": MODEL, "input": "w5"}),
    ("/api/embeddings", {"model": MODEL, "prompt": "w5"}),
])
def test_a_generation_bundle_answers_the_embedding_routes_400(generation_server, path, body):
    reply = httpx.post(generation_server.url + path, json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert "is a generation model" in reply.text and "\\n" not in reply.text


def test_ollama_num_ctx_holds_the_texts_to_a_shorter_context(llama, http, engine):
    """Ollama's options.num_ctx: a text is cut to it (or refused with truncate false);
    one longer than the bundle's context is a 400 (it had been ignored)."""
    long = " ".join(["w7"] * 20)
    cut = llama.embed(model=MODEL, input=long, options={"num_ctx": 8})
    assert cut.prompt_eval_count == 8
    np.testing.assert_allclose(cut.embeddings[0], engine.embed(" ".join(["w7"] * 7))[0],
                               atol=1e-6)
    refused = http.post("/api/embed", json={"model": MODEL, "input": long, "truncate": False,
                                            "options": {"num_ctx": 8}})
    assert refused.status_code == 400 and "exceeds the context of 8" in refused.json()["error"]
    for path, text in (("/api/embed", "input"), ("/api/embeddings", "prompt")):
        over = http.post(path, json={"model": MODEL, text: "w5",
                                     "options": {"num_ctx": CONTEXT + 1}})
        assert over.status_code == 400 and "options.num_ctx" in over.json()["error"]
