"""Families whose MLPs are routed experts (export/experts.py, export/moe.py) beside
attention: Mixtral, the Qwen MoEs, OLMoE, Granite MoE, gpt-oss, GLM-4.5 and DeepSeek-V3's
routing on standard attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edgeprefill.export.context_cap import (
    attention_chunk_cap,
    longrope_window,
    longrope_window_cap,
)
from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    after_first_k_dense,
    every_layer,
    interval_layers,
    sparse_layers,
    sparse_mlp_layers,
)
from edgeprefill.export.families.dense import (
    ATTENTION_BIAS,
    HUNYUAN_V1_DENSE,
    OLMO2,
    after_max_window_layers,
    every_nth_global,
    granite_swa_layers,
    hunyuan_ntk_alpha,
    layer_rope_thetas_unsupported,
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


def _mlp_layer_types_sparse(raw: dict[str, Any]) -> tuple[int, ...]:
    """Laguna's and Mellum's `mlp_layer_types`: the `sparse` layers (all without it)."""
    kinds = raw.get("mlp_layer_types") or ["sparse"] * int(raw["num_hidden_layers"])
    return tuple(i for i, kind in enumerate(kinds) if kind == "sparse")


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
    moe=MoeSpec(experts_keys=EXPERT_ALIASES, layers=_mlp_layer_types_sparse),
    defaults={"vocab_size": 98_304, "hidden_size": 2304, "intermediate_size": 7168,
              "num_hidden_layers": 28, "num_attention_heads": 32, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 131_072, "sliding_window": 1024,
              "num_local_experts": 64, "num_experts_per_tok": 8,
              "moe_intermediate_size": 896, "norm_topk_prob": True, "rms_norm_eps": 1e-6},
    quirks=("per-head q/k RMSNorm", "a rope per layer type",
            "dense and sparse layers (mlp_layer_types)"),
)


# Flint: Qwen3-MoE's layers with attention sinks, sliding windows on its
# `sliding_attention` layers (FlintConfig's pattern without `layer_types`), no rotary on its
# full ones; sigmoid routing without a bias (`norm_topk_prob` renormalizes, no epsilon)
# beside an ungated shared expert; the first two layers dense (mlp_only_layers). Its sinks
# are stored as `softmax_offset` (the checkpoints' name, which transformers saves).
def _flint_layers(raw: dict[str, Any]) -> dict[str, Any]:
    """FlintConfig: without `layer_types`, full attention on the first two layers, every
    fourth from the second and the last; without `mlp_only_layers`, [0, 1]."""
    count = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [
        "full_attention" if i < 2 or i % 4 == 1 or i == count - 1 else "sliding_attention"
        for i in range(count)]
    dense = raw.get("mlp_only_layers")
    return {**raw, "layer_types": types, "mlp_only_layers": [0, 1] if dense is None else dense}


FLINT = replace(
    QWEN3_MOE, names=replace(LLAMA_NAMES, sinks="self_attn.softmax_offset"), sinks=True,
    window="always", global_nope=True, legacy=_flint_layers,
    moe=MoeSpec(names=MoeNames(shared="mlp.shared_expert."), routing="sigmoid",
                layers=sparse_layers),
    defaults={"vocab_size": 150_144, "hidden_size": 2048, "intermediate_size": 6144,
              "num_hidden_layers": 49, "num_attention_heads": 32, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 262_144, "sliding_window": 513,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 1024,
              "num_experts_per_tok": 6, "num_experts": 256, "norm_topk_prob": True,
              "decoder_sparse_step": 1, "rms_norm_eps": 1e-6},
    quirks=("per-head q/k RMSNorm", "attention sinks (a learned logit per head)",
            "full-attention layers without rotary", "sigmoid routing"),
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


def shared_experts(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """DeepSeek-V3's shared experts are one MLP `key` x moe_intermediate_size wide (none
    where the count is 0 or null)."""
    def read(raw: dict[str, Any]) -> dict[str, Any]:
        width = int(raw.get(key) or 0) * int(raw["moe_intermediate_size"])
        return {**raw, "shared_expert_intermediate_size": width}

    return read


def _experts_only(raw: dict[str, Any]) -> dict[str, Any]:
    """Solar Open, Kolibri-1: experts on every layer and no dense MLP, whose
    intermediate_size their config classes drop; the experts' width stands in for it."""
    return {**raw, "intermediate_size": raw["moe_intermediate_size"]}


