"""Families whose MLPs are routed experts (export/experts.py, export/moe.py) chosen by a
softmax over all the router's logits, then the top k: the Qwen MoEs, Mellum, Mixtral,
OLMoE and FlexOlmo, Hunyuan-A13B, DBRX; ERNIE-4.5-MoE's bias only chooses among the
softmax's, PhiMoE's sparsemixer takes two by masked softmaxes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.context_cap import (
    longrope_window,
    longrope_window_cap,
)
from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    interval_layers,
    mlp_layer_types_sparse,
    sparse_layers,
)
from edgeprefill.export.families.dense import (
    ATTENTION_BIAS,
    HUNYUAN_V1_DENSE,
    OLMO2,
    hunyuan_ntk_alpha,
)
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec

# Qwen's shared expert, its output gated by sigmoid(shared_expert_gate(x)) (Qwen2-MoE,
# Qwen3.5-MoE, Qwen3-Next).
QWEN_SHARED_EXPERT = MoeNames(shared="mlp.shared_expert.",
                              shared_gate="mlp.shared_expert_gate.weight")


def _qwen2_moe_window(i: int, raw: dict[str, Any]) -> bool:
    """Qwen2MoeConfig without layer_types: the even layers below max_window_layers slide."""
    return bool((i + 1) % 2) and i < int(raw.get("max_window_layers", 28))


# Qwen3-MoE's and OLMoE's configs alias num_experts to num_local_experts, which wins.
EXPERT_ALIASES = ("num_local_experts", "num_experts")


QWEN_MOE_DEFAULTS = {"decoder_sparse_step": 1, "norm_topk_prob": False,
                     "max_position_embeddings": 32768, "sliding_window": 4096}


# Qwen3-MoE: Qwen3 (per-head q/k norms) whose MLPs are routed experts, softmax then top-k.
QWEN3_MOE = FamilySpec(
    **ATTENTION_BIAS, qk_norm="head", window="opt_in",
    moe=MoeSpec(experts_keys=EXPERT_ALIASES, layers=sparse_layers),
    defaults={**QWEN_MOE_DEFAULTS, "num_experts": 128, "num_experts_per_tok": 8,
              "moe_intermediate_size": 768},
    quirks=("per-head q/k RMSNorm",),
)


# Mellum: Qwen3-MoE's layers, sliding on its `sliding_attention` ones (all full without
# `layer_types`), a rope per layer type (500,000 and 10,000 by default), experts on the
# `sparse` layers of `mlp_layer_types` (all without it), a dense MLP on the `dense` ones.
MELLUM_ROPES = {"full_attention": {"rope_type": "default", "rope_theta": 500_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}


def _mellum_config(raw: dict[str, Any]) -> dict[str, Any]:
    count = int(raw["num_hidden_layers"])
    return {**raw, "layer_types": raw.get("layer_types") or ["full_attention"] * count,
            "rope_parameters": raw.get("rope_parameters") or MELLUM_ROPES}


def _per_type_partial_rotary(raw: dict[str, Any]) -> str | None:
    # Laguna's rotary reads a partial_rotary_factor per layer type; export's is one.
    for kind, params in (raw.get("rope_parameters") or {}).items():
        factor = params.get("partial_rotary_factor", 1.0) if isinstance(params, dict) else 1.0
        if factor != 1.0:
            return (f"a partial_rotary_factor per layer type ({kind}: {factor}) is not "
                    "supported; export rotates whole heads")
    return None


MELLUM = replace(
    QWEN3_MOE, window="always", sliding=lambda i, raw: False, legacy=_mellum_config,
    refuse=_per_type_partial_rotary, left_out=("mtp.",),
    moe=MoeSpec(experts_keys=EXPERT_ALIASES, layers=mlp_layer_types_sparse),
    defaults={"vocab_size": 98_304, "hidden_size": 2304, "intermediate_size": 7168,
              "num_hidden_layers": 28, "num_attention_heads": 32, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 131_072, "sliding_window": 1024,
              "num_local_experts": 64, "num_experts_per_tok": 8,
              "moe_intermediate_size": 896, "norm_topk_prob": True, "rms_norm_eps": 1e-6},
    quirks=("per-head q/k RMSNorm", "a rope per layer type",
            "dense and sparse layers (mlp_layer_types)"),
)


# Qwen1.5/2-MoE: Qwen2 (q/k/v biases) with routed experts beside a shared expert whose
# output is gated by sigmoid(shared_expert_gate(x)).
QWEN2_MOE = FamilySpec(
    bias_key="qkv_bias", qkv_bias=True, window="opt_in", sliding=_qwen2_moe_window,
    moe=MoeSpec(names=QWEN_SHARED_EXPERT, layers=sparse_layers),
    defaults={**QWEN_MOE_DEFAULTS, "num_experts": 60, "num_experts_per_tok": 4,
              "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "max_window_layers": 28, "num_key_value_heads": 16},
    quirks=("q/k/v biases",),
)


# Mixtral: Mistral (a window on every layer where the config sets one) whose MLPs are 8
# experts, softmax then top 2, always renormalized; the Hub's experts are w1 (gate), w3
# (up) and w2 (down) under block_sparse_moe, transformers 5's modules' under mlp.
MIXTRAL = FamilySpec(
    window="always",
    moe=MoeSpec(names=MoeNames(router=("block_sparse_moe.gate.weight", "mlp.gate.weight"),
                               expert="block_sparse_moe.experts.{j}.", gate="w1", up="w3",
                               down="w2"),
                experts_keys=EXPERT_ALIASES, width_key="intermediate_size", norm_key=None,
                renormalize=True),
    defaults={"max_position_embeddings": 131072, "rope_theta": 1_000_000.0,
              "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "num_local_experts": 8,
              "num_experts_per_tok": 2},
)


def _ernie4_5_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Ernie4_5_MoeConfig: moe_k and moe_num_experts, aliased num_experts_per_tok and
    num_experts (the moe_ names win; 6 and 64 where neither is given); its shared experts
    are one MLP moe_num_shared_experts x moe_intermediate_size wide."""
    def first(keys: tuple[str, str], default: int) -> Any:
        return next((raw[k] for k in keys if k in raw), default)

    shared = int(raw["moe_num_shared_experts"] or 0) * int(raw["moe_intermediate_size"])
    return {**raw, "num_experts_per_tok": first(("moe_k", "num_experts_per_tok"), 6),
            "num_experts": first(("moe_num_experts", "num_experts"), 64),
            "shared_expert_intermediate_size": shared}


