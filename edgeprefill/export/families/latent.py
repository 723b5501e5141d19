"""Families with DeepSeek's multi-head latent attention (export/latent_attention.py):
MiniCPM3, Youtu, DeepSeek-V2/V3, Sarvam, GLM-4.7-Flash, A.X K1.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from edgeprefill.export.config_values import given
from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    sparse_mlp_layers,
)
from edgeprefill.export.families.dense import ATTENTION_BIAS
from edgeprefill.export.families.moe_sigmoid import (
    DEEPSEEK_MOE,
    DEEPSEEK_MOE_DEFAULTS,
    shared_experts,
)
from edgeprefill.export.families.spec import FamilySpec
from edgeprefill.export.rope import rope_params


def _minicpm3_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM3Config: v_head_dim hidden / heads unless given; its scale_emb, residual
    scale_depth / sqrt(layers) (sqrt(layers) where null: none) and logits divisor
    hidden / dim_model_base (hidden where null) are Granite's embedding and residual
    multipliers and logits scaling."""
    layers, hidden = int(raw["num_hidden_layers"]), int(raw["hidden_size"])
    depth = raw.get("scale_depth")
    depth = math.sqrt(layers) if depth is None else float(depth)
    return {**raw, "v_head_dim": raw.get("v_head_dim") or hidden // int(
                raw["num_attention_heads"]),
            "embedding_multiplier": float(raw["scale_emb"]),
            "residual_multiplier": depth / math.sqrt(layers),
            "logits_scaling": hidden / float(raw.get("dim_model_base") or hidden)}


def _rope_halves_refused(raw: dict[str, Any]) -> str | None:
    # DeepseekV3Attention rotates halves (apply_rotary_pos_emb) with rope_interleave false;
    # the family's flavours rotate interleaved pairs.
    if raw.get("rope_interleave") is False:
        return "rope_interleave=false (rotary on halves) is not supported"
    return None


# Whether the cached key part is rotated is the config's (Kimi Linear's rotates nothing):
# model_quirks' KV cache line says which.
MLA_QUIRKS = ("multi-head latent attention (one cached KV head: the key part the heads "
              "share and the normed latent)",)
