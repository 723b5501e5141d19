"""The rerank routes on a live server (server/rerank.py): /v1/rerank and /rerank in the
Jina/Cohere shape, their relevance transformers' (tests/test_score.py's reference: the
token reranker's sigmoid(yes - no)); a score bundle answers the generating and embedding
routes with a 400, and a generation bundle the rerank routes, in one line each."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

pytest.importorskip("starlette")

from edgeprefill.errors import RequestError  # noqa: E402
from edgeprefill.sdk import Engine  # noqa: E402
from edgeprefill.server import ServerThread  # noqa: E402
from tests import test_serve_embed  # noqa: E402
from tests.test_score import (  # noqa: E402
    CONTEXT,
    DOCUMENTS,
    QUERY,
    TEMPLATE,
    classifier_logits,
    classifiers,
    pair_ids,
    reranker,
    sigmoid,
    token_logits,
    words,
)
from tests.test_serve import (  # noqa: E402
    MODEL,
    assert_error,
    rejected_by_status,
    serving,
)
from tests.test_serve_embed import GENERATING  # noqa: E402

__all__ = ["classifiers", "reranker"]  # the module's fixtures, found by their names


@pytest.fixture(scope="module")
def engine(reranker) -> Iterator[Engine]:
    engine = Engine.load(reranker[1], threads=1, kv_slots=2)
    yield engine
    engine.close()


# The embedding routes' live server and clean-KV check, on this module's engine (fixtures
# are found by the names a module binds: tests/served_llama.py says why not an import).
server = test_serve_embed.server
kv_is_clean_after_each_test = test_serve_embed.kv_is_clean_after_each_test


@pytest.fixture(scope="module")
def expected(reranker) -> np.ndarray:
    """transformers' relevance of each document: sigmoid(logit w6 - logit w5)."""
    ids = [words(TEMPLATE.replace("{query}", QUERY).replace("{document}", d))
           for d in DOCUMENTS]
    logits = token_logits(reranker[0], ids, [5, 6])
    return sigmoid(logits[:, 1] - logits[:, 0])


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_gives_transformers_relevance_best_first(http, expected, path):
    reply = http.post(path, json={"model": MODEL, "query": QUERY, "documents": DOCUMENTS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    order = list(np.argsort(-expected, kind="stable"))
    assert [r["index"] for r in body["results"]] == order
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]],
                               expected[order], atol=1e-5)
    assert all("document" not in r for r in body["results"])
    tokens = sum(len(words(TEMPLATE.replace("{query}", QUERY).replace("{document}", d)))
                 for d in DOCUMENTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert body["model"] == MODEL and body["id"].startswith("rerank-")


def test_top_n_objects_and_return_documents(http, expected):
    sent = [{"text": d} for d in DOCUMENTS]
    body = http.post("/v1/rerank", json={"query": QUERY, "documents": sent, "top_n": 2,
                                         "return_documents": True}).json()
    order = list(np.argsort(-expected, kind="stable"))[:2]
    assert [(r["index"], r["document"]) for r in body["results"]] == \
        [(i, {"text": DOCUMENTS[i]}) for i in order]
    every = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
    assert len(every["results"]) == len(DOCUMENTS)


def test_top_n_0_ranks_every_document_as_vllm_reads_it_on_the_route_and_the_sdk(http,
                                                                                 engine):
    # The route read 0 as vLLM does (its default: all) while Engine.rerank refused it: one
    # check (scoring.top_n) now answers both alike; a negative one is refused by both.
    body = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS,
                                         "top_n": 0}).json()
    ranked = engine.rerank(QUERY, DOCUMENTS, top_n=0)
    assert len(ranked) == len(DOCUMENTS)
    assert [r["index"] for r in body["results"]] == [i for i, _ in ranked]
    error = assert_error(http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS,
                                                        "top_n": -1}), 400, "top_n")
    with pytest.raises(RequestError) as refused:
        engine.rerank(QUERY, DOCUMENTS, top_n=-1)
    assert error["message"] == str(refused.value) == \
        "top_n must be an integer >= 0 (0 or absent: every document), got -1"


