"""Zamba2: Mamba-2 layers (export/mamba2.py), a shared attention + MLP block before the
mixer of each `hybrid` layer, reading the stream beside the embeddings, with each
application's LoRA adapters and KV cache (export/shared_block.py). The fixture
(conftest.FAMILIES "zamba2") runs two blocks on three hybrid layers (block 0 twice) with
adapters and rotary; the generic suites run it too."""

from __future__ import annotations

import pytest
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig
from tests.state_models import assert_padded_chunks_match, variant_bundles

# Zyphra/Zamba2-1.2B's config.json as we know its shape (the Hub was not reachable here):
# one shared block applied every sixth layer, with adapters and rotary.
HUB_1_2B = {
    "architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "hidden_size": 2048,
    "num_hidden_layers": 38, "num_attention_heads": 32, "intermediate_size": 8192,
    "layers_block_type": (["mamba"] * 5 + ["hybrid"]) * 6 + ["mamba"] * 2,
    "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1,
    "n_mamba_heads": 64, "num_mem_blocks": 1, "use_shared_attention_adapter": True,
    "adapter_rank": 128, "use_mem_rope": True, "rope_theta": 10000, "hidden_act": "gelu",
    "rms_norm_eps": 1e-5, "vocab_size": 32000, "tie_word_embeddings": True,
    "max_position_embeddings": 4096, "add_bias_linear": False, "use_long_context": False,
}


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    """Untied embeddings: transformers 5 then ties no block either (each hybrid layer runs
    the copy stored under its own name); no adapters on the attention, no rotary, one
    block, GQA (2 KV heads), biased MLP and mixer projections."""
    return variant_bundles(tmp_path_factory, "zamba2", "zamba2-untied", {
        "tie_word_embeddings": False, "use_shared_attention_adapter": False,
        "use_mem_rope": False, "num_mem_blocks": 1, "num_key_value_heads": 2,
        "add_bias_linear": True})


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_untied_blocks_without_adapters_or_rotary_equal_transformers(flavor, untied):
    assert_padded_chunks_match(*untied(flavor), chunks=(3, 16))


@pytest.mark.parametrize("overrides", ({}, {"num_mem_blocks": 2, "num_key_value_heads": 8,
                                            "use_mem_rope": False}))
def test_a_hub_config_reads_as_transformers_reads_it(overrides):
    raw = {**HUB_1_2B, **overrides}
    ours = ModelConfig.from_hf(raw)
    hf = transformers.Zamba2Config.from_dict(raw)
    shared = ours.shared_block
    assert shared is not None and list(shared.layers) == hf.hybrid_layer_ids
    assert ours.kv_layers == shared.layers and ours.mamba_layers == tuple(range(38))
    assert (ours.head_dim, ours.num_kv_heads, ours.intermediate_size) == (
        hf.attention_head_dim, hf.num_key_value_heads, hf.intermediate_size)
    assert ours.attn_scale == (hf.attention_head_dim / 2) ** -0.5
    assert all((layer.rope is not None) == hf.use_mem_rope for layer in ours.layers)
    m = ours.mamba
    assert m is not None and (m.heads, m.head_dim, m.groups, m.state_size, m.dt_min) == (
        hf.n_mamba_heads, hf.mamba_headdim, hf.mamba_ngroups, hf.mamba_d_state,
        hf.time_step_min)
    assert shared.blocks == hf.num_mem_blocks and shared.tied == hf.tie_word_embeddings


def test_the_applications_of_a_block_read_its_first_copy_where_tied():
    shared = ModelConfig.from_hf({**HUB_1_2B, "num_mem_blocks": 2}).shared_block
    assert shared is not None
    assert [shared.stored(layer) for layer in shared.layers] == [
        f"model.layers.{i}.shared_transformer." for i in (5, 11, 5, 11, 5, 11)]


@pytest.mark.parametrize("overrides, reason", (
    ({"use_long_context": True}, "use_long_context (its rescaled rope_theta) is not supported"),
    ({"layers_block_type": ["mamba"] * 38},
     "layers_block_type has no hybrid layer; export needs at least one"),
    ({"num_hidden_layers": 40},
     "num_hidden_layers (40) must equal the number of layers_block_type (38)"),
))
def test_what_export_does_not_support_is_refused_in_one_line(overrides, reason):
    with pytest.raises(ExportError, match=f"^zamba2: {reason}$".replace("(", r"\(")
                       .replace(")", r"\)")):
        ModelConfig.from_hf({**HUB_1_2B, **overrides})


def test_the_default_layers_read_as_transformers_reads_them():
    """Without layers_block_type: Zamba2Config's 54 layers, 9 of them hybrid."""
    raw = {k: v for k, v in HUB_1_2B.items()
           if k not in ("layers_block_type", "num_hidden_layers")}
    shared = ModelConfig.from_hf(raw).shared_block
    assert shared is not None
    assert list(shared.layers) == transformers.Zamba2Config.from_dict(raw).hybrid_layer_ids