# MiniCPM3 (MiniCPM3-4B): Llama layers with DeepSeek-V2's latent attention (rotary on
# halves), MiniCPM's scaled embeddings, residual branches and logits; tied.
MINICPM3 = FamilySpec(
    **ATTENTION_BIAS, latent=True, tie_default=True, embed_scale="multiplier",
    legacy=_minicpm3_config, unsupported=("mlp_bias",),
    defaults={"vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400,
              "num_hidden_layers": 62, "num_attention_heads": 40,
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "kv_lora_rank": 256,
              "q_lora_rank": 768, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
              "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256},
    quirks=(*MLA_QUIRKS, "embedding, residual and logits scaling"),
)
# Youtu-LLM: Llama layers (Qwen3's MLP) with DeepSeek-V3's latent attention, rotary on
# interleaved pairs; tied.
YOUTU = FamilySpec(
    **ATTENTION_BIAS, latent=True, tie_default=True, rope_interleaved=True,
    refuse=_rope_halves_refused,
    defaults={"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144,
              "num_hidden_layers": 32, "num_attention_heads": 16,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "kv_lora_rank": 512,
              "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
              "v_head_dim": 128},
    quirks=(*MLA_QUIRKS, "interleaved rotary"),
)


def _deepseek_v2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """DeepseekV2Config: its shared experts one ungated MLP of moe_intermediate_size x
    n_shared_experts; topk_method greedy is group-limited routing over one group."""
    shared = int(raw.get("n_shared_experts") or 0) * int(raw["moe_intermediate_size"])
    raw = {**raw, "shared_expert_intermediate_size": shared}
    if raw.get("topk_method") == "greedy":
        raw = {**raw, "n_group": 1, "topk_group": 1}
    return raw


def _deepseek_v2_unsupported(raw: dict[str, Any]) -> str | None:
    method = raw.get("topk_method")
    if method not in ("greedy", "group_limited_greedy"):
        return (f"topk_method {method!r} is not supported; supported: greedy, "
                "group_limited_greedy")
    if method == "group_limited_greedy" and (raw.get("n_group") is None
                                             or raw.get("topk_group") is None):
        return "topk_method group_limited_greedy needs n_group and topk_group"
    return None


# DeepSeek-V2 (V2-Lite, V2, V2.5): latent attention with DeepSeek's complex rotary (on
# interleaved pairs), dense MLPs on the first `first_k_dense_replace` layers, then routed
# experts (softmax, the top k within the best groups, times routed_scaling_factor; the
# router ignores norm_topk_prob) beside ungated shared experts.
DEEPSEEK_V2 = FamilySpec(
    **ATTENTION_BIAS, latent=True, rope_interleaved=True, legacy=_deepseek_v2_config,
    refuse=_deepseek_v2_unsupported, unsupported=("mlp_bias",),
    required=("num_experts_per_tok",),
    moe=MoeSpec(names=MoeNames(shared="mlp.shared_experts."),
                routing="softmax_group_limited", grouped=True,
                experts_keys=("n_routed_experts", "num_experts"), norm_key=None,
                layers=lambda raw: tuple(range(int(raw.get("first_k_dense_replace") or 0),
                                               int(raw["num_hidden_layers"])))),
    defaults={"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 2048, "kv_lora_rank": 512, "q_lora_rank": 1536,
              "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
              "n_routed_experts": 64, "n_shared_experts": 2, "moe_intermediate_size": 1407,
              "routed_scaling_factor": 1.0, "topk_method": "greedy"},
    quirks=(*MLA_QUIRKS, "interleaved rotary"),
)
# DeepSeek-V3 (V3, R1, Moonlight, Kimi-K2): DeepSeek-V2's latent attention (rotary on
# interleaved pairs, yarn's mscale_all_dim in the softmax scale) with DeepSeek-V3's experts
# (DEEPSEEK_MOE: noaux_tc after first_k_dense_replace dense layers). Its
# multi-token-prediction layers (model.layers.{num_hidden_layers}..., num_nextn_predict_layers
# of them) are not the causal LM's: transformers ignores them, export leaves them out.
DEEPSEEK_V3 = FamilySpec(
    **ATTENTION_BIAS, latent=True, rope_interleaved=True, refuse=_rope_halves_refused,
    legacy=shared_experts("n_shared_experts"), moe=DEEPSEEK_MOE,
    defaults={**DEEPSEEK_MOE_DEFAULTS, "vocab_size": 129280, "hidden_size": 7168,
              "intermediate_size": 18432, "moe_intermediate_size": 2048,
              "num_hidden_layers": 61, "num_attention_heads": 128, "n_routed_experts": 256,
              "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
              "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
              "first_k_dense_replace": 3, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "num_nextn_predict_layers": 1},
    quirks=(*MLA_QUIRKS, "interleaved rotary"),
)


def _mistral4_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Mistral4Config: without rope parameters, its own yarn (Llama 4's beta 0.1, rotary on
    the qk_rope_head_dim of each head); shared experts as DeepSeek-V3's."""
    if raw.get("rope_parameters") is None and raw.get("rope_scaling") is None:
        rope = int(raw.get("qk_rope_head_dim", 64))
        head = rope + int(raw.get("qk_nope_head_dim", 64))
        raw = {**raw, "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
            "original_max_position_embeddings": 8192,
            "max_position_embeddings": raw.get("max_position_embeddings", 1048576),
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
            "llama_4_scaling_beta": 0.1, "partial_rotary_factor": rope / head}}
    return shared_experts("n_shared_experts")(raw)


