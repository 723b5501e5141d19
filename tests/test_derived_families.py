"""Families transformers 5.24 builds on bases export already has, each declared in
export/families/ by what differs: Gemma 4 Unified (Gemma 4 without per-layer inputs), Lara Mini
(Qwen3-Next's layers with plain norms, rotary-free full layers, an ungated shared expert,
fused DeltaNet tensors), OLMo Hybrid (OLMo 3's post-norm attention beside pre-norm
Gated DeltaNet layers of their own projections, beta doubled), Mellum (Qwen3-MoE with a
rope per layer type and dense or sparse layers by `mlp_layer_types`) and Flint (Qwen3-MoE
with sinks, rotary-free full layers, sigmoid routing and an ungated shared expert). The
fixtures (conftest.FAMILIES) run in the generic suites too: test_exactness compares every
chunk's logits with transformers in both flavours (and, under slow, greedy text over the
whole length and chunk matrix); test_families reads their configs' defaults as
transformers; test_moe runs its matrix on the MoE ones under slow."""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers

from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.conftest import GEMMA4
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import check_together

FLAVORS = ("ort", "standard")
TEXT_FAMILIES = ("gemma4_unified_text", "lara_mini", "olmo_hybrid", "mellum", "flint")
ALL_FAMILIES = (*TEXT_FAMILIES, "gemma4_unified")


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_the_native_kernels_run_each_family_as_transformers(family, hf_model, bundle,
                                                            monkeypatch):
    """The ort flavour on the native kernels (attention, and the DeltaNet's delta rule where
    there is one): chunks of 1 to 40 tokens, the last before the split padded."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", "require")
    path = bundle(family, "ort")
    engine = Engine.load(path, threads=2, background=False)
    assert engine.backend.kernels.described.startswith("native")
    engine.close()
    assert_padded_chunks_match(hf_model(family), path)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_rows_of_different_lengths_decode_together_as_transformers(family, flavor, hf_model,
                                                                   bundle):
    engine = Engine.load(bundle(family, flavor), threads=2, background=False, chunk_size=16)
    check_together(engine, hf_model(family), 8)
    engine.close()


def test_gemma4_unified_reads_no_per_layer_inputs_a_config_carries():
    """Its model has none, whatever config.json says (a Gemma 4 config's keys)."""
    raw = {"model_type": "gemma4_unified_text", **GEMMA4, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
           "intermediate_size": 96}
    assert raw["hidden_size_per_layer_input"]  # the Gemma 4 fixture's keys, carried over
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.per_layer_input, cfg.per_layer_vocab) == (0, 0)
    import torch

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**raw))
    assert not any("per_layer" in name for name, _ in model.named_parameters())


def test_gemma4_unified_exports_the_language_model_of_its_image_text_checkpoint(bundle):
    raw = json.loads((bundle("gemma4_unified") / MANIFEST_FILE).read_text())
    assert raw["model"]["shared_kv_layers"] == [4, 5]
    assert any("vision tower left out" in q for q in raw["source"]["quirks"])
    assert not any("per-layer inputs" in q for q in raw["source"]["quirks"])


def test_lara_mini_default_layers_and_widths_are_transformers():
    """Without layer_types: the released period of five; every layer's MLP experts."""
    raw = {"model_type": "lara_mini", "num_hidden_layers": 7, "hidden_size": 64,
           "num_attention_heads": 4, "head_dim": 16, "vocab_size": 128}
    cfg, hf = ModelConfig.from_hf(raw), transformers.LaraMiniConfig(**raw)
    assert list(cfg.delta_layers) == [i for i, kind in enumerate(hf.layer_types)
                                      if kind == "linear_attention"]
    assert [layer.window for layer in cfg.layers] == [
        hf.sliding_window if kind == "sliding_attention" else None for kind in hf.layer_types]
    # rotary only where transformers gives it: the sliding layers
    assert [layer.rope is not None for layer in cfg.layers] == [
        kind == "sliding_attention" for kind in hf.layer_types]
    assert cfg.moe is not None and cfg.moe.layers == tuple(range(7))
    assert (cfg.moe.experts, cfg.moe.top_k, cfg.moe.width, cfg.moe.norm_topk) == (
        hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size, hf.norm_topk_prob)
    assert cfg.tie_embeddings is hf.tie_word_embeddings is True
    assert cfg.moe.describe(7).endswith("an ungated shared expert of width 512")


