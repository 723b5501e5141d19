"""GGUF embedding models (`ollama pull qwen3-embedding`, Qwen3-Embedding's GGUFs): a file
whose metadata says last-token pooling (`{arch}.pooling_type` LAST, as llama.cpp's
converter writes a sentence-transformers checkpoint's) exports an embedding bundle under
`--task auto`, its vectors transformers' base model's last-token hidden states of the
checkpoint it was converted from, normalized, with the EOS its tokenizer appends
(`tokenizer.ggml.add_eos_token`) in each text; other poolings are refused in one line
(export/gguf_pooling.py). Rerankers (pooling RANK): tests/test_gguf_rerank.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edgeprefill.bundle import load_manifest
from edgeprefill.contract import HIDDEN, LOGITS
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.sdk import Engine
from tests.bpe_tokenizers import byte_level_bpe, install
from tests.conftest import build_hf_model
from tests.gguf_files import write_gguf
from tests.test_cli_errors import cli
from tests.test_embed import reference

pytest.importorskip("gguf")

EOS = 2  # </s>, the fixture tokenizer's EOS: the token the model pools
TEXTS = ["hello world", "the quick brown fox", " jumps over the lazy dog 0123"]


@pytest.fixture(scope="module")
def embedding_checkpoint(tmp_path_factory) -> Path:
    """A tiny Qwen3 whose tokenizer ends each text with the EOS, as Qwen3-Embedding's
    (`$A <|endoftext|>`). transformers 5.24 reads no head_dim from a Qwen3 GGUF: 128,
    Qwen3Config's default, as test_gguf_input's."""
    from tokenizers import Tokenizer, processors

    tok = byte_level_bpe()
    hf = build_hf_model("qwen3", tmp_path_factory.mktemp("qwen3-embedding") / "hf",
                        vocab_size=tok.get_vocab_size(), head_dim=128)
    install(tok, hf)
    tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A $B </s>", special_tokens=[("</s>", EOS)])
    tokenizer.save(str(hf / "tokenizer.json"))
    return hf


def gguf_of(hf: Path, name: str, **options) -> Path:
    path = hf.parent / name
    return path if path.is_file() else write_gguf(hf, path, **options)


def exported(gguf: Path, out: Path, task: str = "auto") -> Path:
    export(gguf, out, ExportOptions(chunks=(16,), max_context=128, show_progress=False,
                                    overwrite=True, task=task))
    return out


def embed(bundle: Path, texts: list[str]) -> np.ndarray:
    engine = Engine.load(bundle, threads=1, kv_slots=2)
    try:
        return np.asarray(engine.embed(texts), dtype=np.float64)
    finally:
        engine.close()


def test_a_last_pooling_gguf_exports_a_normalized_embedding_bundle(
        embedding_checkpoint, tmp_path):
    gguf = gguf_of(embedding_checkpoint, "embed-F32.gguf", pooling="LAST")
    bundle = exported(gguf, tmp_path / "b")
    manifest = load_manifest(bundle)
    assert manifest.task == "embed" and manifest.embedding is not None
    assert (manifest.embedding.pooling, manifest.embedding.normalize) == ("lasttoken", True)
    assert manifest.embedding.prompts == {}  # a GGUF records none
    assert manifest.graph.outputs[HIDDEN] == ["float32", ["batch", 64]]
    assert LOGITS not in manifest.graph.outputs
    raw = json.loads((bundle / "edgeprefill.json").read_text())
    assert raw["source"]["gguf"]["pooling"] == "last"
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(bundle / "tokenizer.json")).encode("hello world").ids
    assert ids[-1] == EOS and ids.count(EOS) == 1  # the pooled token, once
    np.testing.assert_allclose(embed(bundle, TEXTS), reference(embedding_checkpoint, TEXTS),
                               atol=1e-5)


def gguf_reference(gguf: Path, hf: Path, texts: list[str]) -> np.ndarray:
    """transformers' base model of the GGUF file (its weights dequantized as it reads
    them), on `hf`'s tokenizer's ids: the last token's state, L2-normalized."""
    from tokenizers import Tokenizer
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                      dtype=torch.float32)
    tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer.encode(text.strip()).ids
            hidden = model(torch.tensor([ids])).last_hidden_state[0, -1].double().numpy()
            rows.append(hidden / np.linalg.norm(hidden))
    return np.stack(rows)


