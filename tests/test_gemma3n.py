"""Gemma 3n (bare `gemma3n_text`, and the Hub's image-text `gemma3n`): AltUp's streams,
LAuReL, activation sparsity, on Gemma 4's per-layer inputs and KV sharing. The fixtures
(conftest.GEMMA3N: six layers alternating sliding and full, the last two sharing KV,
three streams, sparse gates on three layers) run in the generic suites too
(test_exactness: chunks of 100, 16 and 7 in both flavours, greedy output; the families'
config readings in test_families)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import GEMMA3N, VOCAB, load_hf_model
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import check_together, prompt_ids
from tests.test_families import last_logits
from tests.test_gemma4 import (
    assert_windows_and_kv_sharing_as_transformers,
    meta_graph,
)
from tests.test_quantize import dequantize_embeddings, dequantize_linears

FLAVORS = ("ort", "standard")
# Shaped as google/gemma-3n-E2B-it's config.json (its text_config; the vision and audio
# towers' configs left to their defaults): 30 layers, four sliding to one full, the last
# 10 sharing KV, sparse gates on the first 10, a query_pre_attn_scalar the model never reads.
HUB_E2B = {
    "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
    "eos_token_id": [1, 106], "tie_word_embeddings": True,
    "text_config": {
        "model_type": "gemma3n_text", "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 20,
        "altup_active_idx": 0, "altup_coef_clip": 120.0, "altup_correct_scale": True,
        "altup_num_inputs": 4, "attention_bias": False, "attention_dropout": 0.0,
        "final_logit_softcapping": 30.0, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2048,
        "hidden_size_per_layer_input": 256, "intermediate_size": [8192] * 30,
        "laurel_rank": 64, "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 6,
        "max_position_embeddings": 32768, "num_attention_heads": 8, "num_hidden_layers": 30,
        "num_key_value_heads": 2, "num_kv_shared_layers": 10, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": 512, "vocab_size": 262400,
        "vocab_size_per_layer_input": 262144,
    },
}


def hub_text_config() -> transformers.Gemma3nTextConfig:
    return transformers.Gemma3nConfig.from_dict(HUB_E2B).get_text_config()


def test_the_hub_e2b_config_reads_as_transformers_reads_it():
    ours, hf = ModelConfig.from_hf(HUB_E2B), hub_text_config()
    assert_windows_and_kv_sharing_as_transformers(ours, hf, 512)
    assert ours.kv_layers == tuple(range(20))
    assert ours.sparsity == tuple(hf.activation_sparsity_pattern)
    altup = ours.altup
    assert altup is not None and (altup.streams, altup.active, altup.correct_scale) == (
        hf.altup_num_inputs, hf.altup_active_idx, hf.altup_correct_scale)
    assert (ours.per_layer_input, ours.per_layer_vocab) == (256, 262144)
    assert ours.intermediate_size == max(hf.intermediate_size)
    assert ours.final_softcap == 30.0 and ours.attn_scale == 1.0  # not 256 ** -0.5
    assert ours.tie_embeddings and ours.eos_token_ids == (1, 106)
    for rope, kind in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        assert ours.ropes[rope].theta == hf.rope_parameters[kind]["rope_theta"]
        assert ours.ropes[rope].rotary_dim == hf.head_dim


@pytest.mark.parametrize("flavor", FLAVORS)
def test_the_hub_e2b_shaped_graph_holds_kv_for_its_first_20_layers(flavor):
    cfg = ModelConfig.from_hf(HUB_E2B)
    _, inputs = meta_graph(cfg, transformers.Gemma3nForCausalLM, hub_text_config(), flavor)
    assert [n for n in inputs if n.startswith("past_key.")] == [
        f"past_key.{i}" for i in range(20)]
    assert inputs["past_value.19"] == ["batch", 2, "capacity", 256]


@pytest.fixture(scope="module")
def gemma3n(bundle, hf_model):
    return lambda flavor: (hf_model("gemma3n_text"), bundle("gemma3n_text", flavor))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunks_of_1_3_and_16_the_last_padded_match_transformers_across_the_window(
        gemma3n, flavor, library, monkeypatch):
    """Window 8: every chunking crosses it. The prompt holds ids past the per-layer table
    (they read its row 0, as transformers'); the `ort` bundle runs the native kernels."""
    if flavor == "ort":  # the kernels take ort bundles only
        monkeypatch.setenv("EDGEPREFILL_KERNELS", "require")
    assert max(prompt_ids(40)) >= GEMMA3N["vocab_size_per_layer_input"]
    assert_padded_chunks_match(*gemma3n(flavor), chunks=(1, 3, 16))


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_different_lengths_decode_together_as_transformers(gemma3n, flavor):
    hf_dir, path = gemma3n(flavor)
    engine = Engine.load(path, threads=2, background=False, chunk_size=16)
    check_together(engine, hf_dir, 8)
    engine.close()


def int4_reference(hf_dir, ids: list[int]) -> np.ndarray:
    """transformers' last logits with the weights an int4 bundle holds: every projection
    and both tables dequantized, AltUp's small router and coefficient matrices float (the
    bundle keeps them so: export/altup.py)."""
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        dequantize_linears(model, keep=lambda name: ".altup." in name)
        dequantize_embeddings(model, "int4")  # the main table and the per-layer one
        return model(torch.tensor([ids])).logits[0, -1].numpy()


@pytest.mark.slow
def test_an_int4_bundle_equals_transformers_with_its_dequantized_weights(gemma3n, tmp_path):
    """So its drift from fp32 is the model's own under those weights. On this random
    fixture that drift is large (largest logit error over the largest logit 0.80; 0.97
    with float tables, 1.13 with every gate dense; int8 0.15), larger than gemma4_text's
    0.67 (docs/design.md)."""
    hf_dir, _ = gemma3n("ort")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0)))
    ids = prompt_ids(30)
    got = last_logits(tmp_path / "b", ids)
    np.testing.assert_allclose(got, int4_reference(hf_dir, ids), rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_an_int8_bundle_exports_loads_and_generates(gemma3n, tmp_path):
    hf_dir, _ = gemma3n("ort")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = engine.generate(prompt_ids(30), GenerationParams(max_new_tokens=8, ignore_eos=True))
    assert len(got.result().token_ids) == 8
    engine.close()


def test_the_image_text_checkpoint_exports_its_language_model(bundle):
    """Its logits: test_exactness (the `gemma3n` fixture, against its language model)."""
    raw = json.loads((bundle("gemma3n") / MANIFEST_FILE).read_text())
    assert raw["model"]["shared_kv_layers"] == [4, 5]
    assert raw["model"]["family"] == "gemma3n"
    assert any("vision tower left out" in q for q in raw["source"]["quirks"])
    assert "3 AltUp streams" in raw["source"]["quirks"]


@pytest.mark.parametrize("change, message", [
    ({"num_kv_shared_layers": 6}, "leaves no layer to hold KV"),
    ({"activation_sparsity_pattern": [0.5] * 5}, "lists 5 layers; there are 6"),
    ({"activation_sparsity_pattern": [1.0] * 6}, r"must lie in \[0, 1\)"),
    ({"altup_active_idx": 3}, "altup_active_idx one of its streams"),
    ({"altup_num_inputs": 1, "altup_active_idx": 0}, "altup_num_inputs must be at least 2"),
    ({"intermediate_size": [96] * 5}, "lists 5 widths for 6 layers"),
])
def test_what_export_cannot_honour_is_refused_in_one_line(hf_model, change, message):
    raw = {**json.loads((hf_model("gemma3n_text") / "config.json").read_text()), **change}
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf(raw)
    assert "\n" not in str(err.value)


def test_the_fixture_exercises_what_gemma3n_adds(hf_model):
    """Guards the fixture: a change to conftest.GEMMA3N must keep every feature on."""
    hf_dir = hf_model("gemma3n_text")
    hf = transformers.Gemma3nTextConfig.from_pretrained(hf_dir)
    assert hf.kv_sharing_modes == [None, None, "store", "store", "reuse", "reuse"]
    sparse = [i for i, s in enumerate(hf.activation_sparsity_pattern) if s > 0]
    assert {hf.layer_types[i] for i in sparse} == {"sliding_attention", "full_attention"}
    assert any(hf.kv_sharing_modes[i] == "reuse" for i in sparse)
    assert hf.altup_num_inputs > 2 and hf.altup_active_idx != 0 and hf.altup_correct_scale
    assert len(set(hf.intermediate_size)) > 1
    assert hf.vocab_size_per_layer_input < hf.vocab_size == VOCAB
    with safe_open(str(hf_dir / "model.safetensors"), "pt") as stored:
        scale = stored.get_tensor("model.layers.0.altup.correct_output_scale")
    assert scale.abs().min() > 0  # zero at init: the per-layer inputs would add nothing


def test_the_shared_layers_stored_kv_projections_are_dropped_without_a_warning(
        hf_model, tmp_path, caplog):
    """Gemma 3n checkpoints keep k/v projections and norms on the KV-shared layers, which
    transformers drops at load; a tensor nothing reads is still named."""
    from safetensors.numpy import load_file, save_file

    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_model("gemma3n_text"), hf_dir)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    for part in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
        tensors[f"model.layers.5.self_attn.{part}"] = np.ones((2, 2), np.float32)
    tensors["model.layers.5.stray.weight"] = np.ones((2, 2), np.float32)
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    unused = [r.getMessage() for r in caplog.records if "does not use" in r.getMessage()]
    assert len(unused) == 1 and "1 tensor " in unused[0] and "stray" in unused[0]