def test_olmo_hybrid_default_layers_and_deltanet_widths_are_transformers():
    """Its DeltaNet's heads default from the attention's; every 4th layer attends."""
    raw = {"model_type": "olmo_hybrid", "num_hidden_layers": 6, "hidden_size": 64,
           "num_attention_heads": 4, "vocab_size": 128, "intermediate_size": 96}
    cfg, hf = ModelConfig.from_hf(raw), transformers.OlmoHybridConfig(**raw)
    assert list(cfg.delta_layers) == [i for i, kind in enumerate(hf.layer_types)
                                      if kind == "linear_attention"]
    assert cfg.delta is not None
    assert (cfg.delta.key_heads, cfg.delta.value_heads, cfg.delta.key_dim,
            cfg.delta.value_dim, cfg.delta.conv_kernel) == (
        hf.linear_num_key_heads, hf.linear_num_value_heads, hf.linear_key_head_dim,
        hf.linear_value_head_dim, hf.linear_conv_kernel_dim)
    assert cfg.delta.beta_scale == 2.0 and cfg.delta.norm_eps == 1e-5
    assert [cfg.block_of(i) for i in range(6)] == [
        "pre" if kind == "linear_attention" else "post" for kind in hf.layer_types]
    no_neg = ModelConfig.from_hf({**raw, "linear_allow_neg_eigval": False})
    assert no_neg.delta is not None and no_neg.delta.beta_scale == 1.0


def test_mellum_default_layers_and_ropes_are_transformers():
    """Without layer_types every layer is full, without mlp_layer_types every one sparse;
    each layer type has its rope base."""
    raw = {"model_type": "mellum", "num_hidden_layers": 3, "hidden_size": 64,
           "num_attention_heads": 4, "head_dim": 16, "vocab_size": 128}
    cfg, hf = ModelConfig.from_hf(raw), transformers.MellumConfig(**raw)
    assert [layer.window for layer in cfg.layers] == [None] * 3 == [
        hf.sliding_window if kind == "sliding_attention" else None for kind in hf.layer_types]
    assert cfg.moe is not None and cfg.moe.layers == (0, 1, 2)
    assert cfg.moe.experts == hf.num_experts and cfg.moe.norm_topk == hf.norm_topk_prob
    for kind, rope in (("full_attention", GLOBAL), ("sliding_attention", LOCAL)):
        assert cfg.ropes[rope].theta == hf.rope_parameters[kind]["rope_theta"]
    dense = ModelConfig.from_hf({**raw, "mlp_layer_types": ["dense", "sparse", "dense"]})
    assert dense.moe is not None and dense.moe.layers == (1,)


def test_flint_default_layers_are_transformers():
    """Full attention (without rotary) on the first two layers, every fourth and the last,
    a window elsewhere; the first two layers dense."""
    raw = {"model_type": "flint", "num_hidden_layers": 11, "hidden_size": 64,
           "num_attention_heads": 4, "head_dim": 16, "vocab_size": 128}
    cfg, hf = ModelConfig.from_hf(raw), transformers.FlintConfig(**raw)
    sliding = [kind == "sliding_attention" for kind in hf.layer_types]
    assert [layer.window is not None for layer in cfg.layers] == sliding
    assert [layer.rope is not None for layer in cfg.layers] == sliding
    assert cfg.moe is not None and cfg.moe.layers == tuple(
        i for i in range(11) if i not in hf.mlp_only_layers)
    assert cfg.moe.routing == "sigmoid" and cfg.moe.norm_eps == 0.0


@pytest.mark.parametrize("family, change, message", [
    ("olmo_hybrid", {"rope_parameters": {"rope_type": "default", "rope_theta": None}},
     "NoPE mode.* not supported"),
    ("olmo_hybrid", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ("lara_mini", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ("mellum", {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e4,
                           "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "partial_rotary_factor per layer type .full_attention: 0.5. is not supported"),
])
def test_what_export_cannot_honour_is_refused_in_one_line(hf_model, family, change, message):
    raw = {**json.loads((hf_model(family) / "config.json").read_text()), **change}
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf(raw)
    assert "\n" not in str(err.value)


def test_olmo_hybrid_checkpoint_disagreeing_with_its_deltanet_widths_is_one_line(
        hf_model, tmp_path):
    """The projections and convolutions, read together, are checked against config.json."""
    import shutil

    from edgeprefill.export.exporter import ExportOptions, export

    hf = shutil.copytree(hf_model("olmo_hybrid"), tmp_path / "hf")
    raw = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**raw, "linear_value_head_dim": 16}))
    with pytest.raises(ExportError, match=r"q_proj.weight \+ .* has shape .* implies") as err:
        export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    assert "\n" not in str(err.value)


def test_the_fixtures_exercise_what_each_family_changes(hf_model):
    """Guards conftest's fixtures: a change there must keep every difference in play."""
    lara = json.loads((hf_model("lara_mini") / "config.json").read_text())
    assert {"sliding_attention", "full_attention", "linear_attention"} <= set(
        lara["layer_types"])
    olmo = json.loads((hf_model("olmo_hybrid") / "config.json").read_text())
    assert olmo["linear_allow_neg_eigval"] and olmo["rms_norm_eps"] != 1e-5
    kinds = olmo["layer_types"]
    assert any(a != b for a, b in zip(kinds, kinds[1:], strict=False))  # blocks alternate
    assert np.unique(kinds).size == 2