# ERNIE-4.5-MoE (ERNIE-4.5-21B-A3B): ERNIE 4.5 (interleaved rotary) with experts on every
# moe_layer_interval-th layer from moe_layer_start_index: softmax, the top k of softmax +
# e_score_correction_bias (which chooses, never weighs), divided by max(sum, moe_norm_min);
# an ungated shared MLP beside them.
ERNIE4_5_MOE = FamilySpec(
    rope_interleaved=True, tie_default=True, unsupported=("use_bias",),
    legacy=_ernie4_5_moe_config,
    moe=MoeSpec(names=MoeNames(expert_bias=("mlp.moe_statics.e_score_correction_bias",
                                            "mlp.gate.moe_statics.e_score_correction_bias"),
                               shared="mlp.shared_experts."),
                routing="softmax_bias", layers=interval_layers, norm_key=None,
                renormalize=True, norm_min_key="moe_norm_min", bias_key=None),
    defaults={"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
              "num_key_value_heads": 4, "moe_intermediate_size": 1536,
              "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
              "moe_layer_end_index": -1, "moe_layer_interval": 1, "moe_norm_min": 1e-12},
    quirks=("interleaved rotary",),
)


# OLMoE: OLMo's q/k RMSNorm over the whole projection in a pre-norm block, 64 experts.
OLMOE = FamilySpec(
    **ATTENTION_BIAS, qk_norm="full", unsupported=("clip_qkv",),
    moe=MoeSpec(experts_keys=EXPERT_ALIASES, width_key="intermediate_size"),
    defaults={"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "num_experts": 64,
              "num_experts_per_tok": 8, "norm_topk_prob": False},
    quirks=("q/k RMSNorm over the whole projection",),
)


