"""Hy4-VL's language model (hy_v4_vl: families/image_text.py, its hy_v4_vl_text spec in
families/sparse_attention.py): Hy4 (tests/test_hy_v4.py) with its rotary, the
attention's and the indexer's (on the last dims of its heads), on interleaved pairs (its
3-D rotary on text positions, all three alike) and its latent norms at rms_norm_eps. The
bundle's logits are those of transformers' HYV4VLForConditionalGeneration built whole (a
tiny tower beside it) on text-only input_ids, with index_topk 8 so that the selection
bites from the ninth key on: chunks of 1, 3 and 16 and a padded chunk (`standard` in the
default suite, `ort` under slow), rows decoding together, int4, a Hub config as
transformers reads it, and what export refuses. Its conftest fixture (index_topk past the
bundles' context, rms_norm_eps 0.1) runs in the generic suites.

Each difference shown necessary (the bundle's logits off transformers' by more than the
tolerance with it taken out of the graph): the attention's rotary on halves (Hy4's), the
indexer's on halves, the latent norms at 1e-6 (test_each_difference_moves_transformers_
logits shows each moves transformers' own logits)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers.models.hy_v4 import modeling_hy_v4
from transformers.models.hy_v4_vl import modeling_hy_v4_vl

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, IMAGE_TEXT, build_hf_model, load_hf_model
from tests.flavour_bundles import check_chunks_against, flavour_bundles, hf_logits
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_exactness import prompt_ids
from tests.test_mla import dequantized_int4_but_kv_b
from tests.test_openelm import check_chunks_and_padding, check_rows_decode_together, run_chunks

TOPK = 8


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    return build_hf_model("hy_v4_vl", tmp_path_factory.mktemp("hy_v4_vl-k8"), index_topk=TOPK)


bundle = flavour_bundles("hy_v4_vl-k8")


@pytest.mark.parametrize("flavor", [
    "standard", pytest.param("ort", marks=pytest.mark.slow)])
def test_chunked_decoded_and_padded_as_transformers(flavor, hf, bundle):
    """A 40-token prompt (five times the keys a query keeps) in chunks of 1, 3 and 16 and
    a padded chunk: each chunk's last logits are transformers' at its position."""
    model = load_hf_model(hf)
    assert isinstance(model, transformers.HYV4VLForConditionalGeneration)
    ids = prompt_ids(40)
    check_chunks_and_padding(bundle(flavor), ids, hf_logits(model, ids))


@pytest.mark.slow
def test_rows_of_other_lengths_decode_together_as_transformers(hf, bundle):
    """Three rows of 5, 19 and 33 tokens, then 3 decode steps of the three in one call."""
    model = load_hf_model(hf)
    check_rows_decode_together(bundle("ort"), lambda ids: hf_logits(model, ids)[-1], 3)


@pytest.mark.slow
def test_int4_computes_transformers_forward_with_dequantized_weights(hf, tmp_path):
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False,
                                             quant=QuantConfig("int4", accuracy_level=0)))
    model = load_hf_model(hf)
    dequantized_int4_but_kv_b(model, keep=("indexer", "_hc.", "hc_head", "vision_tower"))
    check_chunks_against(tmp_path / "b", model, prompt_ids(40))


@pytest.mark.slow
def test_each_difference_moves_transformers_logits(hf, monkeypatch):
    """What the bundle computes differently from Hy4 is there in transformers' own forward:
    the latent norms at 1e-6 (Hy4's) and the rotary on halves (Hy4's: the attention's and
    the indexer's) each move the logits at the prompt's last token."""
    ids = prompt_ids(40)
    model = load_hf_model(hf)
    base = hf_logits(model, ids)[-1]

    def moved() -> float:
        return float(np.abs(hf_logits(model, ids)[-1] - base).max())

    layers = model.model.language_model.layers
    for layer in layers:
        layer.self_attn.q_a_layernorm.variance_epsilon = 1e-6
        layer.self_attn.kv_a_layernorm.variance_epsilon = 1e-6
    assert moved() > 1e-2
    for layer in layers:
        layer.self_attn.q_a_layernorm.variance_epsilon = 0.1
        layer.self_attn.kv_a_layernorm.variance_epsilon = 0.1
    assert moved() == 0.0
    monkeypatch.setattr(modeling_hy_v4_vl, "apply_rotary_pos_emb",
                        modeling_hy_v4.apply_rotary_pos_emb)
    assert moved() > 1e-2


def test_a_hub_config_reads_as_transformers_builds_the_model():
    """HYV4VLConfig's own config.json (Hy4-VL's shape, text_config without its derived
    lists): the indexer, its rotary and norm, the latent norms, the streams and the head as
    transformers builds them."""
    written = transformers.HYV4VLConfig().to_dict()
    text = {k: v for k, v in written["text_config"].items()
            if k not in ("indexer_types", "mlp_layer_types", "layer_types")}
    raw = {**written, "text_config": text}
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**json.loads(json.dumps(raw)))
    with torch.device("meta"):
        model = transformers.HYV4VLForConditionalGeneration(config).model.language_model
    layers = model.layers
    index, latent, hyper = ours.sparse_index, ours.latent, ours.hyper
    assert index is not None and latent is not None and hyper is not None
    attn = layers[0].self_attn
    assert (index.heads, index.head_dim, index.topk, index.norm_eps) == (
        attn.indexer.n_heads, attn.indexer.head_dim, attn.indexer.index_topk,
        attn.indexer.k_norm.eps)
    assert index.rope_last and index.interleaved and ours.spec.rope_interleaved
    assert index.shared == tuple(i for i, layer in enumerate(layers)
                                 if layer.self_attn.indexer is None)
    assert latent.norm_eps == attn.q_a_layernorm.variance_epsilon \
        == attn.kv_a_layernorm.variance_epsilon == config.text_config.rms_norm_eps
    assert (latent.q_lora_rank, latent.rope_dim) == (attn.q_lora_rank, attn.qk_rope_head_dim)
    assert ours.moe is not None and ours.moe.layers == tuple(
        i for i, kind in enumerate(config.text_config.mlp_layer_types) if kind == "sparse")
    assert hyper.streams == layers[0].attn_hc.hc_mult
    assert ours.attn_scale == pytest.approx(attn.scaling)
    assert not ours.tie_embeddings and ours.num_layers == len(layers)


def test_the_language_model_alone_and_another_text_config_are_refused_in_one_line(
        hf, tmp_path):
    """hy_v4_vl_text alone has no head (transformers has no causal LM of it); a text_config
    of another model_type is not Hy4-VL's."""
    raw = {"model_type": "hy_v4_vl_text", **FAMILIES["hy_v4_vl"], "hidden_size": 64,
           "vocab_size": 128}
    with pytest.raises(ExportError, match="hy_v4_vl_text is Hy4-VL's language model without "
                                          "its LM head"):
        ModelConfig.from_hf(raw)
    hf_dir = shutil.copytree(hf, tmp_path / "hf")
    config = json.loads((hf_dir / "config.json").read_text())
    config["text_config"]["model_type"] = "hy_v4"
    (hf_dir / "config.json").write_text(json.dumps(config))
    assert_one_line_error(cli("export", hf_dir, "-o", tmp_path / "b"),
                          "text_config model_type 'hy_v4' is not supported; supported: "
                          "hy_v4_vl_text")


