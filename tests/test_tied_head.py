"""A config that ties the embeddings over a checkpoint that stores its own LM head: the
head is the stored one, as transformers 5 loads it (its tie_weights keeps a head that
differs from the embedding, with a warning), and the logits are transformers'."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import build_hf_model
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_qwen_vl import assert_chunks_match, export_flavour
from tests.test_torch_checkpoints import as_torch_files

# family -> the level of config.json whose tie_word_embeddings the family's model reads
# (Qwen3-VL's and Gemma 3's outer config, either level of Qwen2-VL's): a true value there.
TIE_AT = {"llama": "outer", "qwen3_vl": "outer", "qwen2_vl": "text_config",
          "gemma3": "outer", "phi": "outer", "mistral3": "outer"}
KEPT_APART = "ties the embeddings, but the checkpoint's"


def untied_then_tied(family: str, out, level: str):
    """A model saved untied (its own random head), whose config then says to tie."""
    hf_dir = build_hf_model(family, out, tie_word_embeddings=False)
    path = hf_dir / "config.json"
    config = json.loads(path.read_text())
    (config if level == "outer" else config["text_config"])["tie_word_embeddings"] = True
    path.write_text(json.dumps(config))
    return hf_dir


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if KEPT_APART in r.getMessage()]


@pytest.mark.parametrize("family", sorted(TIE_AT))
def test_a_stored_head_that_differs_is_kept_as_transformers_keeps_it(
        family, tmp_path, caplog):
    hf_dir = untied_then_tied(family, tmp_path / "hf", TIE_AT[family])
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        bundle_dir = export_flavour(hf_dir, tmp_path / "b", "ort")
    assert_chunks_match(bundle_dir, ids, expected)
    assert len(warnings_of(caplog)) == 1, caplog.text


def test_a_pytorch_checkpoint_keeps_its_head_too(tmp_path, caplog):
    # the rows are compared through torch's loader as well as safetensors'
    hf_dir = untied_then_tied("llama", tmp_path / "hf", "outer")
    pickled = as_torch_files(hf_dir, tmp_path / "pickled")
    ids = prompt_ids(40)
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        bundle_dir = export_flavour(pickled, tmp_path / "b", "ort")
    assert_chunks_match(bundle_dir, ids, reference_logits(hf_dir, ids))
    assert len(warnings_of(caplog)) == 1, caplog.text


def test_a_stored_head_equal_to_the_embedding_ties_without_a_word(tmp_path, caplog):
    hf_dir = build_hf_model("llama", tmp_path / "hf", tie_word_embeddings=True)
    weights = load_file(hf_dir / "model.safetensors")
    assert "lm_head.weight" not in weights  # transformers saves a tied head once
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, hf_dir / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(40)
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        bundle_dir = export_flavour(hf_dir, tmp_path / "b", "ort")
    assert_chunks_match(bundle_dir, ids, reference_logits(hf_dir, ids))
    assert caplog.records == [], caplog.text  # neither kept apart nor unused


def test_the_rows_are_compared_in_blocks(tmp_path, monkeypatch):
    from edgeprefill.export import checkpoint
    from edgeprefill.export.checkpoint import Checkpoint

    a = torch.randn(5, 3)
    b = a.clone()
    b[4, 2] += 1  # in the last, partial block
    save_file({"a": a, "a2": a.clone(), "b": b, "c": a[:4].clone()},
              tmp_path / "model.safetensors")
    monkeypatch.setattr(checkpoint, "SAME_BLOCK", 6)  # two rows a block
    ckpt = Checkpoint(tmp_path)
    assert ckpt.same("a", "a2") and not ckpt.same("a", "b") and not ckpt.same("a", "c")
    assert ckpt.read == set()


def test_a_tied_checkpoint_that_stores_only_the_head_embeds_with_it(tmp_path, caplog):
    """transformers ties the other way too: the stored head is loaded as the embedding."""
    hf_dir = build_hf_model("llama", tmp_path / "hf", tie_word_embeddings=True)
    weights = load_file(hf_dir / "model.safetensors")
    weights["lm_head.weight"] = weights.pop("model.embed_tokens.weight")
    save_file(weights, hf_dir / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(40)
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        bundle_dir = export_flavour(hf_dir, tmp_path / "b", "ort")
    assert_chunks_match(bundle_dir, ids, reference_logits(hf_dir, ids))
    assert caplog.records == [], caplog.text


def test_an_untied_checkpoint_without_an_embedding_is_refused_in_one_line(tmp_path):
    from edgeprefill.errors import ExportError

    hf_dir = build_hf_model("llama", tmp_path / "hf", tie_word_embeddings=False)
    weights = load_file(hf_dir / "model.safetensors")
    del weights["model.embed_tokens.weight"]
    save_file(weights, hf_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ExportError, match="lacks the tensor 'model.embed_tokens.weight'"):
        export_flavour(hf_dir, tmp_path / "b", "ort")