def _phimoe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """PhimoeConfig as its model computes it: sparsemixer always chooses 2 experts. Its
    longrope turns by the short factors, cos and sin times short_mscale while a forward
    call's positions stay within original_max_position_embeddings and times long_mscale
    past it (the keys cached by earlier calls keeping theirs), which a bundle cannot
    follow: read as the short factors times short_mscale, the context capped at the
    window (longrope_window_cap)."""
    raw = {**raw, "num_experts_per_tok": 2}
    key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    params = raw.get(key) or {}
    if params.get("rope_type", params.get("type")) != "longrope":
        return raw
    longrope_window(raw, params)  # a KeyError names the missing key
    return {**raw, key: {**params, "attention_factor": float(params["short_mscale"])}}


# PhiMoE (Phi-3.5-MoE): Mixtral's layout with LayerNorms (with biases), q/k/v/o biases by
# attention_bias and an LM head bias by lm_head_bias; sparsemixer routing (experts.py) of
# the Hub's block_sparse_moe (w1, w3, w2), or transformers 5's fused mlp.experts.
PHIMOE = FamilySpec(
    norm="layer", **ATTENTION_BIAS, lm_head_bias_key="lm_head_bias", window="always",
    legacy=_phimoe_config, context_cap=longrope_window_cap,
    moe=MoeSpec(names=MoeNames(router=("block_sparse_moe.gate.weight", "mlp.router.weight"),
                               expert="block_sparse_moe.experts.{j}.", gate="w1", up="w3",
                               down="w2"),
                routing="sparsemixer", experts_keys=("num_local_experts",),
                width_key="intermediate_size", norm_key=None, scaling_key=None,
                jitter_key="router_jitter_noise"),
    defaults={"vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 6400,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 1_000_000.0, "num_local_experts": 16,
              "router_jitter_noise": 0.01},
    quirks=("LayerNorm with biases", "sparsemixer routing (top 2)",
            "longrope read as its short factors and short_mscale"),
)


def _hunyuan_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """HunYuanMoEV1Config: moe_topk (aliased num_experts_per_tok) may be a list per layer,
    one value throughout read as that value; its shared MLP is intermediate_size wide."""
    raw = hunyuan_ntk_alpha(raw)
    top_k = raw.get("moe_topk", raw.get("num_experts_per_tok", 1))
    if isinstance(top_k, list) and len(set(top_k)) == 1:
        top_k = top_k[0]
    return {**raw, "num_experts_per_tok": top_k,
            "shared_expert_intermediate_size": raw["intermediate_size"]}


def _hunyuan_moe_lists(raw: dict[str, Any]) -> str | None:
    for key in ("num_experts_per_tok", "num_experts"):
        if isinstance(raw.get(key), list):
            return f"{key} per layer ({raw[key]}) is not supported; export takes one value"
    return None


# Hunyuan-A13B (HunYuanMoEV1): HunYuan's dense attention (per-head q/k RMSNorm of the
# rotated q/k, its NTK-alpha rope), experts on every layer as wide as intermediate_size:
# softmax, the top k, renormalized; the router mlp.gate.wg; an ungated shared MLP beside
# them.
HUNYUAN_V1_MOE = replace(
    HUNYUAN_V1_DENSE, legacy=_hunyuan_moe_config, refuse=_hunyuan_moe_lists,
    moe=MoeSpec(names=MoeNames(router=("mlp.gate.wg.weight",), shared="mlp.shared_mlp."),
                experts_keys=("num_experts",), width_key="intermediate_size", norm_key=None,
                renormalize=True, scaling_key=None),
    defaults={**HUNYUAN_V1_DENSE.defaults, "num_experts": 1, "max_position_embeddings": 2048},
)


