"""EXAONE 3.0/3.5 (`exaone`): Llama under the Hub's own tensor names and config keys, which
transformers 5 renames as it loads. The fixture's logits against transformers, chunked, in
both flavours: test_exactness."""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers

from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import build_hf_model
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import export_small, last_logits

# Shaped as LGAI-EXAONE/EXAONE-3.5-2.4B-Instruct's config.json (transformers 4.43 wrote
# it): num_layers, layer_norm_epsilon and activation_function, a legacy llama3 rope_scaling.
EXAONE_35_24B = {
    "architectures": ["ExaoneForCausalLM"], "model_type": "exaone",
    "activation_function": "silu", "bos_token_id": 1, "eos_token_id": 361, "head_dim": 80,
    "hidden_size": 2560, "intermediate_size": 7168, "layer_norm_epsilon": 1e-05,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_layers": 30, "pad_token_id": 0, "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "vocab_size": 102400,
}
# The Hub's keys for what transformers 5 writes under Llama's names.
HUB_KEYS = {"num_hidden_layers": "num_layers", "rms_norm_eps": "layer_norm_epsilon",
            "hidden_act": "activation_function"}


def test_a_hub_exaone_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(EXAONE_35_24B)
    hf = transformers.ExaoneConfig.from_dict(EXAONE_35_24B)
    assert (ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim)
    assert (ours.norm_eps, ours.activation) == (hf.rms_norm_eps, hf.hidden_act)
    rope, params = ours.ropes[GLOBAL], hf.rope_parameters
    assert (rope.kind, rope.theta, rope.factor, rope.original_max_positions) == (
        params["rope_type"], params["rope_theta"], params["factor"],
        params["original_max_position_embeddings"])
    assert ours.tie_embeddings is hf.tie_word_embeddings is True
    assert ours.eos_token_ids == (361,)


def test_the_hub_keys_win_over_llamas_names_as_in_transformers():
    both = {**EXAONE_35_24B, "num_hidden_layers": 4, "rms_norm_eps": 1e-3, "hidden_act": "gelu"}
    ours = ModelConfig.from_hf(both)
    hf = transformers.ExaoneConfig.from_dict(both)
    assert (ours.num_layers, ours.norm_eps) == (hf.num_hidden_layers, hf.rms_norm_eps) == (
        30, 1e-5)
    assert ours.activation == hf.hidden_act == "silu"


def test_an_exaone_config_without_kv_heads_takes_the_config_classes_eight():
    raw = {k: v for k, v in EXAONE_35_24B.items() if k != "num_key_value_heads"}
    hf = transformers.ExaoneConfig.from_dict(raw)
    assert ModelConfig.from_hf(raw).num_kv_heads == hf.num_key_value_heads == 8


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_a_hub_config_json_exports_as_transformers_loads_it(tmp_path, flavor):
    """The fixture's config.json rewritten as the Hub writes it: the Hub's keys, a legacy
    rope_scaling beside rope_theta, and an epsilon of its own that must be read."""
    hf_dir = build_hf_model("exaone", tmp_path / "hf", rms_norm_eps=1e-2)
    path = hf_dir / "config.json"
    config = json.loads(path.read_text())
    for key, hub_key in HUB_KEYS.items():
        config[hub_key] = config.pop(key)
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    path.write_text(json.dumps(config))
    ids = prompt_ids(100)
    out = export_small(hf_dir, tmp_path / "b", flavor)
    np.testing.assert_allclose(last_logits(out, ids), reference_logits(hf_dir, ids)[-1],
                               rtol=1e-4, atol=1e-4)
