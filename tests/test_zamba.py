"""Zamba (v1): multi-head Mamba-1 layers (export/mamba1_heads.py: each head its own x_proj
and dt_proj, in_proj's rows interleaved) and one shared attention + MLP block before the
mixer of each hybrid layer (export/shared_block.py, Zamba2's without adapters or rotary).
The fixture (conftest.FAMILIES "zamba") applies the block twice; the generic suites run it
too."""

from __future__ import annotations

import pytest
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig

# Zyphra/Zamba-7B-v1's config.json as we know its shape (the Hub was not reachable here);
# its layers from attn_layer_period and attn_layer_offset.
HUB_7B = {
    "architectures": ["ZambaForCausalLM"], "model_type": "zamba", "hidden_size": 3712,
    "intermediate_size": 14848, "num_hidden_layers": 76, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_mamba_heads": 2, "attn_layer_period": 6,
    "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False,
    "hidden_act": "gelu", "hidden_mamba_act": "silu", "rms_norm_eps": 1e-05,
    "vocab_size": 32000, "tie_word_embeddings": True, "max_position_embeddings": 4096,
}


def test_a_hub_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(HUB_7B)
    hf = transformers.ZambaConfig.from_dict(HUB_7B)
    hybrid = [i for i, kind in enumerate(hf.layers_block_type) if kind == "hybrid"]
    shared = ours.shared_block
    assert shared is not None and list(shared.layers) == hybrid == list(ours.kv_layers)
    assert shared.stored(hybrid[-1]) == f"model.layers.{hybrid[0]}.shared_transf."
    assert (ours.head_dim, ours.num_kv_heads) == (hf.attention_head_dim,
                                                  hf.num_key_value_heads)
    assert ours.attn_scale == (hf.attention_head_dim / 2) ** -0.5
    assert all(layer.rope is None for layer in ours.layers)
    s = ours.selective
    assert s is not None and (s.inner, s.heads, s.state_size, s.dt_rank) == (
        hf.mamba_expand * hf.hidden_size, hf.n_mamba_heads, hf.mamba_d_state,
        hf.mamba_dt_rank)


def test_a_shared_block_of_another_width_is_refused_in_one_line():
    with pytest.raises(ExportError, match=r"^zamba: attention_hidden_size 1000 is not 2 x "
                                          r"hidden_size \(7424\)"):
        ModelConfig.from_hf({**HUB_7B, "attention_hidden_size": 1000})