def test_a_q8_0_last_pooling_gguf_embeds_what_transformers_reads_from_it(
        embedding_checkpoint, tmp_path):
    gguf = gguf_of(embedding_checkpoint, "embed-Q8_0.gguf", quant="Q8_0", pooling="LAST")
    vectors = embed(exported(gguf, tmp_path / "b"), TEXTS)
    expected = gguf_reference(gguf, embedding_checkpoint, TEXTS)
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    # and within Q8_0's rounding of the checkpoint's own vectors
    cosines = np.sum(vectors * reference(embedding_checkpoint, TEXTS), axis=1)
    assert np.all(cosines > 0.999), cosines


def test_the_export_line_says_embedding_and_task_generate_exports_the_lm(
        embedding_checkpoint, tmp_path):
    gguf = gguf_of(embedding_checkpoint, "embed-F32.gguf", pooling="LAST")
    args = ["export", gguf, "--chunks", "16", "--max-context", "64", "--quiet"]
    made = cli(*args, "-o", tmp_path / "e")
    assert made.returncode == 0, made.stderr
    assert made.stderr.splitlines()[0] == (
        "an embedding bundle (lasttoken pooling, normalized, 64 dimensions): Engine.embed; "
        "on serve POST /v1/embeddings, /embed, /api/embed, /score")
    lm = cli(*args, "-o", tmp_path / "g", "--task", "generate")
    assert lm.returncode == 0, lm.stderr
    manifest = load_manifest(tmp_path / "g")
    assert manifest.task == "generate" and manifest.embedding is None
    assert LOGITS in manifest.graph.outputs


def test_a_gguf_without_pooling_generates_unless_task_embed(embedding_checkpoint, tmp_path):
    gguf = gguf_of(embedding_checkpoint, "plain-F32.gguf")
    assert load_manifest(exported(gguf, tmp_path / "g")).task == "generate"
    bundle = exported(gguf, tmp_path / "e", task="embed")
    manifest = load_manifest(bundle)
    assert manifest.task == "embed" and manifest.embedding is not None
    assert manifest.embedding.normalize
    np.testing.assert_allclose(embed(bundle, TEXTS[:1]),
                               reference(embedding_checkpoint, TEXTS[:1]), atol=1e-5)


@pytest.mark.parametrize("task", ["auto", "embed"])
def test_mean_pooling_is_refused_in_one_line(embedding_checkpoint, tmp_path, task):
    gguf = gguf_of(embedding_checkpoint, "mean-F32.gguf", pooling="MEAN")
    with pytest.raises(ExportError, match=r"mean-F32.gguf pools its tokens by mean "
                       r"\(qwen3.pooling_type\).*last-token pooling only.*--task generate"):
        exported(gguf, tmp_path / "b", task=task)
    assert not (tmp_path / "b").exists()


def test_mean_pooling_exports_the_lm_with_task_generate(embedding_checkpoint, tmp_path):
    gguf = gguf_of(embedding_checkpoint, "mean-F32.gguf", pooling="MEAN")
    assert load_manifest(exported(gguf, tmp_path / "g", task="generate")).task == "generate"


