"""Families whose MLPs are routed experts (export/experts.py, export/moe.py) chosen as the
router's top k logits first, then weighed by a softmax over those k (Granite MoE, gpt-oss,
Aria, Cohere 2 MoE by default) or each by its sigmoid (Llama 4, Cohere 2 MoE's sigmoid
selection).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.config_values import given
from edgeprefill.export.context_cap import (
    attention_chunk_cap,
)
from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    mlp_layer_types_sparse,
)
from edgeprefill.export.families.dense import (
    ATTENTION_BIAS,
    granite_swa_layers,
    layer_rope_thetas_unsupported,
)
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec

# Granite 3.x MoE: Granite's multipliers; the top k router logits, then softmax; experts
# stored fused (input_linear [E, 2I, H], gate first; output_linear [E, H, I]).
GRANITE_MOE = FamilySpec(
    **ATTENTION_BIAS, embed_scale="multiplier",
    moe=MoeSpec(names=MoeNames(router=("block_sparse_moe.router.layer.weight",
                                       "block_sparse_moe.router.weight"),
                               expert="block_sparse_moe.experts.{j}.",
                               fused_gate_up=("block_sparse_moe.input_linear.weight",
                                              "block_sparse_moe.experts.gate_up_proj"),
                               fused_down=("block_sparse_moe.output_linear.weight",
                                           "block_sparse_moe.experts.down_proj")),
                routing="topk_softmax", experts_keys=("num_local_experts",),
                width_key="intermediate_size", norm_key=None),
    defaults={"attention_multiplier": 1.0, "rms_norm_eps": 1e-6, "num_local_experts": 8,
              "num_experts_per_tok": 2},
    quirks=("embedding, attention and residual multipliers", "logits scaling"),
)


def _granite_shared_width(raw: dict[str, Any]) -> dict[str, Any]:
    # GraniteMoeSharedConfig: the shared MLP is shared_intermediate_size wide (0: none).
    return {**raw, "shared_expert_intermediate_size": raw["shared_intermediate_size"]}


# Granite MoE Shared: Granite MoE with a gated shared MLP (fused input_linear) beside the
# experts where shared_intermediate_size is not 0.
GRANITE_MOE_SHARED = replace(
    GRANITE_MOE, legacy=_granite_shared_width,
    moe=replace(GRANITE_MOE.moe, names=replace(
        GRANITE_MOE.moe.names, shared="shared_mlp.", shared_gate_up="input_linear",
        shared_down="output_linear")),
    defaults={**GRANITE_MOE.defaults, "shared_intermediate_size": 0},
)


def _gpt_oss_rope(raw: dict[str, Any]) -> dict[str, Any]:
    # GptOssConfig: without rope_parameters (and no legacy rope_scaling) its yarn rope.
    if raw.get("rope_parameters") is None and not raw.get("rope_scaling"):
        raw = {**raw, "rope_parameters": {**GPT_OSS_ROPE, "rope_theta": raw["rope_theta"]}}
    return raw


GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


# gpt-oss (20b, 120b): Llama attention with q/k/v/o biases and a sink logit per head,
# sliding (128) and full layers alternating, a yarn rope; every MLP routed experts: the top
# k of biased router logits, softmax over those k; experts with biases and a clamped
# SwiGLU of interleaved gate/up rows, stored MXFP4 on the Hub.
GPT_OSS = FamilySpec(
    **ATTENTION_BIAS, sinks=True, window="always", sliding=lambda i, raw: bool((i + 1) % 2),
    legacy=_gpt_oss_rope,
    moe=MoeSpec(names=MoeNames(router=("mlp.router.weight",), router_bias="mlp.router.bias",
                               fused_gate_up=("mlp.experts.gate_up_proj",),
                               fused_down=("mlp.experts.down_proj",),
                               gate_up_bias="mlp.experts.gate_up_proj_bias",
                               down_bias="mlp.experts.down_proj_bias",
                               interleaved=True, transposed=True, mxfp4=True),
                routing="topk_softmax", experts_keys=("num_local_experts", "num_experts"),
                width_key="intermediate_size", norm_key=None, clamped_swiglu=True),
    defaults={"num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088,
              "hidden_size": 2880, "intermediate_size": 2880, "head_dim": 64,
              "num_attention_heads": 64, "num_key_value_heads": 8, "sliding_window": 128,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 150000.0, "num_experts_per_tok": 4, "swiglu_alpha": 1.702,
              "swiglu_limit": 7.0, "attention_bias": True},
    quirks=("q/k/v/o biases", "attention sinks (a learned logit per head)",
            "experts and router with biases"),
)


def _llama4_text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Llama4TextConfig's derived keys: without `no_rope_layers` (or with an empty one) a
    NoPE layer every no_rope_layer_interval-th; without `moe_layers` experts on every
    interleave_moe_layer_step-th layer from step - 1; without `layer_types` its rope layers
    chunked where attention_chunk_size is set. Its dense MLPs are intermediate_size_mlp
    wide; its experts and shared expert intermediate_size."""
    count = int(raw["num_hidden_layers"])
    interval = int(raw["no_rope_layer_interval"])
    rope = raw.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(count)]
    step = int(raw["interleave_moe_layer_step"])
    moe_layers = raw.get("moe_layers")
    chunked = raw.get("attention_chunk_size") is not None
    types = raw.get("layer_types") or [
        "chunked_attention" if flag and chunked else "full_attention" for flag in rope]
    return {**raw, "no_rope_layers": rope, "layer_types": types,
            "moe_layers": list(range(step - 1, count, step)) if moe_layers is None
            else moe_layers,
            "intermediate_size": raw["intermediate_size_mlp"],
            "moe_intermediate_size": raw["intermediate_size"],
            "shared_expert_intermediate_size": raw["intermediate_size"]}


