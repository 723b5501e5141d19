"""Muse Spark's language model (export/families/muse.py): Muse Glimmer's attention with
each head's output RMS-normed without weight, its sandwich's post-sublayer norms without
weight (attention) and input-scaled (MLP), gated residual adds (export/residual_gate.py),
and routed experts between two projections (export/moe.py: a (1 + w) norm of the first,
each expert's output input-scaled normed before its weight, the router's logits scaled,
a selection bias, renormalized, scaled). Its fixture (conftest.FAMILIES "muse_spark",
MuseSparkForConditionalGeneration with tiny vision and audio towers, two layers of experts
beside two dense ones) runs in the generic suites too. Here: the config read as
transformers builds the model, the Hub's config shape, chunked prefill with a padded chunk
and decode against transformers' logits, rows of different lengths in one call, int4, each
piece shown to matter (export without it and the logits leave transformers'), and what export
refuses."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export import families
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.families import muse
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.export.residual_gate import factors
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, IMAGE_TEXT, load_hf_model
from tests.state_models import GRAPHS, assert_padded_chunks_match
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_moe import dequantized_int4, run_rows
from tests.test_quantize import logits_at

MINIMAL = {"model_type": "muse_spark_text", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "vocab_size": 128, "bos_token_id": 1, "eos_token_id": 2,
           "num_local_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
           "moe_hidden_size": 32}
TOWERS = IMAGE_TEXT["muse_spark"]
# meta-models/Muse-Spark-Open-816B-A42B's config.json as its config class writes it (the
# Hub was not reachable here): the outer keys, text_config with its class's values.
HUB = {
    "architectures": ["MuseSparkForConditionalGeneration"], "model_type": "muse_spark",
    "image_token_id": 200092, "video_token_id": 200091, "audio_token_id": 200038,
    "out_hidden_size": 6144, "projector_hidden_size": 4096, "projector_hidden_act": "gelu",
    "text_config": {"model_type": "muse_spark_text", "vocab_size": 202048,
                    "hidden_size": 8192, "intermediate_size": 16384,
                    "num_hidden_layers": 62, "num_attention_heads": 128,
                    "num_key_value_heads": 16, "head_dim": 64, "hidden_act": "silu",
                    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-05,
                    "bos_token_id": 200000, "eos_token_id": 200001,
                    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
                    "sliding_window": 2048, "final_logit_softcapping": 20.0,
                    "qk_scale_factor": 5.4730064863875,
                    "output_multiplier": 0.1767766952966369, "post_norm_eps": 1e-08,
                    "moe_intermediate_size": 4096, "num_local_experts": 256,
                    "num_experts_per_tok": 8, "routed_scaling_factor": 1.0,
                    "moe_hidden_size": 4096, "residual_gate_temperature": 0.3},
    "vision_config": {"model_type": "muse_spark_vision"},
    "audio_config": {"model_type": "muse_spark_audio"},
}


def meta_model(text: dict, **outer):
    config = transformers.AutoConfig.for_model("muse_spark", text_config=text, **TOWERS,
                                               **outer)
    with torch.device("meta"):
        return config, transformers.AutoModelForImageTextToText.from_config(config)


@pytest.mark.parametrize("keys", [
    FAMILIES["muse_spark"],
    {},  # the config class's lists and scales
    {"num_hidden_layers": 5, "sliding_window": 4, "qk_scale_factor": 2.0,
     "layer_types": ["full_attention", "sliding_attention"] * 2 + ["full_attention"],
     "layer_rope_theta": [0, 1e4, 1e4, 0, 5e5], "rms_norm_eps": 1e-3,
     "mlp_layer_types": ["dense", "sparse", "sparse", "dense", "sparse"],
     "routed_scaling_factor": 2.5, "residual_gate_temperature": 0.7},
], ids=["fixture", "defaults", "lists"])
def test_muse_spark_reads_as_transformers_builds_its_layers(keys):
    """Each layer's window, rotary and MLP (experts or dense), the norms' epsilons, q's
    factor, the experts' shape and routing scales, the residual gates' temperature, the
    logits' scale and soft-cap, and the LM head untied, as the model has them."""
    text = {**MINIMAL, **keys}
    ours = ModelConfig.from_hf({"model_type": "muse_spark", "text_config": text,
                                "tie_word_embeddings": True})
    config, model = meta_model(text, tie_word_embeddings=True)
    hf = config.text_config
    layers = model.model.language_model.layers
    assert [layer.window for layer in ours.layers] == [
        each.self_attn.sliding_window for each in layers]
    assert [layer.rope is not None for layer in ours.layers] == [
        bool(theta) for theta in hf.layer_rope_theta]
    assert ours.moe is not None
    assert list(ours.moe.layers) == [i for i, each in enumerate(layers)
                                     if hasattr(each.mlp, "experts")]
    attention = layers[0].self_attn
    assert ours.attn_scale == pytest.approx(attention.scaling * attention.qk_scale_factor)
    assert ours.norm_eps == attention.qk_norm.eps == attention.o_norm.eps \
        == layers[0].input_layernorm.eps
    assert ours.post_norm_eps == layers[0].post_attention_layernorm.eps \
        == layers[0].post_feedforward_layernorm.eps
    sparse = layers[ours.moe.layers[0]].mlp
    assert (ours.moe.experts, ours.moe.top_k, ours.moe.width, ours.moe.inner_width) == (
        sparse.experts.num_experts, sparse.gate.top_k, sparse.experts.intermediate_dim,
        sparse.experts.hidden_dim)
    assert (ours.moe.logit_scale, ours.moe.scaling, ours.moe.expert_norm_eps) == (
        sparse.gate.output_multiplier, sparse.gate.routed_scaling_factor,
        sparse.experts.post_expert_norm.eps)
    assert ours.moe.norm_topk and ours.moe.norm_eps == sparse.gate.norm_topk_prob_eps
    assert ours.residual_gate_temperature == layers[0].post_attention_residual_gate.temperature
    assert (ours.logits_multiplier, ours.final_softcap) == (
        hf.output_multiplier, hf.final_logit_softcapping)
    assert not ours.tie_embeddings and model.lm_head.weight is not \
        model.model.language_model.embed_tokens.weight