# DeepSeek-V3's experts ("noaux_tc"): sigmoid scores, the top k of scores +
# e_score_correction_bias within the best topk_group of n_group groups, weighed by the
# scores alone, renormalized (+ 1e-20) where norm_topk_prob, times routed_scaling_factor;
# an ungated shared MLP beside them; a dense MLP on the first first_k_dense_replace layers.
DEEPSEEK_MOE = MoeSpec(
    names=MoeNames(expert_bias=("mlp.gate.e_score_correction_bias",),
                   shared="mlp.shared_experts."),
    routing="sigmoid", experts_keys=("num_local_experts", "n_routed_experts"),
    layers=after_first_k_dense, norm_eps=1e-20, bias_key=None, grouped=True)
DEEPSEEK_MOE_DEFAULTS = {"n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                         "routed_scaling_factor": 1.0, "norm_topk_prob": True}
# GLM-4.5/4.6 (-Air): Cohere's attention as GLM-4.5 configures it (q/k/v biases by
# attention_bias, no o bias; rotary on the first partial_rotary_factor of each head, not
# interleaved; per-head q/k RMSNorm where use_qk_norm) in a pre-norm block, DeepSeek-V3's
# experts. Its multi-token-prediction layers (model.layers.{num_hidden_layers}...,
# num_nextn_predict_layers of them) are not the causal LM's: left out, as transformers does.
GLM4_MOE = FamilySpec(
    bias_key="attention_bias", qkv_bias=False, partial_rotary=True, qk_norm="head",
    qk_norm_key="use_qk_norm", legacy=shared_experts("n_shared_experts"), moe=DEEPSEEK_MOE,
    defaults={**DEEPSEEK_MOE_DEFAULTS, "partial_rotary_factor": 0.5,
              "intermediate_size": 10944, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "n_routed_experts": 128,
              "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
              "first_k_dense_replace": 1, "num_nextn_predict_layers": 1},
)


def _sarvam_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """SarvamMoEConfig: GLM-4.5's config read from the remote code's keys too (its
    attribute_map: num_experts, num_shared_experts, use_qkv_bias)."""
    for old, new in (("num_experts", "n_routed_experts"),
                     ("num_shared_experts", "n_shared_experts"),
                     ("use_qkv_bias", "attention_bias")):
        if old in raw:
            raw = {**raw, new: raw[old]}
    return shared_experts("n_shared_experts")(raw)


# Sarvam-MoE (sarvam-30b): GLM-4.5's model (transformers builds Glm4MoeForCausalLM) rotating
# whole heads, its checkpoint in the remote code's names, which transformers renames on
# load as these do: the fused q|k|v split by rows, `.attention.dense` the o projection.
SARVAM_MOE = replace(
    GLM4_MOE, legacy=_sarvam_moe_config,
    names=replace(LLAMA_NAMES, qkv="self_attn.query_key_value"),
    renames=(("model.word_embeddings.", "model.embed_tokens."),),
    segment_renames=((".attention.", ".self_attn."), (".self_attn.dense.", ".self_attn.o_proj."),
                     (".self_attn.query_layernorm.", ".self_attn.q_norm."),
                     (".self_attn.key_layernorm.", ".self_attn.k_norm."),
                     (".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias")),
    defaults={**GLM4_MOE.defaults, "partial_rotary_factor": 1.0, "rope_theta": 8_000_000.0,
              "vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 8192,
              "num_hidden_layers": 19, "num_attention_heads": 64, "num_key_value_heads": 4,
              "head_dim": 64, "rms_norm_eps": 1e-6, "moe_intermediate_size": 1024,
              "num_experts_per_tok": 6, "routed_scaling_factor": 2.5, "use_qk_norm": True,
              "num_nextn_predict_layers": 0},
    quirks=("the remote code's tensor names (fused q|k|v)",),
)
# MiMo-V2-Flash's rope per layer type, as MiMoV2FlashConfig fills it in
MIMO_ROPES = {"full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0,
                                 "partial_rotary_factor": 0.334},
              "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0,
                                    "partial_rotary_factor": 0.334}}


