"""Which layers export can take, and how each rotates, as the family's transformers model
builds them: Granite 4's attention and mamba layers, experts and position embeddings,
Cohere 2's rotary on its sliding layers only. The logits of the fixtures
(tests/conftest.py) are checked in tests/test_exactness.py."""

from __future__ import annotations

import pytest
import torch
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import LOCAL
from edgeprefill.export.model_config import ModelConfig
from tests.test_families import MINIMAL

ATTENTION_ONLY = {"layer_types": ["attention"] * 4, "num_local_experts": 0}


def granite4(**keys) -> dict:
    return {"model_type": "granitemoehybrid", **MINIMAL, **keys}


def hf_granite4(**keys):
    return transformers.AutoConfig.for_model("granitemoehybrid", **MINIMAL, **keys)


def refusal(raw: dict) -> str:
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf(raw)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("keys", [
    {"layer_types": ["attention", "mamba", "attention", "mamba"]},
    {"layers_block_type": ["mamba", "attention", "attention", "attention"]},
    {"layer_types": ["full_attention"] * 3 + ["linear_attention"]},
], ids=("legacy names", "layers_block_type", "transformers 5 names"))
def test_granite4_mamba_layers_are_where_transformers_makes_them(keys):
    model = transformers.AutoModelForCausalLM.from_config(
        hf_granite4(num_local_experts=0, pad_token_id=0, **keys))
    mamba = [i for i, layer in enumerate(model.model.layers) if layer.mamba is not None]
    assert list(ModelConfig.from_hf(granite4(num_local_experts=0, **keys)).mamba_layers) == \
        mamba


def test_granite4_without_layer_types_is_all_mamba_and_refused_in_one_line():
    """GraniteMoeHybridConfig makes every layer mamba unless layer_types says otherwise;
    export needs an attention layer."""
    assert set(hf_granite4(num_local_experts=0).layer_types) == {"linear_attention"}
    assert refusal(granite4(num_local_experts=0)) == (
        "layer_types has no full_attention layer; export needs at least one")


@pytest.mark.parametrize("keys", ({}, {"num_local_experts": 4}), ids=("default", "given"))
def test_granite4_routed_experts_are_refused(keys):
    experts = hf_granite4(**keys).num_local_experts  # 8 unless config.json says otherwise
    assert refusal(granite4(layer_types=["attention"] * 4, **keys)) == (
        f"granitemoehybrid: routed experts are not supported (num_local_experts={experts}); "
        "only dense models (num_local_experts 0)")


@pytest.mark.parametrize("kind", ("rope", "nope", None))
def test_granite4_rotates_only_where_its_model_has_a_rotary_embedding(kind):
    raw = granite4(**ATTENTION_ONLY, position_embedding_type=kind)
    config = hf_granite4(**ATTENTION_ONLY, position_embedding_type=kind, pad_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    rotates = model.model.rotary_emb is not None
    assert [layer.rope is not None for layer in ModelConfig.from_hf(raw).layers] == [rotates] * 4


def test_granite4_dense_mlp_is_shared_intermediate_size_wide():
    raw = granite4(**ATTENTION_ONLY, shared_intermediate_size=48)
    config = hf_granite4(**ATTENTION_ONLY, shared_intermediate_size=48, pad_token_id=0)
    mlp = transformers.AutoModelForCausalLM.from_config(config).model.layers[0].shared_mlp
    assert ModelConfig.from_hf(raw).intermediate_size == mlp.output_linear.in_features == 48


@pytest.mark.parametrize("keys", [
    {"sliding_window_pattern": 4},
    {"sliding_window_pattern": 2},
    {"layer_types": ["full_attention", "sliding_attention", "full_attention",
                     "sliding_attention"]},
], ids=("pattern 4", "pattern 2", "layer_types"))
def test_cohere2_rotates_and_slides_exactly_on_its_sliding_layers(keys):
    raw = {"model_type": "cohere2", **MINIMAL, "sliding_window": 8, **keys}
    config = transformers.AutoConfig.for_model("cohere2", **MINIMAL, sliding_window=8,
                                               pad_token_id=0, **keys)
    model = transformers.AutoModelForCausalLM.from_config(config)
    windows = [layer.self_attn.sliding_window for layer in model.model.layers]
    ours = ModelConfig.from_hf(raw).layers
    # Cohere2Attention rotates q and k where the layer has a window, never elsewhere.
    assert [layer.window for layer in ours] == windows
    assert [layer.rope for layer in ours] == [LOCAL if w else None for w in windows]


def test_cohere2_without_a_window_is_refused_as_its_model_fails():
    config = transformers.AutoConfig.for_model("cohere2", **MINIMAL, sliding_window=None)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="sliding_window"):  # transformers' own failure
        model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=False)
    assert refusal({"model_type": "cohere2", **MINIMAL, "sliding_window": None}) == (
        "cohere2: config.json needs sliding_window; the family's model cannot run without it")


@pytest.mark.parametrize("head_dim", (None, 32))
def test_cohere2_head_dim_is_the_models(head_dim):
    # Cohere2Config sets head_dim to hidden / heads, and a config.json's own wins over it.
    keys = {} if head_dim is None else {"head_dim": head_dim}
    config = transformers.AutoConfig.for_model("cohere2", **MINIMAL, pad_token_id=0, **keys)
    attention = transformers.AutoModelForCausalLM.from_config(config).model.layers[0].self_attn
    ours = ModelConfig.from_hf({"model_type": "cohere2", **MINIMAL, **keys})
    assert ours.head_dim == attention.head_dim == attention.q_proj.out_features // 4


def test_nemotron_mlp_bias_is_refused():
    assert refusal({"model_type": "nemotron", **MINIMAL, "mlp_bias": True}) == (
        "nemotron: mlp_bias=true is not supported")
