"""Poolside's Laguna (export/families/laguna.py): AFMoE's attention with a softplus output
gate (per head, or per channel by `gating`), query heads per layer, a rope base and width
per layer type, and sigmoid routing with a correction bias and an optional soft-cap of the
router's logits. Its fixtures (conftest.FAMILIES: laguna, laguna-per-element,
laguna-softcap) run in the generic suites too: test_exactness compares every chunk's
logits with transformers in both flavours, test_families reads its config's defaults as
transformers, test_moe runs its matrix (int4 included) on it under slow. Here: the
config read as transformers builds the model, the switches the fixtures set shown to
change transformers' own output, and what export refuses."""

from __future__ import annotations

import pytest
import torch
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import FAMILIES, build_hf_model, load_hf_model
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import prompt_ids

MINIMAL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


def meta_model(keys: dict):
    config = transformers.AutoConfig.for_model("laguna", **keys)
    with torch.device("meta"):
        return config, transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("keys", [
    FAMILIES["laguna"], FAMILIES["laguna-per-element"],
    {"head_dim": 16},  # the config class's lists and ropes (full attention, half rotated)
    {"head_dim": 32, "gating": False, "sliding_window": 4,
     "layer_types": ["full_attention", "sliding_attention"] * 2,
     "num_attention_heads_per_layer": [2, 2, 8, 4],
     "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4,
                                            "partial_rotary_factor": 0.25},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0,
                                               "partial_rotary_factor": 0.75}}},
], ids=["fixture", "per-element", "defaults", "gating-false"])
def test_laguna_reads_as_transformers_builds_its_layers(keys):
    """Each layer's query heads, window, rope (base and rotated width) and gate width, and
    the experts' layers and shared MLP, as LagunaForCausalLM has them."""
    ours = ModelConfig.from_hf({"model_type": "laguna", **MINIMAL, **keys})
    config, model = meta_model({**MINIMAL, **keys})
    attention = [layer.self_attn for layer in model.model.layers]
    assert [ours.layer_heads(i) for i in range(ours.num_layers)] == [
        a.q_proj.out_features // a.head_dim for a in attention]
    assert [layer.window for layer in ours.layers] == [a.sliding_window for a in attention]
    assert [ours.for_layer(i).num_heads * (ours.head_dim if ours.gate_per_channel else 1)
            for i in range(ours.num_layers)] == [a.g_proj.out_features for a in attention]
    rotary = model.model.rotary_emb
    for name, kind in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        if kind not in config.layer_types:
            continue
        inv_freq = rotary.compute_default_rope_parameters(config, layer_type=kind)[0]
        rope = ours.ropes[name]
        assert rope.rotary_dim == 2 * len(inv_freq)
        torch.testing.assert_close(torch.tensor(rope.inv_freq(), dtype=torch.float32),
                                   inv_freq)
    assert [layer.rope for layer in ours.layers] == [
        LOCAL if kind == "sliding_attention" else GLOBAL for kind in config.layer_types]
    sparse = [i for i, kind in enumerate(config.mlp_layer_types) if kind == "sparse"]
    assert list(ours.moe.layers) == sparse
    shared = model.model.layers[sparse[0]].mlp.shared_experts
    assert ours.moe.shared_width == shared.gate_proj.out_features


def test_the_fixtures_gate_and_softcap_change_transformers_logits(hf_model):
    """What the fixtures' exactness tests check is there to check: the softplus gate
    (against sigmoid, and against none) and the router's soft-cap (against none) each move
    transformers' own logits."""
    ids = torch.tensor([prompt_ids(40)])

    def logits(model) -> torch.Tensor:
        with torch.no_grad():
            return model(ids).logits[0]

    model = load_hf_model(hf_model("laguna-softcap"))
    capped = logits(model)
    for layer in model.model.layers:
        if hasattr(layer.mlp, "gate"):
            layer.mlp.gate.router_logit_softcapping = 0.0
    assert (capped - logits(model)).abs().max() > 0.05
    model = load_hf_model(hf_model("laguna"))
    gated = logits(model)
    softplus = torch.nn.functional.softplus
    for patch in (torch.sigmoid, lambda x: torch.ones_like(x)):
        torch.nn.functional.softplus = patch
        try:
            assert (gated - logits(model)).abs().max() > 0.05
        finally:
            torch.nn.functional.softplus = softplus


def test_the_router_softcap_reads_as_its_router_applies_it():
    """Only a cap above 0 caps (LagunaTopKRouter's `> 0.0`)."""
    raw = {"model_type": "laguna", **MINIMAL, **FAMILIES["laguna"]}
    assert ModelConfig.from_hf(raw).moe.logit_softcap == 0.0
    assert ModelConfig.from_hf({**raw, "moe_router_logit_softcapping": 2.5}
                               ).moe.logit_softcap == 2.5
    assert ModelConfig.from_hf({**raw, "moe_router_logit_softcapping": -1.0}
                               ).moe.logit_softcap == 0.0


@pytest.mark.slow  # 6 s; the read alone: test_moe's routed_scaling_factor of 0
def test_a_routed_scale_of_0_leaves_the_shared_mlp_alone_as_transformers(tmp_path):
    """moe_routed_scaling_factor 0: LagunaSparseMoeBlock multiplies the routed experts'
    output by it, the shared MLP's alone is added (read as 1, the bundle had differed)."""
    hf_dir = build_hf_model("laguna", tmp_path / "hf", moe_routed_scaling_factor=0.0)
    moe = ModelConfig.from_dir(hf_dir).moe
    assert moe is not None and moe.scaling == 0.0
    out = tmp_path / "ort"
    export(hf_dir, out, ExportOptions(chunks=(16,), max_context=64, show_progress=False))
    assert_padded_chunks_match(hf_dir, out)


ROPES = FAMILIES["laguna"]["rope_parameters"]


@pytest.mark.parametrize("keys, message", [
    ({"moe_apply_router_weight_on_input": True},
     "moe_apply_router_weight_on_input=true is not supported"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling is not supported"),
    ({"rope_parameters": {"full_attention": ROPES["full_attention"]}},
     "rope_parameters needs a sliding_attention entry with rope_theta"),
    ({"rope_parameters": {**ROPES, "full_attention": {"rope_type": "default"}}},
     "rope_parameters needs a full_attention entry with rope_theta"),
    ({"sliding_window": None}, "config.json needs sliding_window"),
    ({"mlp_layer_types": ["dense", "sparse", "moe", "dense"]}, "mlp_layer_types holds moe"),
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types lists 2 layers"),
    ({"num_attention_heads_per_layer": [4, 4]}, "num_attention_heads_per_layer must list"),
    ({"num_attention_heads_per_layer": [4, 3, 4, 4]}, "layer 1 has 3 query heads"),
    ({"rope_parameters": {**ROPES, "full_attention": {**ROPES["full_attention"],
                                                      "partial_rotary_factor": 0.1}}},
     "full_attention: head_dim x partial_rotary_factor must be even"),
])
def test_what_laguna_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "laguna", **MINIMAL, **FAMILIES["laguna"],
                             **keys})
    assert "\n" not in str(refused.value)


