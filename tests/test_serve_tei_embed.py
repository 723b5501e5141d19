"""text-embeddings-inference's POST /embed (server/tei.py) on a live server of an
embedding bundle: its vectors are transformers' (tests/test_embed.py's reference),
normalized or (normalize false) the model's pooled rows as they are, cut to `dimensions`,
after a named prompt; a text past the context cut from either end as TEI cuts it, or with
truncate false a 422 as TEI answers; and vLLM's /score of such a bundle, the cosine of each
pair's vectors. The server, its engine and the clean-KV check are
tests/test_serve_embed.py's."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

pytest.importorskip("starlette")

from tests import test_serve_embed  # noqa: E402
from tests.test_embed import (  # noqa: E402
    CONTEXT,
    QUERY,
    TEXTS,
    embed_bundle,
    embed_model,
    reference,
)
from tests.test_serve import MODEL, assert_error, rejected_by_status  # noqa: E402

__all__ = ["embed_bundle", "embed_model"]  # the module's fixtures, found by these names

# tests/test_serve_embed.py's embedding bundle, its server and its checks, bound by name
engine = test_serve_embed.engine
server = test_serve_embed.server
kv_is_clean_after_each_test = test_serve_embed.kv_is_clean_after_each_test
expected = test_serve_embed.expected
generation_server = test_serve_embed.generation_server

WORDS = [f"w{3 + i % 90}" for i in range(CONTEXT + 5)]  # past the context, distinct ends


def test_embed_gives_transformers_vectors_for_texts_and_ids(http, expected, engine):
    reply = http.post("/embed", json={"inputs": TEXTS})
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(reply.json(), expected, atol=1e-5)
    one = http.post("/embed", json={"inputs": TEXTS[1], "model": MODEL}).json()
    np.testing.assert_allclose(one, expected[1:2], atol=1e-5)
    ids = [test_serve_embed.ids_of(engine, t) for t in TEXTS[:2]]
    for sent, rows in ((ids[0], expected[:1]), (ids, expected[:2])):
        np.testing.assert_allclose(http.post("/embed", json={"inputs": sent}).json(), rows,
                                   atol=1e-5)


def test_normalize_false_gives_the_pooled_rows_and_dimensions_cut_them(http, embed_model):
    raw = reference(embed_model, TEXTS, normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)
    got = http.post("/embed", json={"inputs": TEXTS, "normalize": False}).json()
    np.testing.assert_allclose(got, raw, rtol=1e-4, atol=1e-4)
    cut = http.post("/embed", json={"inputs": TEXTS, "normalize": False,
                                    "dimensions": 8}).json()
    np.testing.assert_allclose(cut, raw[:, :8], rtol=1e-4, atol=1e-4)
    again = http.post("/embed", json={"inputs": TEXTS, "dimensions": 8}).json()
    np.testing.assert_allclose(again, raw[:, :8] / np.linalg.norm(raw[:, :8], axis=1,
                                                                  keepdims=True), atol=1e-5)


def test_prompt_name_puts_the_model_s_prompt_before_each_text(http, embed_model):
    want = reference(embed_model, [QUERY + text for text in TEXTS])
    got = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "query"}).json()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_long_text_is_cut_from_either_end_by_default(http, embed_model):
    """TEI's default truncate (its --auto-truncate) cuts to the context, the end token the
    post-processor appends kept: CONTEXT - 1 words, the first or ("left") the last."""
    long = " ".join(WORDS)
    want = reference(embed_model, [" ".join(WORDS[:CONTEXT - 1]),
                                   " ".join(WORDS[-(CONTEXT - 1):])])
    got = [http.post("/embed", json={"inputs": long, "truncation_direction": direction}
                     ).json()[0] for direction in ("right", "left")]
    np.testing.assert_allclose(got, want, atol=1e-5)
    ids = [int(word[1:]) for word in WORDS]  # token ids are cut as they are
    for direction, kept in (("Right", ids[:CONTEXT]), ("Left", ids[-CONTEXT:])):
        got = http.post("/embed", json={"inputs": [ids], "truncation_direction": direction})
        exact = http.post("/embed", json={"inputs": [kept], "truncate": False})
        assert got.status_code == 200, got.text
        np.testing.assert_allclose(got.json(), exact.json(), atol=1e-6)


def test_truncate_false_past_the_context_is_a_422_as_tei_answers(http):
    for inputs in (" ".join(WORDS), [5] * (CONTEXT + 1)):
        assert_error(http.post("/embed", json={"inputs": inputs, "truncate": False}), 422,
                     "inputs", "context_length_exceeded")


@pytest.mark.parametrize("body, param", [
    ({}, "inputs"),
    ({"inputs": []}, "inputs"),
    ({"inputs": ""}, "inputs"),
    ({"inputs": [["w5"]]}, "inputs"),
    ({"inputs": "w5", "normalize": "yes"}, "normalize"),
    ({"inputs": "w5", "truncate": 1}, "truncate"),
    ({"inputs": "w5", "truncation_direction": "middle"}, "truncation_direction"),
    ({"inputs": "w5", "dimensions": 0}, "dimensions"),
    ({"inputs": "w5", "dimensions": 65}, "dimensions"),
    ({"inputs": "w5", "prompt_name": "passage"}, "prompt_name"),
    ({"inputs": [5, 6], "prompt_name": "query"}, "prompt_name"),
    ({"inputs": "w5", "encoding_format": "float"}, "encoding_format"),
    ({"inputs": ["w5"] * 2049}, "inputs"),
    ({"inputs": [100000]}, "inputs"),  # past the vocabulary: the engine's refusal
])
def test_bad_embed_requests_are_400s_naming_the_field(http, body, param):
    error = assert_error(http.post("/embed", json=body), 400, param)
    assert "\n" not in error["message"]


def test_each_refused_embed_is_counted_once(http):
    before = rejected_by_status(http.get("/metrics").text)
    answers = [http.post("/embed", json=body).status_code for body in (
        {"inputs": []}, {"inputs": " ".join(WORDS), "truncate": False})]
    assert answers == [400, 422]
    after = rejected_by_status(http.get("/metrics").text)
    assert [after[s] - before.get(s, 0) for s in ("400", "422")] == [1, 1]


def test_another_model_is_a_404(http):
    assert_error(http.post("/embed", json={"inputs": "w5", "model": "gpt"}), 404, "model")


def test_a_generation_bundle_answers_embed_400(generation_server):
    reply = httpx.post(generation_server.url + "/embed", json={"inputs": "w5"}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert "is a generation model" in reply.text and "\\n" not in reply.text


# -- vLLM's /score on an embedding bundle -------------------------------------------------


def test_score_is_the_cosine_of_the_pair_s_vectors_as_vllm_gives_it(http, expected, engine):
    reply = http.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS})
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose([d["score"] for d in reply.json()["data"]],
                               expected @ expected[0], atol=1e-5)
    count = sum(len(test_serve_embed.ids_of(engine, t)) for t in [TEXTS[0], *TEXTS])
    assert reply.json()["usage"]["prompt_tokens"] == count
    pairs = http.post("/v1/score", json={"queries": TEXTS[:2], "documents": TEXTS[1:],
                                         "use_activation": False}).json()
    np.testing.assert_allclose([d["score"] for d in pairs["data"]],
                               (expected[:2] * expected[1:]).sum(axis=1), atol=1e-5)
    assert_error(http.post("/score", json={"text_1": "w5", "text_2": " ".join(WORDS)}), 400,
                 "text_2", "context_length_exceeded")
    # the long text's own side (every text was named text_2's)
    assert_error(http.post("/score", json={"text_1": " ".join(WORDS), "text_2": "w5"}), 400,
                 "text_1", "context_length_exceeded")


@pytest.mark.parametrize("body, param", [
    ({"text_1": "w5", "text_2": ["w6", ""]}, "text_2"),
    ({"queries": "", "documents": ["w6"]}, "queries"),
    ({"text_1": " \n\t ", "text_2": "w6"}, "text_1"),  # stripped: as empty
])
def test_score_refuses_an_empty_text_as_the_embedding_routes_do(http, body, param):
    """An empty text has no vector of its own (only the tokenizer's special tokens'):
    /embed, /v1/embeddings and Engine.embed refuse it, and so does /score; a text of
    whitespace alone, stripped as sentence-transformers strips it, is one."""
    assert_error(http.post("/embed", json={"inputs": ""}), 400, "inputs")
    error = assert_error(http.post("/score", json=body), 400, param)
    assert "is empty" in error["message"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"input": "   "}, "input"),
    ("/v1/embeddings", {"input": ["w5", "\n"]}, "input"),
    ("/embed", {"inputs": " \t"}, "inputs"),
    ("/api/embed", {"model": MODEL, "input": [""]}, "input"),  # was embedded
    ("/api/embed", {"model": MODEL, "input": ["w5", " "]}, "input"),
    ("/api/embeddings", {"model": MODEL, "prompt": "  "}, "prompt"),
])
def test_every_embedding_route_refuses_an_empty_or_blank_text(http, path, body, param):
    """Ollama's /api/embed had embedded `[""]` (only a whole empty input asks a load) and
    every route a text of whitespace alone."""
    reply = http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    assert "empty or only whitespace" in reply.text and param in reply.text