def test_the_loaded_names_read_as_the_hubs_and_the_tower_is_left_out_quietly(
        hf, tmp_path, caplog):
    """transformers 5.24 saves the checkpoint as the Hub's (model., Hy4's Hub names,
    the tower vit.); saved under the names it loads (model.language_model.,
    model.vision_tower.) with multi-token-prediction layers beside them, the bundle
    computes the same logits, nothing warned of as unused."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(hf / "model.safetensors"))
    assert any(name.startswith("vit.") for name in tensors)
    assert any(".hc_pre.hc_attn_layer." in name for name in tensors)
    assert IMAGE_TEXT["hy_v4_vl"]["vision_config"]["out_hidden_size"] == 64
    hf_dir = shutil.copytree(hf, tmp_path / "hf")
    moved = {("model.vision_tower." + name.removeprefix("vit.")) if name.startswith("vit.")
             else ("model.language_model." + name.removeprefix("model."))
             if name.startswith("model.") else name: t for name, t in tensors.items()}
    moved["model.language_model.mtp_layers.0.enorm.weight"] = np.ones(64, np.float32)
    save_file(moved, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    export(hf_dir, tmp_path / "b", ExportOptions(flavor="standard", chunks=(16,),
                                                 max_context=64, show_progress=False))
    assert "does not use" not in caplog.text
    ids = prompt_ids(40)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)
    engine.close()
    np.testing.assert_allclose(np.stack(got), hf_logits(load_hf_model(hf), ids)[[15, 31, 39]],
                               rtol=1e-4, atol=1e-4)
