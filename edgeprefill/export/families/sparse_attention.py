"""Families with DeepSeek Sparse Attention (export/sparse_index.py): DeepSeek-V3's latent
attention with a lightning indexer choosing each query's keys. DeepSeek-V3.2, GLM-5,
A.X K2, Hy4 (hyper-connections, export/hyper_connections.py), and Hy4-VL's language model
(registered as its image-text checkpoint's: families/image_text.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import sparse_mlp_layers
from edgeprefill.export.families.latent import DEEPSEEK_V3, MLA_QUIRKS
from edgeprefill.export.families.moe_sigmoid import (
    DEEPSEEK_MOE,
    DEEPSEEK_MOE_DEFAULTS,
    shared_experts,
)
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



def _hy_v4_config(raw: dict[str, Any]) -> dict[str, Any]:
    """HYV4Config: where absent, experts on every layer but the first (mlp_layer_types)
    and a full indexer on the first layer and every fourth after the second
    (indexer_types); shared experts as DeepSeek-V3's."""
    layers = int(raw["num_hidden_layers"])
    if raw.get("mlp_layer_types") is None:
        raw = {**raw, "mlp_layer_types": ["dense"] * min(1, layers)
               + ["sparse"] * max(layers - 1, 0)}
    if raw.get("indexer_types") is None:
        raw = {**raw, "indexer_types": ["full" if i == 0 or (i - 1) % 4 == 0 else "shared"
                                        for i in range(layers)]}
    return _dsa_config(raw)


def _hy_v4_refused(raw: dict[str, Any]) -> str | None:
    # HYV4Attention always projects the query through q_a_proj (its indexer reads q_resid),
    # and its rotary covers exactly qk_rope_head_dim.
    if raw.get("q_lora_rank") is None:
        return "q_lora_rank null (one dense query projection) is not supported"
    return _dsa_refused(raw)


# Hy4 (hy_v4, Tencent's Hy4-preview): DeepSeek-V3.2's latent attention and indexer, rotary
# on halves (the indexer's on the last qk_rope_head_dim dims of its heads, its key norm at
# rms_norm_eps), GLM-5's shared indexer layers, a sink logit per head in the softmax and
# the values gated per channel (sigmoid of gate_proj of the layer's input); DeepSeek-V3's
# experts on the layers mlp_layer_types marks "sparse", their SwiGLU's gate and up clamped
# at swiglu_limit (export/swiglu_clamps.py, "before"); and hyper-connections: hc_mult
# residual streams that each sublayer reads a mix of and writes back into
# (export/hyper_connections.py). Its multi-token-prediction layers (model.mtp_layers.) are
# left out, as transformers ignores them.
HY_V4 = replace(
    DEEPSEEK_V32, block="hyper", rope_interleaved=False, sparse_index="last_halves",
    sinks=True, latent_channel_gate=True, swiglu_clamps="before", legacy=_hy_v4_config,
    refuse=_hy_v4_refused, left_out=("model.mtp_layers.",),
    moe=replace(DEEPSEEK_MOE, layers=sparse_mlp_layers),
    # the Hub's names (and transformers' on save) read as its conversion mapping renames
    # them on load
    segment_renames=((".hc_pre.hc_", ".hc_"), (".learnable_sink_param", ".sinks"),
                     (".linear_gate.", ".gate_proj."),
                     (".hc_attn_layer.hc_fn", ".attn_hc.fn"),
                     (".hc_attn_layer.hc_base", ".attn_hc.base"),
                     (".hc_attn_layer.hc_scale", ".attn_hc.scale"),
                     (".hc_mlp_layer.hc_fn", ".ffn_hc.fn"),
                     (".hc_mlp_layer.hc_base", ".ffn_hc.base"),
                     (".hc_mlp_layer.hc_scale", ".ffn_hc.scale"),
                     (".hc_head_fn", ".hc_fn"), (".hc_head_base", ".hc_base"),
                     (".hc_head_scale", ".hc_scale")),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "vocab_size": 120832, "hidden_size": 2816,
              "intermediate_size": 6912, "moe_intermediate_size": 768,
              "num_hidden_layers": 34, "num_attention_heads": 32,
              "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
              "n_routed_experts": 256, "num_experts_per_tok": 8,
              "routed_scaling_factor": 2.827, "q_lora_rank": 1536, "kv_lora_rank": 512,
              "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
              "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 16, "hc_mult": 4,
              "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0},
    quirks=(*MLA_QUIRKS, "a sink logit per head", "a sigmoid gate per attention value "
            "channel", "routed experts' SwiGLU clamped (swiglu_limit)",
            "hyper-connections (hc_mult residual streams)"),
)

# Hy4-VL's language model (hy_v4_vl_text; exported as hy_v4_vl: families/image_text.py):
# Hy4 with two differences. Its rotary (HYV4VLRotaryEmbedding, Qwen3-VL's 3-D one) turns
# interleaved pairs, the attention's and the indexer's (on its last dims) alike: its
# mrope_section splits the frequencies among time, height and width positions, which are
# one position on text, so on text it is the plain rotary on interleaved pairs. And its
# latent norms (q_a_layernorm, kv_a_layernorm) are at rms_norm_eps, where Hy4's keep 1e-6.
HY_V4_VL_TEXT = replace(
    HY_V4, rope_interleaved=True, sparse_index="last_interleaved", latent_norms_at_eps=True,
    defaults={**HY_V4.defaults, "hidden_size": 6144, "intermediate_size": 18432,
              "moe_intermediate_size": 2048, "num_hidden_layers": 78,
              "num_attention_heads": 64, "q_lora_rank": 2048, "index_n_heads": 32},
    quirks=(*HY_V4.quirks, "interleaved rotary"),
)

FAMILIES = {"deepseek_v32": DEEPSEEK_V32, "glm_moe_dsa": GLM_MOE_DSA, "axk2": AXK2,
            "hy_v4": HY_V4}
