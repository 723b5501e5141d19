"""Sarvam-MoE (sarvam-30b): transformers builds GLM-4.5's model (Glm4MoeForCausalLM) from
its config and renames its remote code's tensors on load; export reads them renamed as
transformers does (FamilySpec.segment_renames). Its fixture (conftest.FAMILIES), which
transformers saves under those remote names, runs in the generic suites: test_exactness
compares every chunk's logits with transformers in both flavours, test_moe its matrix
(slow)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors import safe_open

from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from tests.test_moe import hf_moe_model_shapes

# sarvam-30b's shape as its remote code's config.json names things: num_experts,
# num_shared_experts, use_qkv_bias (SarvamMoEConfig's attribute_map)
SARVAM_30B = {"model_type": "sarvam_moe", "num_experts": 128, "num_shared_experts": 1,
              "use_qkv_bias": True, "num_experts_per_tok": 6, "moe_intermediate_size": 1024,
              "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "head_dim": 64,
              "num_hidden_layers": 19, "rope_theta": 8_000_000.0}


def test_the_remote_codes_keys_read_as_transformers_builds_the_model():
    ours = ModelConfig.from_hf(SARVAM_30B)
    moe = ours.moe
    assert moe is not None
    assert (moe.experts, moe.top_k, moe.width, list(moe.layers), moe.shared_width,
            moe.scaling, moe.norm_topk, moe.expert_bias, moe.groups,
            moe.top_groups) == hf_moe_model_shapes(SARVAM_30B)
    config = transformers.AutoConfig.for_model(**SARVAM_30B)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).model
    attn = model.layers[0].self_attn
    assert ours.qkv_bias == (attn.q_proj.bias is not None) is True
    assert (ours.head_dim, ours.num_kv_heads) == (attn.head_dim, config.num_key_value_heads)
    rotary = type(model.rotary_emb)(config)  # on the CPU: its inv_freq computed
    rope = ours.ropes[GLOBAL]
    assert rope.rotary_dim == 2 * len(rotary.inv_freq) == 64  # the whole head, not GLM's half
    torch.testing.assert_close(torch.tensor(rope.inv_freq(), dtype=torch.float32),
                               rotary.inv_freq, rtol=1e-6, atol=0)


def test_the_fixture_is_stored_under_the_remote_names_and_read_under_transformers(hf_model):
    """The exactness suite's sarvam_moe checkpoint exercises the renames: transformers
    saved it under the remote code's names, which read as its modules' names."""
    hf_dir = hf_model("sarvam_moe")
    with safe_open(str(hf_dir / "model.safetensors"), "np") as f:
        stored = set(f.keys())
    assert {"model.word_embeddings.weight", "model.layers.0.attention.query_key_value.weight",
            "model.layers.0.attention.dense.weight",
            "model.layers.1.mlp.gate.expert_bias"} <= stored
    spec = ModelConfig.from_dir(hf_dir).spec
    names = Checkpoint(hf_dir, spec.renames, spec.left_out,
                       segments=spec.segment_renames).names()
    assert {"model.embed_tokens.weight", "model.layers.0.self_attn.query_key_value.bias",
            "model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.q_norm.weight",
            "model.layers.0.self_attn.k_norm.weight",
            "model.layers.1.mlp.gate.e_score_correction_bias"} <= names
    assert not any(".attention." in name for name in names)
    assert len(names) == len(stored)  # no two stored names read as one


@pytest.mark.parametrize("key", ("num_experts", "num_shared_experts", "use_qkv_bias"))
def test_a_remote_key_wins_over_its_transformers_name_as_in_transformers(key):
    """config.json with both names: the remote one wins, as in transformers (in either
    order: its attribute map sets the remote key's value)."""
    other = {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
             "use_qkv_bias": "attention_bias"}[key]
    raw = {**SARVAM_30B, other: {"num_experts": 64, "num_shared_experts": 2,
                                 "use_qkv_bias": False}[key]}
    config = transformers.AutoConfig.for_model(**json.loads(json.dumps(raw)))
    ours = ModelConfig.from_hf(raw)
    assert ours.moe is not None
    got = {"num_experts": ours.moe.experts,
           "num_shared_experts": ours.moe.shared_width // 1024,
           "use_qkv_bias": ours.qkv_bias}[key]
    assert got == getattr(config, other)
