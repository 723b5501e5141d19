"""RecurrentGemma: RG-LRU recurrent blocks (export/rg_lru.py: a conv and a float32 state)
and local attention, Gemma's (1+w) norms, embedding scale (rounded to bfloat16) and
soft-capped logits. The fixture (conftest.FAMILIES "recurrent_gemma") has three recurrent
blocks around one attention layer whose window (12) the test prompts cross; the generic
suites run it too."""

from __future__ import annotations

import pytest
import torch
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig

# google/recurrentgemma-2b's config.json as we know its shape (the Hub was not reachable
# here): two recurrent blocks then one local attention layer, over 26 layers; MQA.
HUB_2B = {
    "architectures": ["RecurrentGemmaForCausalLM"], "model_type": "recurrent_gemma",
    "hidden_size": 2560, "intermediate_size": 15360, "num_hidden_layers": 26,
    "num_attention_heads": 10, "num_key_value_heads": 1, "lru_width": 2560,
    "attention_window_size": 2048, "conv1d_width": 4, "logits_soft_cap": 30.0,
    "rms_norm_eps": 1e-06, "hidden_activation": "gelu_pytorch_tanh",
    "block_types": ["recurrent", "recurrent", "attention"], "partial_rotary_factor": 0.5,
    "rope_theta": 10000.0, "vocab_size": 256000, "attention_bias": False,
    "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}


@pytest.mark.parametrize("drop", ((), ("partial_rotary_factor",)))
def test_a_hub_config_reads_as_transformers_reads_it(drop):
    """Without partial_rotary_factor the rotary covers half of each head all the same."""
    raw = {k: v for k, v in HUB_2B.items() if k not in drop}
    ours = ModelConfig.from_hf(raw)
    hf = transformers.RecurrentGemmaConfig.from_dict(raw)
    assert [i for i, kind in enumerate(hf.layers_block_type) if kind == "linear_attention"] \
        == list(ours.lru_layers)
    assert list(ours.kv_layers) == [i for i in range(26) if i % 3 == 2]
    assert all(ours.layers[i].window == hf.attention_window_size for i in ours.kv_layers)
    assert (ours.head_dim, ours.num_kv_heads, ours.intermediate_size) == (
        hf.head_dim, hf.num_key_value_heads, hf.intermediate_size // 2)
    assert ours.rotary_dim == int(hf.head_dim * hf.rope_parameters["partial_rotary_factor"])
    assert ours.lru is not None and (ours.lru.width, ours.lru.conv_kernel) == (
        hf.lru_width, hf.conv1d_width)
    assert ours.final_softcap == hf.logits_soft_cap
    # the model's normalizer is a bfloat16 buffer: 50.5, not sqrt(2560) = 50.596
    assert ours.embed_scale == float(torch.tensor(2560**0.5, dtype=torch.bfloat16)) == 50.5


def test_an_unknown_block_type_is_refused_in_one_line():
    with pytest.raises(ExportError, match="^recurrent_gemma: block_types holds unsupported "
                                          "kinds: mlp$"):
        ModelConfig.from_hf({**HUB_2B, "block_types": ["recurrent", "mlp", "attention"]})
