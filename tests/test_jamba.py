"""Jamba: Mamba-1 mixers (export/mamba1.py) whose dt, B and C are RMS-normed by weights of
their own, attention layers without rotary every attn_layer_period layers, and routed
experts (softmax top k, not renormalized) every expert_layer_period layers. The fixture
(conftest.FAMILIES "jamba") has experts on an attention and a mamba layer; the generic
suites run it too."""

from __future__ import annotations

import pytest
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig

# ai21labs/Jamba-v0.1's config.json as we know its shape (the Hub was not reachable here):
# attention on 1 layer of 8, experts (16, top 2) on every other layer.
HUB_V01 = {
    "architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "attn_layer_offset": 4, "attn_layer_period": 8,
    "expert_layer_offset": 1, "expert_layer_period": 2, "num_experts": 16,
    "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_dt_rank": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
    "hidden_act": "silu", "rms_norm_eps": 1e-06, "max_position_embeddings": 262144,
    "vocab_size": 65536, "tie_word_embeddings": False, "sliding_window": None,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "use_mamba_kernels": True,
}


@pytest.mark.parametrize("overrides", ({}, {"mamba_dt_rank": "auto", "num_experts": 1},
                                       {"attn_layer_offset": 0, "expert_layer_period": 3}))
def test_a_hub_config_reads_as_transformers_reads_it(overrides):
    raw = {**HUB_V01, **overrides}
    ours = ModelConfig.from_hf(raw)
    hf = transformers.JambaConfig.from_dict(raw)
    assert [i for i, kind in enumerate(hf.layers_block_type) if kind == "mamba"] \
        == list(ours.mamba_layers)
    assert [i for i, kind in enumerate(hf.layers_block_type) if kind == "attention"] \
        == list(ours.kv_layers)
    assert all(layer.rope is None for layer in ours.layers)  # no rotary anywhere
    s = ours.selective
    assert s is not None and (s.inner, s.state_size, s.conv_kernel, s.dt_rank) == (
        hf.mamba_expand * hf.hidden_size, hf.mamba_d_state, hf.mamba_d_conv, hf.mamba_dt_rank)
    assert s.bc_dt_weighted and s.bc_dt_eps == hf.rms_norm_eps
    experts = [i for i, n in enumerate(hf.layers_num_experts) if n > 1]
    assert (list(ours.moe.layers) if ours.moe else []) == experts
    if ours.moe:
        assert (ours.moe.experts, ours.moe.top_k, ours.moe.width, ours.moe.norm_topk) == (
            hf.num_experts, hf.num_experts_per_tok, hf.intermediate_size, False)


def test_an_offset_past_its_period_is_refused_in_one_line():
    with pytest.raises(ExportError, match=r"^jamba: attn_layer_offset \(8\) must be 0 to "
                                          r"attn_layer_period \(8\)$"):
        ModelConfig.from_hf({**HUB_V01, "attn_layer_offset": 8})