def test_a_sentencepiece_gguf_that_adds_the_eos_embeds_it(tmp_path):
    """e5-mistral-7b-instruct's kind: a SentencePiece vocabulary and tokenizer_config.json's
    add_eos_token (the converter writes tokenizer.ggml.add_eos_token), whose tokenizer.json
    adds only the BOS: llama.cpp tokenizes `<s> text </s>`, and so does the bundle."""
    from tokenizers import Tokenizer

    from tests.bpe_tokenizers import sentencepiece_bpe

    tok = sentencepiece_bpe()
    hf = build_hf_model("llama", tmp_path / "hf", vocab_size=tok.get_vocab_size())
    install(tok, hf)
    config = json.loads((hf / "tokenizer_config.json").read_text())
    config.update(add_bos_token=True, add_eos_token=True)
    (hf / "tokenizer_config.json").write_text(json.dumps(config))
    bundle = exported(write_gguf(hf, tmp_path / "spm.gguf", pooling="LAST"), tmp_path / "b")
    assert load_manifest(bundle).task == "embed"
    original = Tokenizer.from_file(str(hf / "tokenizer.json"))
    got = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    for text in TEXTS:
        assert original.encode(text).ids[0] == 1  # <s>, and no </s>
        assert got.encode(text).ids == [*original.encode(text).ids, EOS], text


def test_an_ollama_embedding_model_exports_an_embedding_bundle(
        embedding_checkpoint, tmp_path, monkeypatch):
    """`ollama pull qwen3-embedding`'s kind: Ollama's store holds the GGUF (pooling LAST,
    which Ollama reads as the embedding capability) and a params layer."""
    from tests.test_ollama_store import add_model

    store = tmp_path / "ollama-models"
    gguf = gguf_of(embedding_checkpoint, "embed-F32.gguf", pooling="LAST")
    add_model(store, "registry.ollama.ai/library/tiny-embedding/latest", [
        ("model", gguf.read_bytes()), ("params", json.dumps({"num_ctx": 8192}).encode())])
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    bundle = exported("ollama:tiny-embedding", tmp_path / "b")
    manifest = load_manifest(bundle)
    assert manifest.task == "embed" and manifest.source["ollama"]
    np.testing.assert_allclose(embed(bundle, TEXTS[:1]),
                               reference(embedding_checkpoint, TEXTS[:1]), atol=1e-5)


def test_a_bert_gguf_is_refused_by_its_architecture_first(tmp_path):
    """An encoder's file (all-MiniLM's, nomic-embed's: MEAN or CLS pooling) never reaches
    the pooling: transformers reads no `bert` GGUF into weights."""
    import gguf

    from tests.gguf_files import write_out

    writer = gguf.GGUFWriter(str(tmp_path / "minilm.gguf"), "bert")
    writer.add_block_count(1)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    write_out(writer)
    with pytest.raises(ExportError, match="GGUF architecture 'bert' is not one transformers"):
        exported(tmp_path / "minilm.gguf", tmp_path / "b")


@pytest.mark.parametrize(("metadata", "task", "expected"), [
    ({}, "auto", None),
    ({"qwen3.pooling_type": 3}, "auto", "last"),
    ({"qwen3.pooling_type": 3}, "generate", "last"),
    ({"qwen3.pooling_type": 2}, "generate", "cls"),
    ({"qwen3.pooling_type": 0}, "auto", "pools its tokens by none"),
    ({"qwen3.pooling_type": 2}, "embed", "pools its tokens by cls"),
    ({"qwen3.pooling_type": 7}, "generate", "qwen3.pooling_type 7 is no pooling"),
    ({"qwen3.classifier.output_labels": 2}, "generate",
     r"is a reranker \(qwen3.pooling_type unset, classifier labels\)"),
    ({"qwen3.pooling_type": 4}, "embed", "rank"),  # refused or not: gguf_rerank.check
])
def test_the_pooling_a_task_exports_or_refuses(metadata, task, expected):
    from edgeprefill.export.gguf_pooling import pooling_of

    metadata = {"general.architecture": "qwen3", **metadata}
    if expected in (None, "last", "cls", "rank"):
        assert pooling_of(metadata, "f.gguf", task) == expected
    else:
        with pytest.raises(ExportError, match=expected):
            pooling_of(metadata, "f.gguf", task)