def _mimo_v2_flash_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MiMoV2FlashConfig: full attention on layer 0 and every 6th, sliding elsewhere;
    experts on all but the first (mlp_layer_types); a rope per layer type rotating its
    partial_rotary_factor (0.334 where absent) of each head, export's one factor where
    both agree; a null routed_scaling_factor is 1; the remote code's sliding_window_size
    excludes the query."""
    count = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [
        "full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention"
        for i in range(count)]
    ropes = raw.get("rope_parameters") or MIMO_ROPES
    factors = {kind: params.get("partial_rotary_factor", 0.334)
               for kind, params in ropes.items() if isinstance(params, dict)}
    raw = {**raw, "layer_types": types, "rope_parameters": ropes,
           "mlp_layer_types": raw.get("mlp_layer_types") or ["dense"] + ["sparse"] * (count - 1),
           "routed_scaling_factor": raw.get("routed_scaling_factor") or 1.0,
           "partial_rotary_factor": factors.get("full_attention", 0.334)}
    if raw.get("sliding_window_size") is not None:
        raw["sliding_window"] = int(raw["sliding_window_size"]) + 1
    return raw


def _mimo_unsupported(raw: dict[str, Any]) -> str | None:
    factors = {kind: params.get("partial_rotary_factor", 0.334)
               for kind, params in raw["rope_parameters"].items() if isinstance(params, dict)}
    if len(set(factors.values())) > 1:
        return (f"a partial_rotary_factor per layer type ({factors}) is not supported; "
                "export rotates one share of each head")
    return None


# MiMo-V2-Flash: Qwen2's attention (q/k/v biases by attention_bias, no o bias) with value
# heads of their own size (v_head_dim, padded to head_dim in the cache) times
# attention_value_scale; sliding layers with twice the KV heads and attention sinks, full
# ones without; partial rotary with a base per layer type; DeepSeek-V3's experts without
# a shared expert on the `sparse` layers of mlp_layer_types. Its multi-token-prediction
# layers (model.mtp.) are not the causal LM's: left out, as transformers does.
MIMO_V2_FLASH = FamilySpec(
    **ATTENTION_BIAS, names=replace(LLAMA_NAMES, sinks="self_attn.attention_sink_bias"),
    partial_rotary=True, window="always", sinks=True,
    sliding_sinks_only=True, sliding_kv_factor=2, v_head_dim_key="v_head_dim",
    value_scale_key="attention_value_scale", legacy=_mimo_v2_flash_config,
    refuse=_mimo_unsupported, left_out=("model.mtp.",),
    moe=replace(DEEPSEEK_MOE, layers=sparse_mlp_layers),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "vocab_size": 152576, "hidden_size": 4096,
              "intermediate_size": 16384, "num_hidden_layers": 48,
              "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192,
              "v_head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "moe_intermediate_size": 2048, "num_experts_per_tok": 8,
              "n_routed_experts": 256, "sliding_window": 129,
              "attention_value_scale": 0.707},
    quirks=("attention sinks on the sliding layers", "a rope per layer type"),
)
# dots.llm1: Qwen3's attention (per-head q/k RMSNorm; a window on the layers from
# max_window_layers where the config has one), DeepSeek-V3's experts.
DOTS1 = FamilySpec(
    **ATTENTION_BIAS, qk_norm="head", window="always", sliding=after_max_window_layers,
    legacy=shared_experts("n_shared_experts"), moe=DEEPSEEK_MOE,
    # Dots1Config leaves these null, which its model cannot build with
    required=("n_routed_experts", "num_experts_per_tok", "n_shared_experts"),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "norm_topk_prob": False, "intermediate_size": 10944,
              "moe_intermediate_size": 1408, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-6, "first_k_dense_replace": 0, "sliding_window": 4096,
              "max_window_layers": 62},
    quirks=("per-head q/k RMSNorm",),
)
# EXAONE-MoE: EXAONE 4's attention (per-head q/k RMSNorm; with a window, 3 local layers
# per global one, the global ones without rotary) in a pre-norm block, DeepSeek-V3's
# experts (num_experts, num_shared_experts) on the layers mlp_layer_types marks "sparse".
EXAONE_MOE = FamilySpec(
    qk_norm="head", window="always", sliding=every_nth_global, global_nope=True,
    legacy=shared_experts("num_shared_experts"), left_out=("mtp.",),
    moe=replace(DEEPSEEK_MOE, experts_keys=("num_experts",), layers=sparse_mlp_layers,
                names=replace(DEEPSEEK_MOE.names, expert_bias=(
                    "mlp.e_score_correction_bias", "mlp.gate.e_score_correction_bias"))),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-5,
              "intermediate_size": 16384, "max_position_embeddings": 2048,
              "sliding_window": 4096, "sliding_window_pattern": 4, "num_experts": 64,
              "num_experts_per_tok": 8, "moe_intermediate_size": 1024,
              "num_shared_experts": 1, "first_k_dense_replace": 1},
    quirks=("per-head q/k RMSNorm",),
)
# Solar Open: Llama's attention (q/k/v biases by attention_bias, no o bias), experts on
# every layer (its config class has no first_k_dense_replace, nor a dense MLP).
SOLAR_OPEN = FamilySpec(
    bias_key="attention_bias", qkv_bias=False,
    legacy=lambda raw: _experts_only(shared_experts("n_shared_experts")(raw)),
    moe=replace(DEEPSEEK_MOE, layers=every_layer),
    defaults={**DEEPSEEK_MOE_DEFAULTS, "head_dim": 128,
              "rope_theta": 1_000_000.0, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "num_key_value_heads": 8, "n_routed_experts": 128,
              "num_experts_per_tok": 8, "moe_intermediate_size": 1280},
)
# Kolibri-1: EXAONE 4's attention (sliding on four of five layers unless layer_types says
# otherwise; the global ones without rotary) in GLM-4's sandwich of norms (stored under
# the Hub's names, post_attn_norm and post_ffn_norm), experts on every layer: the top k of
# the router's logits + its bias (the Hub's moe.router.expert_bias), weighed by the
# sigmoid of those logits, renormalized where norm_topk_prob (no epsilon, no scaling); an
# ungated shared MLP shared_expert_intermediate_size wide.
KOLIBRI1 = FamilySpec(
    block="sandwich",
    names=replace(LLAMA_NAMES, post_attn_norm="post_attn_norm",
                  pre_mlp_norm="post_attention_layernorm", post_mlp_norm="post_ffn_norm"),
    qk_norm="head", window="always", sliding=lambda i, raw: (i + 1) % 5 != 0,
    global_nope=True, legacy=_experts_only,
    moe=MoeSpec(names=replace(DEEPSEEK_MOE.names, expert_bias=(
        "moe.router.expert_bias", "mlp.gate.e_score_correction_bias")),
                routing="sigmoid", experts_keys=EXPERT_ALIASES, bias_key=None,
                bias_on_logits=True, scaling_key=None),
    defaults={"head_dim": 128, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 262144, "sliding_window": 513,
              "num_key_value_heads": 4, "num_experts": 384, "num_experts_per_tok": 6,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
              "norm_topk_prob": False},
    quirks=("norms before and after attention and MLP", "per-head q/k RMSNorm"),
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

def _minimax_rotary_dim(raw: dict[str, Any]) -> dict[str, Any]:
    """MiniMaxM2Config: `rotary_dim` (the Hub's key) rotates that part of each head."""
    if raw.get("rotary_dim") is None or "partial_rotary_factor" in raw:
        return raw
    return {**raw, "partial_rotary_factor": int(raw["rotary_dim"]) / int(raw["head_dim"])}


# MiniMax-M2: Mixtral's layers with q/k RMSNorm over the whole projection and rotary on
# the first rotary_dim of each head; the top k of sigmoid + e_score_correction_bias,
# weighed by the sigmoid, renormalized; the Hub's block_sparse_moe (w1, w3, w2).
MINIMAX_M2 = FamilySpec(
    qk_norm="full", partial_rotary=True, legacy=_minimax_rotary_dim,
    moe=replace(MIXTRAL.moe, names=replace(
        MIXTRAL.moe.names, expert_bias=("block_sparse_moe.e_score_correction_bias",
                                        "mlp.e_score_correction_bias")),
        routing="sigmoid", bias_key=None, scaling_key=None),
    defaults={"vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
              "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 196608, "rms_norm_eps": 1e-6,
              "rope_theta": 5_000_000.0, "num_experts_per_tok": 8, "num_local_experts": 256},
    quirks=("q/k RMSNorm over the whole projection", "sigmoid routing"),
)

def _beam_config(raw: dict[str, Any]) -> dict[str, Any]:
    """BeamConfig's layers where config.json leaves them out: every sixth and the last
    full attention (the others slide), three dense MLPs and then experts, rotary on the
    sliding layers only (a null rope entry: NoPE)."""
    raw = dict(raw)
    count = int(raw["num_hidden_layers"])
    if raw.get("layer_types") is None:
        kinds = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(count)]
        raw["layer_types"] = [*kinds[:-1], "full_attention"]
    if raw.get("mlp_layer_types") is None:
        dense = min(3, count)
        raw["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (count - dense)
    if raw.get("rope_parameters") is None:
        raw["rope_parameters"] = {"sliding_attention": {"rope_type": "default",
                                                        "rope_theta": 10000.0},
                                  "full_attention": None}
    return raw


# Beam: Qwen3-MoE's attention (per-head q/k RMSNorm, biases by attention_bias) with a
# sigmoid output gate per channel plus a bias per head; rotary and a window on the sliding
# layers, the full ones NoPE with each query times its position's scalable-softmax factor;
# Gemma 2's sandwich norms with depth-scaled residual adds; DeepSeek-V3's grouped sigmoid
# routing without a shared expert on the layers mlp_layer_types marks "sparse"; the final
# logits soft-capped.
BEAM = FamilySpec(
    **ATTENTION_BIAS, block="sandwich", qk_norm="head", window="always", nope_types=True,
    channel_gate=True, scalable_softmax=True, depth_scaled_residual=True, softcaps=("final",),
    legacy=_beam_config,
    moe=replace(DEEPSEEK_MOE, experts_keys=("num_experts",), layers=sparse_mlp_layers,
                names=replace(DEEPSEEK_MOE.names, shared=None)),
    defaults={"hidden_size": 5120, "intermediate_size": 20480, "num_hidden_layers": 52,
              "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
              "max_position_embeddings": 8192, "sliding_window": 512, "rms_norm_eps": 1e-6,
              "vocab_size": 151936, "moe_intermediate_size": 2560, "num_experts": 256,
              "num_experts_per_tok": 8, "norm_topk_prob": True, "n_group": 8,
              "topk_group": 4, "routed_scaling_factor": 2.5, "final_logit_softcapping": 30.0},
    quirks=("per-head q/k RMSNorm", "a sigmoid output gate per channel",
            "depth-scaled residual adds", "scalable-softmax queries on the NoPE layers"),
)

FAMILIES: dict[str, FamilySpec] = {
    "qwen3_moe": QWEN3_MOE,
    "qwen2_moe": QWEN2_MOE,
    "flint": FLINT,
    "mellum": MELLUM,
    "olmoe": OLMOE,
    "mixtral": MIXTRAL,
    "ernie4_5_moe": ERNIE4_5_MOE,
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
    "glm4_moe": GLM4_MOE,
    "sarvam_moe": SARVAM_MOE,
    "mimo_v2_flash": MIMO_V2_FLASH,
    "dots1": DOTS1,
    "exaone_moe": EXAONE_MOE,
    "solar_open": SOLAR_OPEN,
    "kolibri1": KOLIBRI1,
    "llama4_text": LLAMA4_TEXT,
    "phimoe": PHIMOE,
    "hunyuan_v1_moe": HUNYUAN_V1_MOE,
    "dbrx": DBRX,
    "flex_olmo": FLEX_OLMO,
    "minimax_m2": MINIMAX_M2,
    "beam": BEAM,
}

