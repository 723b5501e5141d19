"""vLLM's /score and /v1/score (server/score.py) and text-embeddings-inference's shape of
/rerank (a body with `texts`, server/rerank.py) on a live server of a score bundle: their
scores are Engine.score's (tests/test_score.py checks it against transformers) made the
relevance, sigmoid(yes - no), or left the logit yes - no; the tokenizer's pair truncation
(TEI's) is checked against transformers on a classifier. The server, its engine and the
clean-KV check are tests/test_serve_score.py's."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

pytest.importorskip("starlette")

from edgeprefill.sdk import Engine  # noqa: E402
from tests import test_serve_score  # noqa: E402
from tests.test_score import (  # noqa: E402
    CONTEXT,
    DOCUMENTS,
    QUERY,
    TEMPLATE,
    classifier_logits,
    classifiers,
    reranker,
    sigmoid,
    words,
)
from tests.test_serve import MODEL, assert_error, serving  # noqa: E402

__all__ = ["classifiers", "reranker"]  # the module's fixtures, found by their names

# tests/test_serve_score.py's score bundle, its server and its checks, bound by name
engine = test_serve_score.engine
server = test_serve_score.server
kv_is_clean_after_each_test = test_serve_score.kv_is_clean_after_each_test
generation_server = test_serve_score.generation_server

LONG = " ".join(["w7"] * CONTEXT)  # past the context with any query and template


def logits(engine: Engine, pairs: list[tuple[str, str]]) -> np.ndarray:
    """Engine.score's yes - no of each pair: the logit whose sigmoid is the relevance."""
    scores = engine.score(pairs)
    return scores[:, 1] - scores[:, 0]


def tokens(pairs: list[tuple[str, str]]) -> int:
    return sum(len(words(TEMPLATE.replace("{query}", q).replace("{document}", d)))
               for q, d in pairs)


# -- vLLM's /score ---------------------------------------------------------------------


@pytest.mark.parametrize("path, first, second", [
    ("/score", "text_1", "text_2"), ("/v1/score", "queries", "documents"),
    ("/v1/score", "queries", "items"), ("/score", "data_1", "data_2")])
def test_score_gives_each_pair_s_relevance_in_order(http, engine, path, first, second):
    reply = http.post(path, json={"model": MODEL, first: QUERY, second: DOCUMENTS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    pairs = [(QUERY, d) for d in DOCUMENTS]
    np.testing.assert_allclose([d["score"] for d in body["data"]],
                               sigmoid(logits(engine, pairs)), atol=1e-5)
    assert [(d["index"], d["object"]) for d in body["data"]] == \
        [(i, "score") for i in range(len(DOCUMENTS))]
    count = tokens(pairs)
    assert body["usage"] == {"prompt_tokens": count, "total_tokens": count,
                             "completion_tokens": 0}
    assert body["id"].startswith("score-") and body["object"] == "list"
    assert body["model"] == MODEL and isinstance(body["created"], int)


def test_score_pairs_n_to_n_and_one_to_one_and_gives_logits(http, engine):
    firsts, seconds = ["w30 w31", QUERY], ["w50", "w61 w62"]
    both = http.post("/score", json={"text_1": firsts, "text_2": seconds}).json()
    pairs = [(firsts[0], seconds[0]), (firsts[1], seconds[1])]
    np.testing.assert_allclose([d["score"] for d in both["data"]],
                               sigmoid(logits(engine, pairs)), atol=1e-5)
    one = http.post("/score", json={"text_1": QUERY, "text_2": "w50",
                                    "use_activation": False, "user": "u1"}).json()
    np.testing.assert_allclose([d["score"] for d in one["data"]],
                               logits(engine, [(QUERY, "w50")]), atol=1e-5)


@pytest.mark.parametrize("body, param", [
    ({"text_1": ["a", "b"], "text_2": ["w5", "w6", "w7"]}, "text_1"),  # 2:3
    ({"text_1": ["w5", "w6"], "text_2": "w7"}, "text_1"),  # N:1, as vLLM refuses it
    ({"text_1": QUERY, "documents": ["w5"]}, "documents"),  # names of two pairs
    ({"text_1": QUERY}, "text_1"),
    ({"model": MODEL}, "text_1"),
    ({"queries": QUERY, "documents": ["w5"], "items": ["w6"]}, "documents"),
    ({"text_1": 3, "text_2": "w5"}, "text_1"),
    ({"text_1": QUERY, "text_2": []}, "text_2"),
    ({"text_1": QUERY, "text_2": ["w5", {"text": "w6"}]}, "text_2"),
    ({"text_1": QUERY, "text_2": ["w5"] * 1001}, "text_2"),
    ({"text_1": QUERY, "text_2": "w5", "use_activation": "no"}, "use_activation"),
    ({"text_1": QUERY, "text_2": "w5", "truncate_prompt_tokens": 8}, "truncate_prompt_tokens"),
    ({"text_1": QUERY, "text_2": "w5", "softmax": True}, "softmax"),
    # an empty query, as /v1/rerank's and Engine.rerank's (it was scored)
    ({"text_1": "", "text_2": "w5"}, "text_1"),
    ({"queries": [QUERY, ""], "documents": ["w5", "w6"]}, "queries"),
])
def test_bad_score_requests_are_400s_naming_the_field(http, body, param):
    error = assert_error(http.post("/v1/score", json=body), 400, param)
    assert "\n" not in error["message"]


def test_a_scored_pair_past_the_context_is_a_400(http):
    assert_error(http.post("/score", json={"text_1": QUERY, "text_2": ["w5", LONG]}), 400,
                 "text_2", "context_length_exceeded")


def test_another_model_is_a_404(http):
    assert_error(http.post("/score", json={"model": "gpt", "text_1": QUERY,
                                           "text_2": "w5"}), 404, "model")


@pytest.mark.parametrize("path, body", [
    ("/score", {"text_1": QUERY, "text_2": "w5"}),
    ("/rerank", {"query": QUERY, "texts": ["w5"]}),
])
def test_a_generation_bundle_answers_400(generation_server, path, body):
    # the refusal named only a reranker, though an embedding bundle serves /score too
    error = assert_error(httpx.post(generation_server.url + path, json=body, timeout=60), 400)
    assert error["message"] == (
        "this bundle is a generation model (llama): it gives no scores; export a reranker "
        "with --task score (a *ForSequenceClassification folder, or a causal LM with "
        "--score-tokens) for Engine.score, Engine.rerank and /v1/rerank, or an embedding "
        "model (--task embed) for POST /score's cosine similarity")


# -- TEI's /rerank ---------------------------------------------------------------------


def test_tei_rerank_ranks_texts_by_relevance_or_logit(http, engine):
    want = logits(engine, [(QUERY, d) for d in DOCUMENTS])
    order = list(np.argsort(-want, kind="stable"))
    for raw, values in ((False, sigmoid(want)), (True, want)):
        reply = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS,
                                           "raw_scores": raw})
        assert reply.status_code == 200, reply.text
        assert [r["index"] for r in reply.json()] == order
        assert all(set(r) == {"index", "score"} for r in reply.json())
        np.testing.assert_allclose([r["score"] for r in reply.json()], values[order],
                                   atol=1e-5)
    given = http.post("/v1/rerank", json={"query": QUERY, "texts": DOCUMENTS[:2],
                                          "return_text": True, "truncate": False}).json()
    assert sorted((r["index"], r["text"]) for r in given) == [(0, DOCUMENTS[0]),
                                                              (1, DOCUMENTS[1])]


