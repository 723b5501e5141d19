"""GGUF rerankers (Qwen3-Reranker converted by llama.cpp: pooling RANK, the LM head's yes
and no rows as `cls.output.weight`, labels yes and no, a "rerank" chat template, an
untied LM head left out) export as score bundles under `--task auto` and `--task score`
(export/gguf_rerank.py). The reference is the Hugging Face checkpoint the file was
written from: transformers' CausalLM logits of the two tokens at the last position of the
pair rendered with the template (tokenized as llama-server tokenizes it: special tokens
parsed, none added), whose sigmoid(yes - no) is llama.cpp's score (the softmax's first).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgeprefill.bundle import load_manifest
from edgeprefill.contract import LOGITS
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.score_head import ScoreOptions
from edgeprefill.sdk import Engine
from tests.bpe_tokenizers import byte_level_bpe, install
from tests.conftest import build_hf_model
from tests.gguf_files import write_gguf, write_out
from tests.test_cli_errors import assert_one_line_error, cli

pytest.importorskip("gguf")

YES, NO = 40, 41  # the fixture vocabulary's stand-ins for Qwen3's "yes" and "no"
# the fixture's special tokens in it, as Qwen3-Reranker's template holds <|im_start|>
TEMPLATE = "<s>judge the document\nquery: {query}\ndocument: {document}</s>\nanswer:"
QUERY = "the quick brown fox"
DOCUMENTS = ["jumps over the lazy dog", "hello world", "0123 4567",
             " ".join(["the lazy dog sleeps"] * 4)]  # past one chunk


def checkpoint(root: Path, tied: bool) -> Path:
    """A tiny Qwen3 with a byte-level vocabulary. transformers 5.24 reads no head_dim from
    a Qwen3 GGUF: 128, Qwen3Config's default, as test_gguf_embed's."""
    tok = byte_level_bpe()
    hf = build_hf_model("qwen3", root / "hf", vocab_size=tok.get_vocab_size(), head_dim=128,
                        tie_word_embeddings=tied)
    install(tok, hf)
    return hf


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, its reranker GGUF, untied: no output.weight)."""
    hf = checkpoint(tmp_path_factory.mktemp("qwen3-reranker"), tied=False)
    return hf, write_gguf(hf, hf.parent / "rerank-F32.gguf", rerank=(YES, NO),
                          rerank_template=TEMPLATE)


def exported(gguf: Path, out: Path, task: str = "auto", template: str | None = None) -> Path:
    export(gguf, out, ExportOptions(chunks=(16,), max_context=128, show_progress=False,
                                    overwrite=True, task=task,
                                    score=ScoreOptions(template=template)))
    return out


def token_logits(hf: Path, template: str, tokens: list[int]) -> np.ndarray:
    """transformers' CausalLM logits of `tokens` at the last position of each pair."""
    return text_logits(hf, [template.replace("{query}", QUERY).replace("{document}", d)
                            for d in DOCUMENTS], tokens)


