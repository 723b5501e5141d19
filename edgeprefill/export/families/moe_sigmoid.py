"""Families whose MLPs are routed experts (export/experts.py, export/moe.py) scored by a
sigmoid, DeepSeek-V3's style: the top k of the scores plus a bias that only chooses, where
the checkpoint has one, weighed by the scores. DeepSeek-V3's own routing (`DEEPSEEK_MOE`:
grouped, scaled, a shared MLP) in GLM-4.5, Sarvam-MoE, MiMo-V2-Flash, dots.llm1,
EXAONE-MoE, Solar Open and Beam (and in latent.py's DeepSeek-V3); its kin in Flint,
Kolibri-1, MiniMax-M2, Hy3 and AFMoE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edgeprefill.export.config_values import given
from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    after_dense_layers,
    after_first_k_dense,
    every_layer,
    mlp_layer_types_sparse,
    sparse_layers,
    sparse_mlp_layers,
)
from edgeprefill.export.families.dense import (
    ATTENTION_BIAS,
    after_max_window_layers,
    every_nth_global,
)
from edgeprefill.export.families.moe_softmax import EXPERT_ALIASES, MIXTRAL, QWEN3_MOE
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec


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
           "routed_scaling_factor": given(raw.get("routed_scaling_factor"), 1.0),
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


def _hy_v3_config(raw: dict[str, Any]) -> dict[str, Any]:
    """HYV3Config: without `mlp_layer_types`, the first layer dense and the rest sparse. Its
    shared MLP is num_shared_experts x moe_intermediate_size wide, or intermediate_size
    where that is 0 (HYV3MLP's `intermediate_size or config.intermediate_size`)."""
    count = int(raw["num_hidden_layers"])
    kinds = raw.get("mlp_layer_types")
    if kinds is None:
        kinds = ["dense"] * min(count, 1) + ["sparse"] * max(count - 1, 0)
    shared = int(raw.get("num_shared_experts") or 0) * int(raw["moe_intermediate_size"])
    return {**raw, "mlp_layer_types": kinds,
            "shared_expert_intermediate_size": shared or int(raw["intermediate_size"])}


# Hy3 (HYV3): Llama's attention with per-head q/k RMSNorm (q/k/v/o biases by
# attention_bias), experts on the `sparse` layers of mlp_layer_types: the top k of sigmoid
# + e_score_correction_bias, weighed by the sigmoid, renormalized (+ 1e-20), times
# router_scaling_factor; an ungated shared MLP beside them. Read under the Hub's names
# (mlp.router.gate, mlp.expert_bias, mlp.shared_mlp: what save_pretrained writes too). Its
# multi-token-prediction layer (model.layers.{num_hidden_layers}) is left out, as
# transformers leaves it.
HY_V3 = FamilySpec(
    **ATTENTION_BIAS, qk_norm="head", legacy=_hy_v3_config, unsupported=("mlp_bias",),
    refuse=lambda raw: _null_refused(raw, ("num_experts", "num_experts_per_tok",
                                            "num_shared_experts")),
    moe=MoeSpec(names=MoeNames(router=("mlp.router.gate.weight", "mlp.gate.weight"),
                               expert_bias=("mlp.expert_bias", "mlp.e_score_correction_bias"),
                               shared="mlp.shared_mlp."),
                routing="sigmoid", experts_keys=EXPERT_ALIASES, layers=mlp_layer_types_sparse,
                norm_key=None, renormalize=True, norm_eps=1e-20, bias_key=None,
                scaling_key="router_scaling_factor"),
    defaults={"vocab_size": 120832, "hidden_size": 4096, "intermediate_size": 13312,
              "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 11_158_840.0, "num_experts": 192, "num_experts_per_tok": 8,
              "num_shared_experts": 1, "moe_intermediate_size": 1536,
              "router_scaling_factor": 2.826},
    quirks=("per-head q/k RMSNorm", "sigmoid routing",
            "dense and sparse layers (mlp_layer_types)"),
)


def _null_refused(raw: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """Keys a config class types `int | None` (defaulting them otherwise) whose null its
    model cannot run with."""
    null = next((key for key in keys if raw.get(key) is None), None)
    return None if null is None else f"{null} is null; the family's model cannot run with it"


def _afmoe_refuse(raw: dict[str, Any]) -> str | None:
    null = _null_refused(raw, ("num_experts", "num_experts_per_tok", "num_shared_experts",
                               "num_dense_layers", "route_scale"))
    if null is not None:
        return null
    if raw.get("attention_bias"):  # its gate_proj has none; export packs it with q/k/v
        return "attention_bias=true is not supported"
    if raw.get("sliding_window") is None:
        # its sliding layers would then rotate without a window, which export ties together
        return "config.json needs sliding_window (its local layers are the rotated ones)"
    return None


# AFMoE (Arcee Trinity): Llama's attention with per-head q/k RMSNorm, rotary on its sliding
# layers only (every global_attn_every_n_layers-th is full, without rotary), and an output
# gate of its own projection (sigmoid(gate_proj(x)), per element); norms before and after
# attention and MLP; the embedding times sqrt(hidden) where mup_enabled. Experts after the
# first num_dense_layers: the top k of sigmoid + expert_bias, weighed by the sigmoid,
# renormalized (+ 1e-20), times route_scale, beside an ungated shared MLP.
AFMOE = FamilySpec(
    names=replace(LLAMA_NAMES, attn_gate="self_attn.gate_proj",
                  pre_mlp_norm="pre_mlp_layernorm", post_mlp_norm="post_mlp_layernorm"),
    block="sandwich", qk_norm="head", attn_gate=True, embed_scale="sqrt_hidden",
    embed_scale_key="mup_enabled", window="always",
    sliding=lambda i, raw: bool((i + 1) % int(raw["global_attn_every_n_layers"])),
    global_nope=True, refuse=_afmoe_refuse, legacy=shared_experts("num_shared_experts"),
    moe=MoeSpec(names=MoeNames(router=("mlp.router.gate.weight",),
                               expert_bias=("mlp.expert_bias",), shared="mlp.shared_experts."),
                routing="sigmoid", layers=after_dense_layers, norm_key=None,
                renormalize=True, norm_eps=1e-20, bias_key=None, scaling_key="route_scale"),
    defaults={"vocab_size": 200192, "hidden_size": 2048, "intermediate_size": 6144,
              "moe_intermediate_size": 1408, "num_hidden_layers": 32, "num_dense_layers": 1,
              "num_attention_heads": 16, "head_dim": 128, "max_position_embeddings": 16384,
              "rms_norm_eps": 1e-5, "num_experts": 64, "num_experts_per_tok": 6,
              "num_shared_experts": 2, "route_scale": 1.0, "global_attn_every_n_layers": 4,
              "sliding_window": 1024},
    quirks=("per-head q/k RMSNorm", "attention output gate (its own projection)",
            "norms before and after attention and MLP", "full-attention layers without rotary",
            "sigmoid routing"),
)

FAMILIES: dict[str, FamilySpec] = {
    "flint": FLINT,
    "glm4_moe": GLM4_MOE,
    "sarvam_moe": SARVAM_MOE,
    "mimo_v2_flash": MIMO_V2_FLASH,
    "dots1": DOTS1,
    "exaone_moe": EXAONE_MOE,
    "solar_open": SOLAR_OPEN,
    "kolibri1": KOLIBRI1,
    "minimax_m2": MINIMAX_M2,
    "beam": BEAM,
    "hy_v3": HY_V3,
    "afmoe": AFMOE,
}