def test_transformers_refuses_the_router_weight_on_the_input_too():
    with pytest.raises(NotImplementedError):
        transformers.AutoConfig.for_model("laguna", moe_apply_router_weight_on_input=True)


# A rope type per layer type beside its own width: yarn on the full layers (half of each
# head), linear on the sliding ones (all of it)
OTHER_ROPES = {"full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0,
                                  "original_max_position_embeddings": 256,
                                  "partial_rotary_factor": 0.5},
               "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}


@pytest.mark.parametrize("flavor", ["ort", pytest.param("standard", marks=pytest.mark.slow)])
def test_laguna_with_other_rope_types_per_layer_type_runs_as_transformers(flavor, tmp_path):
    """Chunks of 1 to 40 tokens (the last before the split padded): each layer type's rope
    read from its own entry, its scaling and width together."""
    hf_dir = build_hf_model("laguna", tmp_path / "hf", rope_parameters=OTHER_ROPES)
    cfg = ModelConfig.from_dir(hf_dir)
    assert (cfg.ropes[GLOBAL].kind, cfg.ropes[GLOBAL].rotary_dim) == ("yarn", 16)
    assert (cfg.ropes[LOCAL].kind, cfg.ropes[LOCAL].rotary_dim) == ("linear", 32)
    out = tmp_path / flavor
    export(hf_dir, out, ExportOptions(flavor=flavor, chunks=(16,), max_context=64,
                                      show_progress=False))
    assert_padded_chunks_match(hf_dir, out)
