"""Mixture-of-experts families transformers 5.24 added on bases export already has, each
declared in export/families/moe_sigmoid.py (Hy3, AFMoE) and moe_top_k.py (Aria, Cohere 2
MoE) by what differs: Hy3 (hy_v3: sigmoid routing under the
Hub's names), Aria's language model (aria_text: experts stored [E, in, out]) and the aria
image-text checkpoint around it, Cohere 2 MoE (cohere2_moe: its norm, routing and shared
expert's combination picked by config.json, its dense prefix rotated) and AFMoE (afmoe: an
output gate of its own projection, norms around attention and MLP, muP's embedding scale).
Their fixtures (conftest.FAMILIES) run in the generic suites too: test_exactness compares
every chunk's logits with transformers in both flavours (the default suite's check of each),
test_families reads their configs' defaults as transformers, test_moe runs its matrix on
them under slow, test_wrapped_image_text the aria wrapper under slow."""

from __future__ import annotations

import pytest
import torch
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, build_hf_model
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import check_together

FLAVORS = ("ort", "standard")
NEW_FAMILIES = ("hy_v3", "aria_text", "cohere2_moe", "afmoe")
MINIMAL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
           "head_dim": 16}
# Cohere 2 MoE's other side of each switch the fixture sets: LayerNorm (no rms_norm_eps),
# softmax over the top 2 logits, the shared MLP added, not averaged; its dense prefix layer
# (prefix pattern 2: sliding) then a full one without rotary
COHERE2_MOE_OTHER = {"rms_norm_eps": None, "expert_selection_fn": "softmax",
                     "shared_expert_combination_strategy": "sum", "num_hidden_layers": 5,
                     "first_k_dense_replace": 2, "prefix_dense_sliding_window_pattern": 2}


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_rows_of_different_lengths_generate_together_as_transformers(family, flavor, hf_model,
                                                                     bundle):
    engine = Engine.load(bundle(family, flavor), threads=2, background=False, chunk_size=16)
    check_together(engine, hf_model(family), 8)
    engine.close()


@pytest.mark.parametrize("flavor", ["ort", pytest.param("standard", marks=pytest.mark.slow)])
def test_cohere2_moe_with_layernorm_softmax_and_summed_shared_expert_runs_as_transformers(
        flavor, tmp_path):
    """Chunks of 1 to 40 tokens (the last before the split padded) of the config that sets
    each of Cohere 2 MoE's switches the other way from the fixture."""
    hf_dir = build_hf_model("cohere2_moe", tmp_path / "hf", **COHERE2_MOE_OTHER)
    cfg = ModelConfig.from_dir(hf_dir)
    assert (cfg.norm, cfg.moe.routing, cfg.moe.averaged) == ("layer_no_bias", "topk_softmax",
                                                            False)
    out = tmp_path / flavor
    export(hf_dir, out, ExportOptions(flavor=flavor, chunks=(16,), max_context=64,
                                      show_progress=False))
    assert_padded_chunks_match(hf_dir, out)


def cohere2_moe_meta(**keys):
    config = transformers.AutoConfig.for_model("cohere2_moe", **{**MINIMAL, **keys})
    with torch.device("meta"):
        return config, transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("keys", [
    {}, {"first_k_dense_replace": 2}, COHERE2_MOE_OTHER,
    {"first_k_dense_replace": 1, "sliding_window_pattern": 2},
    {"layer_types": ["full_attention"] * 4, "mlp_layer_types": ["dense"] * 2 + ["sparse"] * 2},
], ids=["no-prefix", "prefix", "other", "pattern-2", "lists"])
def test_cohere2_moe_rotates_the_layers_and_slides_the_windows_its_attention_does(keys):
    """Its sliding layers rotate, and its dense prefix ones where that prefix's pattern is
    1 (force_rope), full attention though they are; its dense MLPs and experts as wide as
    transformers builds them."""
    raw = {"model_type": "cohere2_moe", **MINIMAL, "sliding_window": 8, **keys}
    ours = ModelConfig.from_hf(raw)
    config, model = cohere2_moe_meta(**{**keys, "sliding_window": 8})
    attention = [layer.self_attn for layer in model.model.layers]
    assert [layer.rope is not None for layer in ours.layers] == [
        a.sliding_window is not None or a.force_rope for a in attention]
    assert [layer.window for layer in ours.layers] == [a.sliding_window for a in attention]
    sparse = [i for i, kind in enumerate(config.mlp_layer_types) if kind == "sparse"]
    assert list(ours.moe.layers if ours.moe else ()) == sparse
    dense = [layer.mlp for i, layer in enumerate(model.model.layers) if i not in sparse]
    assert all(mlp.gate_proj.out_features == ours.intermediate_size for mlp in dense)


def test_hy_v3_without_shared_experts_has_a_shared_mlp_intermediate_size_wide():
    """HYV3MLP's `intermediate_size or config.intermediate_size`: a width of 0 shared
    experts is the dense MLP's, as transformers builds it."""
    keys = {**MINIMAL, "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 0,
            "moe_intermediate_size": 32}
    ours = ModelConfig.from_hf({"model_type": "hy_v3", **keys})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model("hy_v3", **keys))
    assert ours.moe.shared_width == model.model.layers[1].mlp.shared_experts.gate_proj \
        .out_features == 96


@pytest.mark.parametrize("family, keys, message", [
    ("cohere2_moe", {"expert_selection_fn": "relu"},
     "cohere2_moe: expert_selection_fn 'relu' is not one its model takes"),
    ("cohere2_moe", {"shared_expert_combination_strategy": "max"},
     "cohere2_moe: shared_expert_combination_strategy 'max' is not one"),
    ("aria_text", {"hidden_act": "gelu"}, "aria_text: hidden_act 'gelu' is not supported"),
    ("afmoe", {"sliding_window": None}, "afmoe: config.json needs sliding_window"),
    ("afmoe", {"attention_bias": True}, "afmoe: attention_bias=true is not supported"),
    ("afmoe", {"route_scale": None}, "afmoe: route_scale is null"),
    ("hy_v3", {"num_shared_experts": None}, "hy_v3: num_shared_experts is null"),
    ("hy_v3", {"mlp_bias": True}, "hy_v3: mlp_bias=true is not supported"),
])
def test_what_a_family_cannot_run_is_refused_in_one_line(family, keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": family, **MINIMAL, **FAMILIES[family], **keys})
    assert "\n" not in str(refused.value)


def test_afmoe_reads_mup_scaling_and_the_full_layers_without_rotary():
    raw = {"model_type": "afmoe", **MINIMAL, **FAMILIES["afmoe"]}
    cfg = ModelConfig.from_hf(raw)
    assert cfg.embed_scale == pytest.approx(8.0)  # sqrt(64)
    assert [layer.rope is not None for layer in cfg.layers] == [True, True, False]
    assert ModelConfig.from_hf({**raw, "mup_enabled": False}).embed_scale is None