def _mistral4_unsupported(raw: dict[str, Any]) -> str | None:
    # Mistral4RotaryEmbedding rotates head_dim (a saved one, else nope + rope) x
    # partial_rotary_factor dims, which its attention applies only where that is
    # qk_rope_head_dim.
    params = rope_params(raw)
    rope, nope = int(raw.get("qk_rope_head_dim", 64)), int(raw.get("qk_nope_head_dim", 64))
    head = int(raw.get("head_dim") or rope + nope)
    factor = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if int(head * float(factor)) != rope:
        return (f"head_dim {head} x partial_rotary_factor {factor} must be qk_rope_head_dim "
                f"({rope}), the dims the attention rotates")
    return _rope_halves_refused(raw)


# Mistral Small 4: DeepSeek-V3's latent attention and experts, its router a softmax (groups
# by their top 2, no selection bias; softmax_bias without one), and Llama 4's query factor
# by position (Ministral 3's, on the whole query: a scalar, so as before rotary).
MISTRAL4 = replace(
    DEEPSEEK_V3, refuse=_mistral4_unsupported, legacy=_mistral4_config, query_scale=True,
    moe=replace(DEEPSEEK_MOE, routing="softmax_bias",
                names=replace(DEEPSEEK_MOE.names, expert_bias=())),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "vocab_size": 131072, "hidden_size": 4096,
              "intermediate_size": 12288, "moe_intermediate_size": 2048,
              "num_hidden_layers": 36, "num_attention_heads": 32, "n_routed_experts": 128,
              "kv_lora_rank": 256, "q_lora_rank": 1024, "qk_rope_head_dim": 64,
              "v_head_dim": 128, "qk_nope_head_dim": 64, "num_experts_per_tok": 4,
              "first_k_dense_replace": 0, "max_position_embeddings": 1048576,
              "rms_norm_eps": 1e-6},
    quirks=(*MLA_QUIRKS, "interleaved rotary", "softmax router over groups (top 2 each)",
            "query x (1 + beta log(1 + floor(position / original window))), Llama 4's"),
)


def _sarvam_mla_config(raw: dict[str, Any]) -> dict[str, Any]:
    """SarvamMLAConfig: DeepseekV3Config read from the remote code's keys too (num_experts,
    num_shared_experts; a `deepseek_yarn` rope_scaling is yarn)."""
    for old, new in (("num_experts", "n_routed_experts"),
                     ("num_shared_experts", "n_shared_experts")):
        if old in raw:
            raw = {**raw, new: raw[old]}
    scaling = raw.get("rope_scaling") or {}
    if "deepseek_yarn" in (scaling.get("type"), scaling.get("rope_type")):
        raw = {k: v for k, v in raw.items() if k != "rope_scaling"}
        raw["rope_parameters"] = {**{k: v for k, v in scaling.items() if k != "type"},
                                  "rope_type": "yarn"}
    return shared_experts("n_shared_experts")(raw)


# Sarvam (sarvam-105b): DeepSeek-V3 under its own defaults (a dense query, one group).
SARVAM_MLA = replace(
    DEEPSEEK_V3, legacy=_sarvam_mla_config,
    defaults={**DEEPSEEK_V3.defaults, "vocab_size": 262144, "hidden_size": 4096,
              "intermediate_size": 16384, "num_hidden_layers": 32,
              "num_attention_heads": 64, "n_routed_experts": 128, "q_lora_rank": None,
              "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
              "num_nextn_predict_layers": 0},
)