@pytest.mark.parametrize("body, param", [
    ({"query": QUERY, "texts": ["w5"], "documents": ["w5"]}, "texts"),
    ({"query": QUERY, "texts": []}, "texts"),
    ({"query": QUERY, "texts": "w5"}, "texts"),
    ({"query": QUERY, "texts": [{"text": "w5"}]}, "texts"),
    ({"texts": ["w5"]}, "query"),
    ({"query": QUERY, "texts": ["w5"], "raw_scores": 1}, "raw_scores"),
    ({"query": QUERY, "texts": ["w5"], "return_text": "yes"}, "return_text"),
    ({"query": QUERY, "texts": ["w5"], "truncate": "no"}, "truncate"),
    ({"query": QUERY, "texts": ["w5"], "truncation_direction": "up"}, "truncation_direction"),
    ({"query": QUERY, "texts": ["w5"], "top_n": 1}, "top_n"),
])
def test_bad_tei_rerank_requests_are_400s_naming_the_field(http, body, param):
    error = assert_error(http.post("/rerank", json=body), 400, param)
    assert "\n" not in error["message"]


def test_tei_rerank_past_the_context_is_a_422_as_tei_answers(http):
    refused = assert_error(http.post("/rerank", json={"query": QUERY, "texts": ["w5", LONG],
                                                      "truncate": False}),
                           422, "texts", "context_length_exceeded")
    assert "exceeds the context of 128 tokens" in refused["message"]
    # truncate (TEI's default) cannot cut a pair the bundle reads through its template
    kept = assert_error(http.post("/rerank", json={"query": QUERY, "texts": [LONG]}), 422,
                        "texts", "context_length_exceeded")
    assert "template is not cut" in kept["message"]


def test_tei_rerank_truncates_a_pair_as_tei_does(classifiers):
    """A classifier's pair encoding cut to the context as TEI's tokenizer cuts it (the
    longer text first, from `truncation_direction`, special tokens kept): the scores
    are transformers' logits of those ids."""
    from tokenizers import Tokenizer

    hf, out = classifiers("qwen3", 1)
    query, long = "w20 w21 w22", " ".join(f"w{10 + i % 80}" for i in range(CONTEXT + 9))
    cut = {}
    for direction in ("right", "left"):
        tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
        tokenizer.enable_truncation(CONTEXT, strategy="longest_first", direction=direction)
        cut[direction] = tokenizer.encode(query, long).ids
        assert len(cut[direction]) == CONTEXT
    assert cut["right"] != cut["left"]
    want = classifier_logits(hf, [cut["right"], cut["left"]])[:, 0]
    with Engine.load(out, threads=1, kv_slots=1) as engine, serving(engine) as server:
        got = [httpx.post(server.url + "/rerank", timeout=60, json={
            "query": query, "texts": [long], "raw_scores": True,
            "truncation_direction": direction}).json() for direction in ("right", "Left")]
    np.testing.assert_allclose([g[0]["score"] for g in got], want, atol=1e-5)
