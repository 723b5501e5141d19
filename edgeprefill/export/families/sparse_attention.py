"""Families with DeepSeek Sparse Attention (export/sparse_index.py): DeepSeek-V3's latent
attention with a lightning indexer choosing each query's keys. DeepSeek-V3.2, GLM-5,
A.X K2.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import sparse_mlp_layers
from edgeprefill.export.families.latent import DEEPSEEK_V3, MLA_QUIRKS
from edgeprefill.export.families.moe_sigmoid import DEEPSEEK_MOE, shared_experts
from edgeprefill.export.rope import rope_params
from edgeprefill.export.sparse_index import glm_indexer_types


def _dsa_refused(raw: dict[str, Any]) -> str | None:
    # AXK1Attention (which DSA's attention extends) always has q_a_proj, and its rotary
    # covers exactly qk_rope_head_dim; it rotates interleaved pairs whatever
    # rope_interleave says (DeepseekV32Config drops the key).
    if raw.get("q_lora_rank") is None and "q_lora_rank" in raw:
        return "q_lora_rank null (one dense query projection) is not supported"
    factor = rope_params(raw).get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    if factor is not None and float(factor) != 1.0:
        return "partial_rotary_factor other than 1 is not supported"
    return None


def _dsa_config(raw: dict[str, Any]) -> dict[str, Any]:
    """DeepseekV32Config: layer_types all "indexed_attention" (what it derives: every layer
    DSA's) read as the layers themselves; shared experts as DeepSeek-V3's."""
    kinds = raw.get("layer_types")
    if kinds is not None and set(kinds) <= {"indexed_attention"}:
        raw = {k: v for k, v in raw.items() if k != "layer_types"}
    return shared_experts("n_shared_experts")(raw)


# DeepSeek-V3.2(-Exp): DeepSeek-V3 with DSA on every layer, experts where mlp_layer_types
# says "sparse" (by default after first_k_dense_replace dense layers); its indexer rotates
# halves. The multi-token-prediction layer is left out.
DEEPSEEK_V32 = replace(
    DEEPSEEK_V3, sparse_index="halves", refuse=_dsa_refused, legacy=_dsa_config,
    moe=replace(DEEPSEEK_MOE, layers=sparse_mlp_layers),
    defaults={**DEEPSEEK_V3.defaults, "max_position_embeddings": 163840, "index_topk": 2048,
              "index_head_dim": 128, "index_n_heads": 64},
    quirks=(*MLA_QUIRKS, "interleaved rotary"),  # the indexer's: model_quirks
)


def _glm_moe_dsa_config(raw: dict[str, Any]) -> dict[str, Any]:
    """GlmMoeDsaConfig: indexer_types from its pattern keys (sparse_index.glm_indexer_types)."""
    return _dsa_config(glm_indexer_types(raw))


# GLM-5 (glm_moe_dsa): DeepSeek-V3.2 under GLM-5's defaults, its indexer rotating
# interleaved pairs, and "shared" layers (indexer_types) that reuse the previous full
# layer's selection (they cache zeros in the index key's columns).
GLM_MOE_DSA = replace(
    DEEPSEEK_V32, sparse_index="interleaved", legacy=_glm_moe_dsa_config,
    defaults={**DEEPSEEK_V32.defaults, "vocab_size": 154880, "hidden_size": 6144,
              "intermediate_size": 12288, "num_hidden_layers": 78,
              "num_attention_heads": 64, "q_lora_rank": 2048, "v_head_dim": 256,
              "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
              "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "index_n_heads": 32},
)



def _axk2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """AXK2Config: mlp_layer_types "sparse" from first_k_dense_replace (1) on every
    moe_layer_freq-th layer where absent; no groups (n_group null) routes as one group."""
    if raw.get("mlp_layer_types") is None:
        first = int(raw.get("first_k_dense_replace", 1))
        freq = int(raw.get("moe_layer_freq", 1))
        raw = {**raw, "mlp_layer_types": [
            "sparse" if i >= first and i % freq == 0 else "dense"
            for i in range(int(raw["num_hidden_layers"]))]}
    if raw.get("n_group") is None and raw.get("topk_group") is None:
        raw = {**raw, "n_group": 1, "topk_group": 1}
    return _dsa_config(raw)


def _axk2_refused(raw: dict[str, Any]) -> str | None:
    if (raw.get("n_group") is None) != (raw.get("topk_group") is None):
        return "n_group and topk_group must be given together"
    return _dsa_refused(raw)


# A.X K2 (axk2): DeepSeek-V3.2 with gated RMSNorms (each input norm, and the norm before
# the experts, times sigmoid of a rank-gated_norm_rank MLP of its output), its query fused
# with a gate per value channel (q_gate_proj of [q_resid | q_a_proj's output]), and
# DeepSeek-V3's experts without groups by default.
AXK2 = replace(
    DEEPSEEK_V32, legacy=_axk2_config, refuse=_axk2_refused, gated_norms=True,
    latent_query_gate=True,
    # the Hub's names (and transformers' on save) read as transformers renames them on load
    segment_renames=((".W_down.", ".mlp.fc1."), (".W_up.", ".mlp.fc2."),
                     (".self_attn.q_b_proj.", ".self_attn.q_gate_proj.")),
    defaults={**DEEPSEEK_V32.defaults, "vocab_size": 163840, "hidden_size": 2048,
              "intermediate_size": 5120, "moe_intermediate_size": 512,
              "num_hidden_layers": 48, "num_attention_heads": 32, "n_routed_experts": 128,
              "kv_lora_rank": 128, "q_lora_rank": 384, "qk_rope_head_dim": 32,
              "v_head_dim": 64, "qk_nope_head_dim": 64, "num_experts_per_tok": 8,
              "max_position_embeddings": 131072, "index_n_heads": 16,
              "first_k_dense_replace": 1, "n_group": None, "topk_group": None},
    quirks=(*MLA_QUIRKS, "interleaved rotary", "gated RMSNorms (a low-rank sigmoid gate)",
            "a sigmoid gate per attention value channel"),
)

FAMILIES = {"deepseek_v32": DEEPSEEK_V32, "glm_moe_dsa": GLM_MOE_DSA, "axk2": AXK2}