@pytest.mark.parametrize("body, param", [
    ({"documents": ["w5"]}, "query"),
    ({"query": "", "documents": ["w5"]}, "query"),
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": "w5"}, "documents"),
    ({"query": QUERY, "documents": ["w5", 3]}, "documents"),
    ({"query": QUERY, "documents": [{"text": "w5", "title": "x"}]}, "documents"),
    ({"query": QUERY, "documents": ["w5"], "top_n": -1}, "top_n"),
    ({"query": QUERY, "documents": ["w5"], "top_n": "2"}, "top_n"),
    ({"query": QUERY, "documents": ["w5"], "return_documents": "yes"}, "return_documents"),
    ({"query": QUERY, "documents": ["w5"], "rank_fields": ["text"]}, "rank_fields"),
    ({"query": QUERY, "documents": ["w5"] * 1001}, "documents"),
])
def test_bad_requests_are_400s_naming_the_field(http, body, param):
    error = assert_error(http.post("/v1/rerank", json=body), 400, param)
    assert "\n" not in error["message"]


def test_a_pair_past_the_context_is_a_400(http):
    long = " ".join(["w7"] * CONTEXT)
    error = assert_error(http.post("/v1/rerank", json={"query": QUERY,
                                                        "documents": ["w5", long]}),
                         400, "documents", "context_length_exceeded")
    assert "exceeds the context of 128 tokens" in error["message"]


def test_each_refused_rerank_is_counted_once(http):
    # the reference: the 400s the client got (the route's refusals pass through AccessLog,
    # which counts every refused status)
    before = rejected_by_status(http.get("/metrics").text).get("400", 0)
    answers = [http.post(path, json=body) for path, body in [
        ("/v1/rerank", {"query": QUERY, "documents": ["w5", " ".join(["w7"] * CONTEXT)]}),
        ("/rerank", {"query": QUERY, "documents": []}),
        ("/v1/rerank", {"query": QUERY, "documents": ["w5"], "top_n": -1})]]
    assert [answer.status_code for answer in answers] == [400] * 3
    assert rejected_by_status(http.get("/metrics").text)["400"] - before == 3


def test_another_model_is_a_404(http):
    assert_error(http.post("/v1/rerank", json={"model": "gpt", "query": QUERY,
                                               "documents": ["w5"]}), 404, "model")


def test_show_says_the_rerank_capability(http):
    show = http.post("/api/show", json={"model": MODEL}).json()
    assert show["capabilities"] == ["rerank"]


@pytest.mark.parametrize("path, body", [
    *GENERATING,
    ("/v1/embeddings", {"model": MODEL, "input": "w5"}),
    ("/api/embed", {"model": MODEL, "input": "w5"}),
    ("/api/embeddings", {"model": MODEL, "prompt": "w5"}),
    ("/embed", {"inputs": "w5"}),
])
def test_a_score_bundle_answers_the_other_routes_400(http, path, body):
    reply = http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    assert "is a score model" in reply.text and "\\n" not in reply.text
    # the way to this bundle's scores: /score beside /v1/rerank (once /v1/rerank alone)
    assert "POST /v1/rerank or /score on `edgeprefill serve`" in reply.text


@pytest.fixture(scope="module")
def generation_server(bundle) -> Iterator[ServerThread]:
    engine = Engine.load(bundle("llama"), threads=1, kv_slots=1)
    try:
        with serving(engine) as server:
            yield server
    finally:
        engine.close()


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_a_generation_bundle_answers_rerank_400(generation_server, path):
    reply = httpx.post(generation_server.url + path,
                       json={"query": QUERY, "documents": ["w5"]}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert "is a generation model" in reply.text and "\\n" not in reply.text


def test_a_classifier_ranks_pairs_as_transformers_and_three_labels_are_a_400(classifiers):
    """Without a template a pair is the tokenizer's pair encoding, here in the prompt
    worker; a head of three labels has no one relevance."""
    hf, out = classifiers("qwen3", 1)
    want = sigmoid(classifier_logits(hf, [pair_ids(hf, QUERY, d) for d in DOCUMENTS])[:, 0])
    for path, check in ((out, True), (classifiers("qwen3", 3)[1], False)):
        with Engine.load(path, threads=1, kv_slots=1) as engine, serving(engine) as server:
            reply = httpx.post(server.url + "/v1/rerank", timeout=60,
                               json={"query": QUERY, "documents": DOCUMENTS})
        if check:
            assert reply.status_code == 200, reply.text
            order = list(np.argsort(-want, kind="stable"))
            results = reply.json()["results"]
            assert [r["index"] for r in results] == order
            np.testing.assert_allclose([r["relevance_score"] for r in results], want[order],
                                       atol=1e-5)
        else:
            error = assert_error(reply, 400)
            assert "has 3 labels (grade0, grade1, grade2), no one relevance" in \
                error["message"] and "\n" not in error["message"]