def text_logits(hf: Path, texts: list[str], tokens: list[int]) -> np.ndarray:
    """transformers' CausalLM logits of `tokens` at the last position of each text."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    rows = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        with torch.no_grad():
            rows.append(model(torch.tensor([ids])).logits[0, -1, tokens].numpy())
    return np.stack(rows).astype(np.float64)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def assert_ranks_as(bundle: Path, relevance: np.ndarray, scores: np.ndarray) -> None:
    with Engine.load(bundle, threads=1, kv_slots=2) as engine:
        got = engine.score([(QUERY, d) for d in DOCUMENTS])
        ranked = engine.rerank(QUERY, DOCUMENTS)
    np.testing.assert_allclose(got, scores, atol=1e-4)
    order = np.argsort(-relevance, kind="stable")
    assert [i for i, _ in ranked] == list(order)
    np.testing.assert_allclose([r for _, r in ranked], relevance[order], atol=1e-5)


@pytest.mark.parametrize("task", ["auto", "score"])
def test_a_rerank_gguf_exports_a_score_bundle_that_ranks_as_llama_cpp(untied, tmp_path, task):
    hf, gguf = untied
    bundle = exported(gguf, tmp_path / "b", task=task)
    manifest = load_manifest(bundle)
    score = manifest.score
    assert manifest.task == "score" and score is not None
    assert (score.kind, score.labels, score.relevance, score.template, score.pad_token_id) == \
        ("classifier", ["no", "yes"], "sigmoid_difference", TEMPLATE, None)
    assert manifest.source["gguf"]["pooling"] == "rank"
    yes_no = token_logits(hf, TEMPLATE, [YES, NO])
    # llama.cpp: softmax([yes, no])[0]; the bundle's rows are [no, yes]
    assert_ranks_as(bundle, sigmoid(yes_no[:, 0] - yes_no[:, 1]), yes_no[:, ::-1])


def test_a_text_ending_in_the_pad_token_is_scored_at_it(untied, tmp_path):
    """llama.cpp pools the last token whatever it is: no trailing pad token is left out
    (the file records a pad id, which a classifier's config.json would say)."""
    hf, gguf = untied
    text = "hello world<pad><pad>"
    with Engine.load(exported(gguf, tmp_path / "b"), threads=1, kv_slots=1) as engine:
        got = engine.score([text])
    np.testing.assert_allclose(got, text_logits(hf, [text], [NO, YES]), atol=1e-4)


def test_a_given_score_template_overrides_the_file_s(untied, tmp_path):
    hf, gguf = untied
    other = "{document} </s> {query}"
    bundle = exported(gguf, tmp_path / "b", task="score", template=other)
    score = load_manifest(bundle).score
    assert score is not None and score.template == other
    yes_no = token_logits(hf, other, [YES, NO])
    assert_ranks_as(bundle, sigmoid(yes_no[:, 0] - yes_no[:, 1]), yes_no[:, ::-1])


def test_a_tied_reranker_and_a_one_label_head(tmp_path):
    """A tied model's file keeps its embeddings (its LM head), and a one-label head ranks
    by its sigmoid (a classifier's)."""
    hf = checkpoint(tmp_path, tied=True)
    gguf = write_gguf(hf, tmp_path / "one-F32.gguf", rerank=(YES,), rerank_template=TEMPLATE)
    bundle = exported(gguf, tmp_path / "b")
    score = load_manifest(bundle).score
    assert score is not None and (score.labels, score.relevance) == (["yes"], "sigmoid")
    yes = token_logits(hf, TEMPLATE, [YES])
    assert_ranks_as(bundle, sigmoid(yes[:, 0]), yes)


def test_the_export_line_names_the_score_bundle(untied, tmp_path):
    made = cli("export", untied[1], "-o", tmp_path / "b", "--chunks", "16", "--max-context",
               "128", "--quiet")
    assert made.returncode == 0, made.stderr
    assert made.stderr.splitlines()[0] == ("a score bundle (classifier: no, yes; relevance "
                                           "sigmoid_difference): Engine.score, "
                                           "Engine.rerank; on serve POST /v1/rerank, "
                                           "/rerank, /score")


@pytest.mark.parametrize("task, extra, said", [
    ("generate", [], "rerank-F32.gguf is a reranker (pooling rank) without an LM head "
                     "(output.weight): llama.cpp's converter keeps only its rows (cls.output), "
                     "and a tied model's file looks the same"),
    ("embed", [], "rerank-F32.gguf is a reranker (pooling rank), no embedding model"),
    ("score", ["--score-tokens", "no,yes", "--score-template", "{query} {document}"],
     "--score-tokens reads rows of an LM head; rerank-F32.gguf's head is its cls.output"),
    ("score", ["--score-tokens", "no,yes"],  # its own reason, not a template it has
     "--score-tokens reads rows of an LM head; rerank-F32.gguf's head is its cls.output"),
])
def test_tasks_a_reranker_cannot_make_are_refused_in_one_line(untied, tmp_path, task, extra,
                                                              said):
    result = cli("export", untied[1], "-o", tmp_path / "b", "--task", task, *extra)
    assert_one_line_error(result, said)
    assert not (tmp_path / "b").exists()


def test_a_reranker_without_a_template_needs_one(untied, tmp_path):
    hf = untied[0]
    gguf = write_gguf(hf, tmp_path / "bare.gguf", rerank=(YES, NO))
    assert_one_line_error(cli("export", gguf, "-o", tmp_path / "b"),
                          "bare.gguf is a reranker without a rerank template "
                          "(tokenizer.chat_template.rerank): give the pair's format")
    template = "{query} </s> {document}"
    bundle = exported(gguf, tmp_path / "b", task="score", template=template)
    yes_no = token_logits(hf, template, [YES, NO])
    assert_ranks_as(bundle, sigmoid(yes_no[:, 0] - yes_no[:, 1]), yes_no[:, ::-1])


def test_a_reranker_whose_tokenizer_adds_special_tokens_is_refused(untied, tmp_path):
    """llama-server renders the template and tokenizes it with no BOS or EOS added."""
    import gguf

    path = rank_file(tmp_path / "bos.gguf", "qwen3", {"cls.output.weight": (2, 8)},
                     lambda writer: writer.add_add_bos_token(True))
    with pytest.raises(ExportError, match="bos.gguf says tokenizer.ggml.add_bos_token: "
                       "llama-server tokenizes"):
        exported(path, tmp_path / "b")
    assert gguf.GGUFReader(untied[1]).fields["tokenizer.ggml.add_bos_token"].contents() \
        is False  # what the fixture's file (Qwen3's) says


def rank_file(path: Path, arch: str, tensors: dict[str, tuple[int, ...]],
              more: Callable[[Any], None] | None = None) -> Path:
    """A GGUF of metadata and tensor names only: what is refused before any weight."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
    writer.add_chat_template([{"name": "rerank", "template": TEMPLATE}])
    if more is not None:
        more(writer)
    for name, shape in tensors.items():
        writer.add_tensor(name, np.zeros(shape, np.float32))
    write_out(writer)
    return path


@pytest.mark.parametrize("arch, tensors, said", [
    ("llama", {"cls.output.weight": (2, 8)},
     "is a llama reranker (pooling rank): llama.cpp scores it by its first token's hidden "
     "state and its raw first output"),
    ("qwen3", {"cls.weight": (8, 8), "cls.output.weight": (2, 8)},
     "has a pooler (cls.weight) before its score head"),
    ("qwen3", {"token_embd.weight": (4, 8)}, "says pooling rank but holds no cls.output"),
])
def test_rerankers_a_score_bundle_cannot_match_are_refused(tmp_path, arch, tensors, said):
    path = rank_file(tmp_path / "r.gguf", arch, tensors)
    with pytest.raises(ExportError, match=said.replace("(", r"\(").replace(")", r"\)")):
        exported(path, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_a_quantized_head_is_dequantized_from_the_file(untied, tmp_path):
    """A Q8_0 file's cls.output is Q8_0 too: the bundle holds its values, read with gguf's
    reader, in the bundle's order, and the scores stay near the float checkpoint's."""
    import gguf
    from safetensors.numpy import load_file

    hf = untied[0]
    path = write_gguf(hf, tmp_path / "rerank-Q8_0.gguf", quant="Q8_0", rerank=(YES, NO),
                      rerank_template=TEMPLATE)
    head = next(t for t in gguf.GGUFReader(path).tensors if t.name == "cls.output.weight")
    assert head.tensor_type == gguf.GGMLQuantizationType.Q8_0
    bundle = exported(path, tmp_path / "b")
    rows = gguf.dequantize(head.data, head.tensor_type)
    np.testing.assert_array_equal(load_file(str(bundle / "score_head.safetensors"))["weight"],
                                  rows[::-1])
    with Engine.load(bundle, threads=1, kv_slots=2) as engine:
        got = engine.score([(QUERY, d) for d in DOCUMENTS])
    np.testing.assert_allclose(got, token_logits(hf, TEMPLATE, [NO, YES]), atol=0.1)


def test_a_reranker_file_with_its_lm_head_exports_the_lm_with_task_generate(untied, tmp_path):
    from safetensors.numpy import load_file

    hf = untied[0]
    lm_head = load_file(str(hf / "model.safetensors"))["lm_head.weight"]
    path = write_gguf(hf, tmp_path / "whole.gguf", rerank=(YES, NO), rerank_template=TEMPLATE,
                      extra={"output.weight": lm_head})
    bundle = exported(path, tmp_path / "g", task="generate")
    manifest = load_manifest(bundle)
    assert manifest.task == "generate" and manifest.score is None
    assert manifest.graph.outputs[LOGITS] == ["float32", ["batch", lm_head.shape[0]]]