def test_the_hubs_config_reads_as_transformers_reads_it():
    """Muse-Spark-Open-816B-A42B's shape: 62 layers, every 4th from the last full and
    NoPE, the others sliding over 2048, 256 experts (top 8) at 4096 on every layer."""
    ours = ModelConfig.from_hf(HUB)
    hf = transformers.AutoConfig.for_model(**HUB).text_config
    assert [layer.window is None for layer in ours.layers] == [
        kind == "full_attention" for kind in hf.layer_types]
    assert [layer.rope is None for layer in ours.layers] == [
        theta == 0 for theta in hf.layer_rope_theta]
    assert ours.attn_scale == pytest.approx(5.4730064863875 / 64**0.5)
    assert ours.moe is not None and len(ours.moe.layers) == 62
    assert (ours.moe.experts, ours.moe.top_k, ours.moe.inner_width) == (256, 8, 4096)
    assert not ours.tie_embeddings and ours.eos_token_ids == (200001,)


def test_the_residual_gates_factors_are_transformers():
    """a and b of export/residual_gate.py are MuseSparkResidualGate's, through its clamp."""
    from transformers.models.muse_spark.modeling_muse_spark import MuseSparkResidualGate

    module = MuseSparkResidualGate(transformers.MuseSparkTextConfig(
        hidden_size=8, num_attention_heads=2, residual_gate_temperature=0.3))
    with torch.no_grad():
        module.gate.copy_(torch.tensor([-30.0, -2.0, -0.1, 0.0, 0.5, 1.0, 3.0, 30.0]))
        residual, sublayer = torch.ones(8), torch.ones(8) * 10
        expected = module(residual, sublayer).numpy()
        a, b = factors(module.gate.numpy(), 0.3)
    np.testing.assert_allclose(a + 10 * b, expected, rtol=1e-6)
    assert a[-1] == pytest.approx(1e-3**0.5)  # the clamp's floor