def _glm4_moe_lite_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Glm4MoeLiteConfig: experts where mlp_layer_types says "sparse", by default on every
    layer but the first (first_k_dense_replace, which Hub configs carry, is ignored)."""
    if raw.get("mlp_layer_types") is None:
        layers = int(raw["num_hidden_layers"])
        raw = {**raw, "mlp_layer_types": ["dense"] + ["sparse"] * (layers - 1)}
    return shared_experts("n_shared_experts")(raw)


def _glm4_moe_lite_unsupported(raw: dict[str, Any]) -> str | None:
    # Glm4MoeLiteRotaryEmbedding would rotate fewer dims than qk_rope_head_dim, which its
    # attention cannot apply.
    # (transformers folds a top-level partial_rotary_factor into the rope parameters)
    factor = rope_params(raw).get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    if factor is not None and float(factor) != 1.0:
        return "partial_rotary_factor other than 1 is not supported"
    return _rope_halves_refused(raw)


# GLM-4.7-Flash: DeepSeek-V3's latent attention and GLM-4.5's experts (DeepSeek-V3's) on
# the layers mlp_layer_types marks "sparse". Its multi-token-prediction layer is left out.
GLM4_MOE_LITE = replace(
    DEEPSEEK_V3, legacy=_glm4_moe_lite_config, refuse=_glm4_moe_lite_unsupported,
    moe=replace(DEEPSEEK_MOE, layers=sparse_mlp_layers),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "vocab_size": 154880, "hidden_size": 2048,
              "intermediate_size": 10240, "moe_intermediate_size": 1536,
              "num_hidden_layers": 47, "num_attention_heads": 20, "n_routed_experts": 64,
              "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768,
              "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192,
              "num_experts_per_tok": 4, "max_position_embeddings": 202752,
              "rms_norm_eps": 1e-5, "num_nextn_predict_layers": 1},
)

def _axk1_config(raw: dict[str, Any]) -> dict[str, Any]:
    """AXK1Config: experts where mlp_layer_types says "sparse", by default on the layers
    from first_k_dense_replace (1) that are multiples of moe_layer_freq (1), keys it reads
    only to derive the types."""
    if raw.get("mlp_layer_types") is None:
        first = int(given(raw.get("first_k_dense_replace"), 1))
        freq = int(given(raw.get("moe_layer_freq"), 1))
        raw = {**raw, "mlp_layer_types": [
            "sparse" if i >= first and i % freq == 0 else "dense"
            for i in range(int(raw["num_hidden_layers"]))]}
    return shared_experts("n_shared_experts")(raw)


def _axk1_unsupported(raw: dict[str, Any]) -> str | None:
    # AXK1Attention always projects the query through q_a_proj and q_b_proj.
    if raw.get("q_lora_rank", 1) is None:
        return "q_lora_rank null (a dense query) is not supported: A.X K1's is low-rank"
    return _rope_halves_refused(raw)


# A.X K1 (SK Telecom): DeepSeek-V3's latent attention (always a low-rank query) and
# experts on the layers mlp_layer_types marks "sparse", each expert block's output (routed
# + shared) RMS-normed by post_mlp_layernorm before the residual add; the dense layers'
# copies of that norm, which its Hub checkpoints also store, go unused. Its Hub checkpoints
# route without a selection bias (transformers' stays zero).
AXK1 = replace(
    DEEPSEEK_V3, legacy=_axk1_config, refuse=_axk1_unsupported,
    moe=replace(DEEPSEEK_MOE, layers=sparse_mlp_layers, names=replace(
        DEEPSEEK_MOE.names, expert_bias_optional=True,
        output_norm=("post_mlp_layernorm", "mlp.post_mlp_layernorm"))),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "vocab_size": 163840, "hidden_size": 7168,
              "intermediate_size": 18432, "moe_intermediate_size": 2048,
              "num_hidden_layers": 61, "num_attention_heads": 64, "n_routed_experts": 192,
              "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
              "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-6},
    quirks=(*MLA_QUIRKS, "interleaved rotary", "an RMSNorm after each expert block"),
)

FAMILIES: dict[str, FamilySpec] = {
    "minicpm3": MINICPM3,
    "deepseek_v2": DEEPSEEK_V2,
    "deepseek_v3": DEEPSEEK_V3,
    "mistral4": MISTRAL4,
    "sarvam_mla": SARVAM_MLA,
    "glm4_moe_lite": GLM4_MOE_LITE,
    "youtu": YOUTU,
    "axk1": AXK1,
}