# Llama 4 (Scout, Maverick) language model: Llama's attention with interleaved rotary
# (complex pairs) on most layers and none on every fourth (no_rope_layers), whose queries
# are scaled by position (attn_temperature_tuning); an L2 norm of each rotated q/k head on
# the rope layers (use_qk_norm); those attend within chunks of attention_chunk_size, which
# within the first chunk is causal attention: the bundle's context is capped there. Experts
# on every interleave_moe_layer_step-th layer (a dense MLP intermediate_size_mlp wide on
# the others): the top k router logits, each expert taking the token times the sigmoid of
# its logit, beside an ungated shared expert; the experts stored fused [E, in, out].
LLAMA4_TEXT = FamilySpec(
    names=replace(LLAMA_NAMES, gate="feed_forward.gate_proj", up="feed_forward.up_proj",
                  down="feed_forward.down_proj"),
    **ATTENTION_BIAS, rope_interleaved=True, qk_norm="l2", qk_norm_key="use_qk_norm",
    temperature_tuning=True, chunked_attention=True, context_cap=attention_chunk_cap,
    legacy=_llama4_text_config,
    moe=MoeSpec(names=MoeNames(router=("feed_forward.router.weight",),
                               expert="feed_forward.experts.{j}.",
                               fused_gate_up=("feed_forward.experts.gate_up_proj",),
                               fused_down=("feed_forward.experts.down_proj",),
                               transposed=True, shared="feed_forward.shared_expert."),
                routing="topk_sigmoid", experts_keys=("num_local_experts",),
                layers=lambda raw: tuple(int(i) for i in raw["moe_layers"]), norm_key=None,
                scaling_key=None, input_scaled=True),
    defaults={"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
              "intermediate_size_mlp": 16384, "num_hidden_layers": 48,
              "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "num_experts_per_tok": 1, "num_local_experts": 16,
              "interleave_moe_layer_step": 1, "use_qk_norm": True,
              "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
              "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1},
    quirks=("interleaved rotary", "NoPE layers with attention temperature tuning",
            "L2 q/k norm on the rope layers",
            "experts scaled on their input by sigmoid(router logit), a shared expert"),
)


def _aria_text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """AriaTextConfig: moe_topk experts of moe_num_experts, all intermediate_size wide; its
    shared MLP is moe_num_shared_experts x intermediate_size."""
    shared = int(raw["moe_num_shared_experts"]) * int(raw["intermediate_size"])
    return {**raw, "num_experts_per_tok": raw["moe_topk"],
            "shared_expert_intermediate_size": shared}


def _aria_silu_experts(raw: dict[str, Any]) -> str | None:
    # AriaExperts are SiLU-gated whatever hidden_act (which its shared MLP reads); export
    # runs both on one activation.
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        return (f"hidden_act {act!r} is not supported: its experts are SiLU-gated whatever "
                "hidden_act, its shared MLP reads it, and export runs both on one activation")
    return None


# Aria's language model: Llama's layers whose every MLP is experts (the top k router
# logits, softmax over those k) stored fused [E, in, out] (the Hub's experts.fc1 and fc2,
# which transformers renames gate_up_proj and down_proj), beside an ungated shared MLP.
ARIA_TEXT = FamilySpec(
    **ATTENTION_BIAS, legacy=_aria_text_config, refuse=_aria_silu_experts,
    unsupported=("mlp_bias",),
    moe=MoeSpec(names=MoeNames(router=("mlp.router.weight",),
                               fused_gate_up=("mlp.experts.fc1.weight",
                                              "mlp.experts.gate_up_proj"),
                               fused_down=("mlp.experts.fc2.weight", "mlp.experts.down_proj"),
                               transposed=True, shared="mlp.shared_experts."),
                routing="topk_softmax", experts_keys=("moe_num_experts",),
                width_key="intermediate_size", norm_key=None, scaling_key=None),
    defaults={"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 4096,
              "num_hidden_layers": 32, "num_attention_heads": 32,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "moe_num_experts": 8,
              "moe_topk": 2, "moe_num_shared_experts": 2},
    quirks=("experts stored fused [E, in, out]",),
)


def _cohere2_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Cohere2MoeConfig as its model reads it. Without the lists, the first
    `first_k_dense_replace` layers are dense and slide on every
    prefix_dense_sliding_window_pattern-th but the last, the rest on every
    sliding_window_pattern-th but the last. The sliding layers rotate, and so do the dense
    ones where that prefix pattern is 1 (its attention's force_rope): read as
    no_rope_layers. Dense MLPs are prefix_dense_intermediate_size wide (intermediate_size
    where null), experts intermediate_size, the shared MLP num_shared_experts of them. The
    top k are renormalized only in sigmoid selection."""
    count, dense = int(raw["num_hidden_layers"]), int(raw.get("first_k_dense_replace") or 0)
    prefix, pattern = int(raw["prefix_dense_sliding_window_pattern"]), \
        int(raw["sliding_window_pattern"])
    types = raw.get("layer_types")
    if types is None:
        types = [_cohere2_moe_kind(i, prefix) for i in range(dense)] + \
            [_cohere2_moe_kind(i, pattern) for i in range(count - dense)]
    kinds = raw.get("mlp_layer_types")
    if kinds is None:
        kinds = ["dense" if i < dense else "sparse" for i in range(count)]
    rotates = [int(t == "sliding_attention" or (k == "dense" and prefix == 1))
               for t, k in zip(types, kinds, strict=False)]
    width = int(raw["intermediate_size"])
    return {**raw, "layer_types": types, "mlp_layer_types": kinds, "no_rope_layers": rotates,
            "intermediate_size": given(raw.get("prefix_dense_intermediate_size"), width),
            "moe_intermediate_size": width,
            "shared_expert_intermediate_size": int(raw["num_shared_experts"]) * width,
            "norm_topk_prob": raw["expert_selection_fn"] == "sigmoid"
            and bool(raw["norm_topk_prob"])}


def _cohere2_moe_kind(i: int, pattern: int) -> str:
    return "sliding_attention" if (i + 1) % pattern else "full_attention"


def _cohere2_moe_choices(raw: dict[str, Any]) -> str | None:
    choices = {"expert_selection_fn": ("softmax", "sigmoid"),
               "shared_expert_combination_strategy": ("sum", "average")}
    for key, values in choices.items():
        if raw.get(key) not in values:
            return f"{key} {raw.get(key)!r} is not one its model takes ({', '.join(values)})"
    return None


# Cohere 2 MoE (Command A+): Cohere 2's layers (attention and MLP on one norm, interleaved
# rotary on the sliding layers only, a logit scale) whose norms are RMSNorm where
# rms_norm_eps is set, LayerNorm without bias where not; its dense prefix layers (full
# attention, yet rotated) and experts on the `sparse` layers of mlp_layer_types: the top k
# router logits, softmax over those k, or their sigmoid (renormalized where norm_topk_prob),
# by expert_selection_fn; an ungated shared MLP added to them, or averaged with them.
COHERE2_MOE = FamilySpec(
    **ATTENTION_BIAS, norm="layer_no_bias",
    norm_from_config=lambda raw: "layer_no_bias" if raw.get("rms_norm_eps") is None
    else "rms",
    block="shared", tie_default=True, rope_interleaved=True, window="always",
    legacy=_cohere2_moe_config, refuse=_cohere2_moe_choices, required=("sliding_window",),
    moe=MoeSpec(names=MoeNames(shared="mlp.shared_experts."), routing="topk_softmax",
                routing_from_config=lambda raw: "topk_sigmoid"
                if raw["expert_selection_fn"] == "sigmoid" else "topk_softmax",
                layers=mlp_layer_types_sparse, scaling_key=None,
                average_key="shared_expert_combination_strategy"),
    defaults={"vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528,
              "logit_scale": 0.0625, "num_hidden_layers": 40, "num_attention_heads": 64,
              "head_dim": 128, "max_position_embeddings": 8192, "layer_norm_eps": 1e-5,
              "rope_theta": 10000.0, "sliding_window": 4096, "num_experts_per_tok": 2,
              "num_experts": 8, "num_shared_experts": 0,
              "shared_expert_combination_strategy": "average",
              "expert_selection_fn": "softmax", "prefix_dense_sliding_window_pattern": 1,
              "norm_topk_prob": True, "sliding_window_pattern": 4},
    quirks=("RMSNorm or LayerNorm without bias (rms_norm_eps)", "interleaved rotary",
            "logit scale", "dense prefix layers (mlp_layer_types)"),
)

FAMILIES: dict[str, FamilySpec] = {
    "granitemoe": GRANITE_MOE,
    "granitemoeshared": GRANITE_MOE_SHARED,
    # Granite MoE SWA: Granite MoE Shared with Granite SWA's attention (sinks, windows on
    # all layers but every fourth, a rope base per layer).
    "granitemoe_swa": replace(
        GRANITE_MOE_SHARED, sinks=True, window="always",
        legacy=lambda raw: granite_swa_layers(_granite_shared_width(raw)),
        refuse=layer_rope_thetas_unsupported,
        defaults={**GRANITE_MOE_SHARED.defaults, "sliding_window": 128},
        quirks=(*GRANITE_MOE.quirks, "attention sinks (a learned logit per head)"),
    ),
    "gpt_oss": GPT_OSS,
    "llama4_text": LLAMA4_TEXT,
    "aria_text": ARIA_TEXT,
    "cohere2_moe": COHERE2_MOE,
}