@pytest.mark.parametrize("flavor, kernels", [
    GRAPHS[0], *(pytest.param(*graph, marks=pytest.mark.slow) for graph in GRAPHS[1:])])
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    """Chunks of 1, 2, 3, 16 and 40 tokens (decode steps among them), the last before the
    split padded: every call's logits are transformers' at that token, across the window;
    with the native kernels and without, and the `standard` flavour."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("muse_spark"), bundle("muse_spark", flavor))


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_rows_of_different_valid_lengths_in_one_call_each_equal_transformers(
        flavor, hf_model, bundle):
    """One call of three rows (a 9-token chunk, a decode token, 4 tokens): each row's
    tokens choose their own experts."""
    hf_dir = hf_model("muse_spark")
    prompts = [prompt_ids(30, seed=s) for s in (3, 4, 5)]
    engine = Engine.load(bundle("muse_spark", flavor), threads=2, background=False,
                         kv_slots=3)
    got = run_rows(engine.backend, prompts, [21, 29, 26])
    engine.close()
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(got[row], reference_logits(hf_dir, ids)[-1], rtol=1e-4,
                                   atol=1e-4, err_msg=f"row {row}")


@pytest.mark.slow
def test_int4_equals_transformers_with_dequantized_weights(hf_model, tmp_path):
    """int4 at float compute: every projection (q/k/v, the gate, o, the dense MLPs, the
    experts' projections in and out, each expert, the LM head) and the untied table as the
    bundle stores them; the routers and every norm stay float."""
    hf_dir = hf_model("muse_spark")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0)))
    model = load_hf_model(hf_dir)
    norms = {name: param.clone() for name, param in model.named_parameters()
             if "norm" in name}  # (the experts' norm is no projection)
    dequantized_int4(model)
    ids = prompt_ids(20)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in norms:
                param.copy_(norms[name])
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), expected, rtol=1e-3, atol=1e-3)


def _experts(**names):
    """The family's experts with some of their names or keys replaced."""
    spec = muse.SPARK_EXPERTS
    moe_keys = {k: v for k, v in names.items() if not hasattr(spec.names, k)}
    name_keys = {k: v for k, v in names.items() if hasattr(spec.names, k)}
    return {"moe": replace(spec, names=replace(spec.names, **name_keys), **moe_keys)}


# Each piece of the family taken out of the export (or, where the checkpoint's weights
# need it, replaced by its nearest other): its logits must then leave transformers'.
BROKEN = {
    "each head's output norm": {"out_norm_weightless": False},
    "post-attention norm without weight": {"post_norm_kinds": ("layer_no_affine",
                                                               "rms_input_scaled")},
    "post-MLP norm input-scaled": {"post_norm_kinds": ("rms_no_weight", "rms_plus_one")},
    "residual gates": {"residual_gate_key": None},
    "router's logit scale": _experts(logit_scale_key=None),
    "selection bias": _experts(expert_bias=()),
    "routed scaling": _experts(scaling_key=None),
    "norm before the experts": _experts(pre_norm=None),
    "each expert's output norm": _experts(expert_norm=None),
}


@pytest.mark.slow
@pytest.mark.parametrize("piece", BROKEN)
def test_each_piece_matters(piece, hf_model, tmp_path, monkeypatch):
    hf_dir = hf_model("muse_spark")
    monkeypatch.setitem(families.FAMILIES, "muse_spark",
                        replace(muse.MUSE_SPARK, **BROKEN[piece]))
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    ids = prompt_ids(24)
    assert np.abs(logits_at(tmp_path / "b", ids) - reference_logits(hf_dir, ids)[-1]
                  ).max() > 1e-2


@pytest.mark.parametrize("keys, message", [
    ({"mlp_layer_types": ["sparse"] * 3},
     "mlp_layer_types lists 3 layers; num_hidden_layers is 4"),
    ({"mlp_layer_types": ["sparse", "moe", "dense", "dense"]},
     "mlp_layer_types 'moe' is not supported"),
    ({"layer_rope_theta": [1e4, 0]}, "layer_rope_theta lists 2 layers; num_hidden_layers is 4"),
    ({"attention_bias": True}, "attention_bias=true is not supported"),
    ({"residual_gate_temperature": 0}, "residual_gate_temperature must be a nonzero number"),
    ({"moe_hidden_size": 0}, "moe_hidden_size must be positive, got 0"),
    ({"post_norm_eps": -1e-8}, "post_norm_eps must be positive, got -1e-08"),
    ({"model_type": "muse_glimmer_text"},
     "text_config model_type 'muse_glimmer_text' is not supported"),
])
def test_what_muse_spark_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "muse_spark", "text_config": {**MINIMAL, **keys}})
    assert "\n" not in str(refused.value)


def test_its_language_model_alone_is_refused_in_one_line():
    """transformers has no causal LM of muse_spark_text (MuseSparkTextModel has no head)."""
    with pytest.raises(ExportError, match="export the muse_spark checkpoint") as refused:
        ModelConfig.from_hf(MINIMAL)
    assert "\n" not in str(refused.value)
