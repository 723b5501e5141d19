"""Bamba: Mamba-2 layers (export/mamba2.py) and attention layers where
`attn_layer_indices` says, each followed by a gated MLP. The fixture (conftest.FAMILIES
"bamba") has one attention layer between two Mamba-2 ones; the generic suites run it too."""

from __future__ import annotations

import pytest
import transformers

from edgeprefill.export.model_config import ModelConfig
from tests.state_models import GRAPHS, assert_padded_chunks_match

# ibm-ai-platform/Bamba-9B-v2's config.json as we know its shape (the Hub was not reachable
# here): 32 layers, 3 of them attention, 128 Mamba-2 heads of 64, a state of 128, 8 groups.
HUB_9B = {
    "architectures": ["BambaForCausalLM"], "model_type": "bamba", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "attn_layer_indices": [9, 18, 27], "mamba_n_heads": 128,
    "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
    "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True,
    "mamba_proj_bias": False, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "max_position_embeddings": 262144, "vocab_size": 128256, "tie_word_embeddings": False,
}


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("bamba"), bundle("bamba", flavor))


@pytest.mark.parametrize("factor", (None, 1.0))
def test_a_hub_config_reads_as_transformers_reads_it(factor):
    """Rotary on half of each head, even where the config says otherwise (BambaConfig
    hard-codes it)."""
    raw = HUB_9B if factor is None else {**HUB_9B, "partial_rotary_factor": factor}
    ours = ModelConfig.from_hf(raw)
    hf = transformers.BambaConfig.from_dict(raw)
    assert [i for i, kind in enumerate(hf.layers_block_type) if kind == "linear_attention"] \
        == list(ours.mamba_layers)
    assert ours.rotary_dim == int(128 * hf.rope_parameters["partial_rotary_factor"]) == 64
    m = ours.mamba
    assert m is not None and (m.heads, m.head_dim, m.groups, m.state_size) == (
        hf.mamba_n_heads, hf.mamba_d_head, hf.mamba_n_groups, hf.mamba_d_state)