def _dbrx_config(raw: dict[str, Any]) -> dict[str, Any]:
    """DbrxConfig's keys under the common names: d_model, n_heads, n_layers, max_seq_len
    (or those names, its aliases); attn_config's kv_n_heads and clip_qkv; ffn_config's
    experts (renormalized where moe_normalize_expert_weights is 1, the sum of the top k)
    and activation. Its LayerNorms are torch's default, epsilon 1e-5."""
    attn, ffn = raw.get("attn_config") or {}, raw.get("ffn_config") or {}

    def aliased(key: str, alias: str, default: int) -> Any:  # DbrxConfig's attribute_map
        return next((raw[k] for k in (key, alias) if raw.get(k) is not None), default)

    return {**raw, "hidden_size": aliased("d_model", "hidden_size", 2048),
            "num_attention_heads": aliased("n_heads", "num_attention_heads", 16),
            "num_hidden_layers": aliased("n_layers", "num_hidden_layers", 24),
            "max_position_embeddings": aliased("max_seq_len", "max_position_embeddings", 2048),
            "num_key_value_heads": attn.get("kv_n_heads", 1), "clip_qkv": attn.get("clip_qkv"),
            "intermediate_size": ffn.get("ffn_hidden_size", 3584),
            "num_experts": ffn.get("moe_num_experts", 4),
            "num_experts_per_tok": ffn.get("moe_top_k", 1),
            "norm_topk_prob": ffn.get("moe_normalize_expert_weights", 1.0) is not None,
            "hidden_act": (ffn.get("ffn_act_fn") or {}).get("name", "silu"),
            "layer_norm_eps": 1e-5}


def _dbrx_p_norm(raw: dict[str, Any]) -> str | None:
    p = (raw.get("ffn_config") or {}).get("moe_normalize_expert_weights", 1.0)
    if p is not None and float(p) != 1.0:
        return (f"moe_normalize_expert_weights {p} (the top-k weights over their {p}-norm) "
                "is not supported; export divides them by their sum (1)")
    return None


# DBRX: pre-norm blocks of LayerNorms without bias, one fused Wqkv clamped to clip_qkv,
# experts on every layer (softmax, the top k, divided by their sum), stored as three
# [E * I, H] tensors (w1 gate, v1 up, w2 down transposed).
DBRX = FamilySpec(
    names=replace(LLAMA_NAMES, embed=("transformer.wte.weight",),
                  final_norm="transformer.norm_f", layer="transformer.blocks.{i}.",
                  qkv="norm_attn_norm.attn.Wqkv", o="norm_attn_norm.attn.out_proj",
                  input_norm="norm_attn_norm.norm_1", post_attn_norm="norm_attn_norm.norm_2"),
    norm="layer_no_bias", clip_qkv=True, legacy=_dbrx_config, refuse=_dbrx_p_norm,
    moe=MoeSpec(names=MoeNames(router=("ffn.router.layer.weight",),
                               expert="ffn.experts.{j}.",
                               stacked=("ffn.experts.mlp.w1", "ffn.experts.mlp.v1",
                                        "ffn.experts.mlp.w2")),
                width_key="intermediate_size", scaling_key=None),
    defaults={"vocab_size": 32000},
    quirks=("LayerNorm without bias", "q/k/v clamped to clip_qkv"),
)


# FlexOlmo: OLMo 2's layers (norms after attention and MLP, q/k RMSNorm over the whole
# projection) with OLMoE's experts (softmax, the top k, renormalized where norm_topk_prob).
FLEX_OLMO = replace(
    OLMO2, moe=OLMOE.moe,
    defaults={"rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "num_experts": 7,
              "rope_theta": 500000.0,
              "num_experts_per_tok": 5, "norm_topk_prob": False},
)

FAMILIES: dict[str, FamilySpec] = {
    "qwen3_moe": QWEN3_MOE,
    "qwen2_moe": QWEN2_MOE,
    "mellum": MELLUM,
    "olmoe": OLMOE,
    "mixtral": MIXTRAL,
    "ernie4_5_moe": ERNIE4_5_MOE,
    "phimoe": PHIMOE,
    "hunyuan_v1_moe": HUNYUAN_V1_MOE,
    "dbrx": DBRX,
    "flex_olmo": FLEX_OLMO,
}
