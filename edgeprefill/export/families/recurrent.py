"""Families with layers that hold a recurrent state instead of (or beside) a KV cache:
LFM2/LFM3's short convolutions, Gated DeltaNet (Qwen3.5, Qwen3-Next, Lara Mini, OLMo
Hybrid), Mamba-1 and Mamba-2 mixers (Mamba, Nemotron-H, Granite 4.0-H, Falcon-H1, Bamba).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    after_dense_layers,
    sparse_layers,
)
from edgeprefill.export.families.dense import ATTENTION_BIAS, MROPE_QUIRKS, OLMO2, QWEN_VL
from edgeprefill.export.families.moe_softmax import QWEN_SHARED_EXPERT
from edgeprefill.export.families.spec import LLAMA_NAMES, SAVED_ALONE, DeltaNames, FamilySpec


def _granite4_layers(raw: dict[str, Any]) -> dict[str, Any]:
    """GraniteMoeHybridConfig: `layers_block_type` is another name of `layer_types`, whose
    legacy "attention" means full_attention and its "linear_attention" the legacy
    "mamba" (export's name for them; all mamba when absent);
    the dense MLP is `shared_intermediate_size` wide; without `position_embedding_type`
    "rope" no layer rotates."""
    types = raw.get("layer_types") or raw.get("layers_block_type") or \
        ["mamba"] * int(raw["num_hidden_layers"])
    remap = {"attention": "full_attention", "linear_attention": "mamba"}
    raw = {**raw, "layer_types": [remap.get(t, t) for t in types],
           "intermediate_size": raw["shared_intermediate_size"]}
    if raw.get("position_embedding_type") != "rope":
        raw["no_rope_layers"] = [0] * len(types)
    return raw


def _granite4_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("num_local_experts"):
        return (f"routed experts are not supported (num_local_experts="
                f"{raw['num_local_experts']}); only dense models (num_local_experts 0)")
    return None


# NemotronHConfig's hybrid_override_pattern characters -> its block kinds
NEMOTRON_H_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


def _nemotron_h_config(raw: dict[str, Any]) -> dict[str, Any]:
    """NemotronHConfig: the blocks are `layers_block_type` (or `layer_types`), else the
    legacy `hybrid_override_pattern`; its older mamba_* names win over the newer ones (its
    __post_init__ pops them). Read under Granite 4.0-H's mamba keys: the mixer's width is
    mamba_num_heads x mamba_head_dim, its projections take `use_bias`, and its dt is
    clamped below at time_step_min only. No layer rotates."""
    kinds = raw.get("layers_block_type") or raw.get("layer_types")
    if kinds is None:
        pattern = raw.get("hybrid_override_pattern")
        kinds = ["linear_attention", "moe", "full_attention", "mlp"] if pattern is None \
            else [NEMOTRON_H_PATTERN[c] for c in pattern]
    return {**raw, "layer_types": list(kinds), "num_hidden_layers": len(kinds),
            "mamba_n_heads": raw["mamba_num_heads"], "mamba_d_head": raw["mamba_head_dim"],
            "mamba_n_groups": raw.get("mamba_n_groups", raw["n_groups"]),
            "mamba_d_state": raw["ssm_state_size"],
            "mamba_d_conv": raw.get("mamba_d_conv", raw["conv_kernel"]),
            "mamba_conv_bias": raw.get("mamba_conv_bias", raw["use_conv_bias"]),
            "mamba_proj_bias": raw["use_bias"],
            "time_step_limit": [raw.get("mamba_dt_min", raw["time_step_min"]), float("inf")],
            "no_rope_layer_interval": 1}  # every layer a NoPE one


def _nemotron_h_unsupported(raw: dict[str, Any]) -> str | None:
    moe = [i for i, kind in enumerate(raw["layer_types"]) if kind == "moe"]
    if moe:
        return (f"mixture-of-experts blocks are not supported (layer_types marks {len(moe)} "
                f"of {len(raw['layer_types'])} as moe); only the dense Nemotron-H models")
    return None


def _mamba2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Mamba2Config: every layer one Mamba-2 mixer after an RMS norm (no MLP, no
    attention), read as Nemotron-H's mixer blocks are: the same checkpoint names
    (backbone.layers.{i}.norm / .mixer) and the same gated RMSNorm, gate first. Its keys
    go to Granite 4.0-H's mamba names; the attention keys it lacks get placeholders that
    no layer reads."""
    count = int(raw["num_hidden_layers"])
    return {**raw, "layer_types": ["linear_attention"] * count,
            "mamba_n_heads": raw["num_heads"], "mamba_d_head": raw["head_dim"],
            "mamba_n_groups": raw["n_groups"], "mamba_d_state": raw["state_size"],
            "mamba_d_conv": raw["conv_kernel"], "mamba_conv_bias": raw["use_conv_bias"],
            "mamba_proj_bias": raw["use_bias"], "num_attention_heads": 1,
            "num_key_value_heads": 1, "intermediate_size": 1,
            "no_rope_layer_interval": 1}  # no layer rotates (none attends)


def _mamba_unsupported(raw: dict[str, Any]) -> str | None:
    # Mamba2Mixer (MambaMixer too) applies hidden_act after its convolution; export's
    # mixers apply SiLU (the Hub's models' and the mamba_ssm kernels' only choice).
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        return f"hidden_act {act!r} is not supported; the mixer's convolution takes silu only"
    return None


def _mamba1_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MambaConfig (FalconMambaConfig): every layer one Mamba-1 mixer after an RMS norm,
    read as Mamba-2's are (_mamba2_config), its own keys kept for export/mamba1.py. The
    mixer is `intermediate_size` wide where config.json has the key (the config class sets
    expand x hidden_size, then the keys it was given over it), else expand x hidden."""
    count = int(raw["num_hidden_layers"])
    inner = raw.get("intermediate_size") or int(raw["expand"]) * int(raw["hidden_size"])
    return {**raw, "layer_types": ["linear_attention"] * count, "mamba_inner": inner,
            "num_attention_heads": 1, "num_key_value_heads": 1, "intermediate_size": 1,
            "no_rope_layer_interval": 1}


def _falcon_mamba_config(raw: dict[str, Any]) -> dict[str, Any]:
    """FalconMambaConfig: as MambaConfig, and its mixer RMS-normalizes B, C and dt
    (without weight) at mixer_rms_eps; MambaMixer ignores the key where a config has it."""
    return {**_mamba1_config(raw), "mamba_bc_dt_eps": raw["mixer_rms_eps"]}


def _falcon_h1_config(raw: dict[str, Any]) -> dict[str, Any]:
    """FalconH1Config: every layer is attention and Mamba-2 side by side (export reads
    them as mamba layers that keep KV); the mixer is mamba_d_ssm wide (mamba_expand x
    hidden where null), its out_proj biased by `projectors_bias`, its gated RMSNorm only
    with `mamba_rms_norm` (norm before the gate by `mamba_norm_before_gate`); the logits
    times lm_head_multiplier."""
    heads = int(raw["mamba_n_heads"])
    inner = raw.get("mamba_d_ssm") or int(raw["mamba_expand"]) * int(raw["hidden_size"])
    head_dim = raw["mamba_d_head"]
    norm = None if not raw["mamba_rms_norm"] else \
        "norm_first" if raw["mamba_norm_before_gate"] else "gate_first"
    return {**raw, "layer_types": ["mamba"] * int(raw["num_hidden_layers"]),
            "mamba_d_head": int(inner) // heads if head_dim == "auto" else head_dim,
            "mamba_out_bias": raw["projectors_bias"], "mamba_norm": norm,
            "logit_scale": raw["lm_head_multiplier"]}


def _bamba_config(raw: dict[str, Any]) -> dict[str, Any]:
    """BambaConfig: the layers in `attn_layer_indices` attend, the others are Mamba-2; its
    rotary covers half of each head whatever the config says (hard-coded there)."""
    attends = raw.get("attn_layer_indices") or ()
    raw = {**raw, "layer_types": ["full_attention" if i in attends else "mamba"
                                  for i in range(int(raw["num_hidden_layers"]))],
           "partial_rotary_factor": 0.5}
    if isinstance(raw.get("rope_parameters"), dict):
        raw["rope_parameters"] = {**raw["rope_parameters"], "partial_rotary_factor": 0.5}
    return raw


def _lfm2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Lfm2Config: `tie_embedding` and `block_ff_dim` are older names that win; without
    `layer_types`, the layers in `full_attn_idxs` attend (every layer when it is absent)
    and the others convolve. Lfm2MLP's width is `intermediate_size` adjusted as
    `block_auto_adjust_ff_dim` says (2/3 of it, times `block_ffn_dim_multiplier`, rounded
    up to a multiple of `block_multiple_of`)."""
    raw = dict(raw)
    if "tie_embedding" in raw:
        raw["tie_word_embeddings"] = raw["tie_embedding"]
    if "block_ff_dim" in raw:
        raw["intermediate_size"] = raw["block_ff_dim"]
    if raw.get("layer_types") is None:
        count = int(raw["num_hidden_layers"])
        attends = raw.get("full_attn_idxs")
        attends = range(count) if attends is None else attends
        raw["layer_types"] = ["full_attention" if i in attends else "conv" for i in range(count)]
    if raw.get("block_auto_adjust_ff_dim", True):
        size = int(2 * int(raw["intermediate_size"]) / 3)
        multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            size = int(multiplier * size)
            multiple = int(raw.get("block_multiple_of", 256))
            size = multiple * ((size + multiple - 1) // multiple)
        raw["intermediate_size"] = size
    return raw


def _lfm3_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Lfm3Config: without rope_parameters, the sliding layers take a default rope on
    10000 and the global ones a proportional rope on 1e6 over half of each head's
    frequencies; without layer_types, layer 2 of every four attends globally, layer 0 of
    every four but the first slides and the others convolve. Unlike Lfm2Config it reads
    none of LFM2's older key names, and its MLP is intermediate_size wide as given."""
    raw = dict(raw)
    if raw.get("rope_parameters") is None:
        raw["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0,
                               "partial_rotary_factor": 0.5}}
    if raw.get("layer_types") is None:
        raw["layer_types"] = [
            "full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0
            else "conv" for i in range(int(raw["num_hidden_layers"]))]
    return raw


def _lfm3_unsupported(raw: dict[str, Any]) -> str | None:
    # Lfm3Model builds the sliding layers' mask from sliding_window and fails without one.
    if "sliding_attention" in raw["layer_types"] and raw.get("sliding_window") is None:
        return "layer_types has sliding_attention layers but sliding_window is null"
    return None


def _qwen3_5_layers(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3_5TextConfig: without `layer_types`, every `full_attention_interval`-th layer
    (4th by default) attends and the others are Gated DeltaNet."""
    if raw.get("layer_types") is None:
        interval = int(raw.get("full_attention_interval", 4))
        raw = {**raw, "layer_types": [
            "linear_attention" if (i + 1) % interval else "full_attention"
            for i in range(int(raw["num_hidden_layers"]))]}
    return raw


def _qwen3_5_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3_5MoeTextConfig: Qwen3.5's layer types; it has no dense MLP (every layer's is
    experts), so the reader's intermediate_size, which no layer uses, is the experts'."""
    return {**_qwen3_5_layers(raw), "intermediate_size": raw["moe_intermediate_size"]}


def _qwen3_5_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("num_experts"):
        return (f"routed experts are not supported in a qwen3_5_text config (num_experts="
                f"{raw['num_experts']}); Qwen3.5's MoE models are model_type qwen3_5_moe_text")
    return _delta_net_unsupported(raw)


def _delta_net_unsupported(raw: dict[str, Any]) -> str | None:
    # Qwen3.5's and Qwen3-Next's DeltaNet convolution takes hidden_act; export's is SiLU.
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        return (f"hidden_act {act!r} is not supported: the Gated DeltaNet layers' convolution "
                "takes it, and export's is SiLU (every Qwen3.5 and Qwen3-Next checkpoint's)")
    return None


# LaraMiniConfig's layers without `layer_types`: the released pattern, period five
LARA_MINI_PATTERN = ("linear_attention", "sliding_attention", "linear_attention",
                     "full_attention", "sliding_attention")


def _lara_mini_config(raw: dict[str, Any]) -> dict[str, Any]:
    """LaraMiniConfig: LARA_MINI_PATTERN without `layer_types`; no dense MLP (every layer's
    is experts), so the reader's intermediate_size, which no layer uses, is the experts'."""
    types = raw.get("layer_types") or [LARA_MINI_PATTERN[i % len(LARA_MINI_PATTERN)]
                                       for i in range(int(raw["num_hidden_layers"]))]
    return {**raw, "layer_types": types, "intermediate_size": raw["moe_intermediate_size"]}


def _olmo_hybrid_config(raw: dict[str, Any]) -> dict[str, Any]:
    """OlmoHybridConfig: without `layer_types` every 4th layer attends (the last one where
    none would); the DeltaNet's heads default from the attention's (num_attention_heads,
    key heads of 0.75 hidden / heads, value heads twice as wide)."""
    raw = dict(raw)
    count, heads = int(raw["num_hidden_layers"]), int(raw["num_attention_heads"])
    if raw.get("layer_types") is None:
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(count)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
        raw["layer_types"] = types
    defaults = {"linear_num_key_heads": heads, "linear_num_value_heads": heads}
    for key, value in defaults.items():
        raw[key] = value if raw.get(key) is None else raw[key]
    if raw.get("linear_key_head_dim") is None:
        raw["linear_key_head_dim"] = int(0.75 * int(raw["hidden_size"])
                                         / int(raw["linear_num_key_heads"]))
    if raw.get("linear_value_head_dim") is None:
        raw["linear_value_head_dim"] = 2 * int(raw["linear_key_head_dim"])
    return raw


def _olmo_hybrid_unsupported(raw: dict[str, Any]) -> str | None:
    params = raw.get("rope_parameters") or {}
    if "rope_theta" in params and params["rope_theta"] is None:
        return ("rope_parameters without a rope_theta (OLMo Hybrid's NoPE mode, no rotary "
                "on any layer) is not supported")
    return _delta_net_unsupported(raw)


# Qwen3.5 dense: Gated DeltaNet layers (3 of 4 by default) beside Qwen3-Next's gated
# attention (per-head (1+w) q/k RMSNorm, rotary on a quarter of each head); every RMSNorm
# but the DeltaNet's gated one scales by (1+w). Its multi-token-prediction head (`mtp.`)
# is not the causal LM's.
QWEN3_5 = FamilySpec(
    **ATTENTION_BIAS, norm="rms_plus_one", qk_norm="head", partial_rotary=True,
    delta_net=True, attn_gate=True, legacy=_qwen3_5_layers, refuse=_qwen3_5_unsupported,
    left_out=("mtp.", "model.visual."),
    defaults={"head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_num_key_heads": 16, "linear_num_value_heads": 32},
    quirks=("gated attention (q_proj gives an output gate)", "per-head q/k (1+w) RMSNorm",
            "(1+w) RMSNorm"),
)
# Qwen3.5-MoE (Qwen3.5-35B-A3B and larger): Qwen3.5's layers, each one's MLP routed experts
# beside a shared expert gated by sigmoid(shared_expert_gate(x)), as Qwen2-MoE's; its router
# always renormalizes the top k (it reads no norm_topk_prob).
QWEN3_5_MOE = replace(
    QWEN3_5, legacy=_qwen3_5_moe_config, refuse=_delta_net_unsupported,
    moe=MoeSpec(names=QWEN_SHARED_EXPERT, norm_key=None, renormalize=True),
    defaults={**QWEN3_5.defaults, "num_experts": 256, "num_experts_per_tok": 8,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512},
)
# Qwen3-Next (Qwen3-Next-80B-A3B): Qwen3.5-MoE's layers, its DeltaNet's input projections
# two whose rows are grouped per key head; experts (norm_topk_prob, true by default) on
# Qwen3-MoE's sparse layers, a dense MLP on the others (mlp_only_layers).
QWEN3_NEXT = replace(
    QWEN3_5, legacy=_qwen3_5_layers, refuse=_delta_net_unsupported, delta_grouped=True,
    left_out=("mtp.",),
    moe=MoeSpec(names=QWEN_SHARED_EXPERT, layers=sparse_layers),
    defaults={**QWEN3_5.defaults, "intermediate_size": 5632, "num_experts": 512,
              "num_experts_per_tok": 10, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
              "decoder_sparse_step": 1},
)
# Lara Mini (Lara-4-Mini): Qwen3-Next's layers with plain RMSNorms (x * w), Qwen3's
# attention (no output gate) sliding on `sliding_attention` layers, its `full_attention`
# layers without rotary; Qwen3.5's DeltaNet projections fused into one `in_proj` (as the
# checkpoints store them and transformers saves them) and its gated norm named out_norm;
# every layer's MLP experts (softmax, norm_topk_prob) beside an ungated shared expert.
LARA_MINI = FamilySpec(
    **ATTENTION_BIAS, qk_norm="head", window="always", global_nope=True, tie_default=True,
    delta_net=True, delta_names=DeltaNames(projections=("in_proj",), norm="out_norm"),
    legacy=_lara_mini_config, refuse=_delta_net_unsupported,
    moe=MoeSpec(names=replace(QWEN_SHARED_EXPERT, shared_gate=None)),
    defaults={"vocab_size": 151_936, "hidden_size": 1024, "num_hidden_layers": 34,
              "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
              "max_position_embeddings": 131_072, "sliding_window": 512, "rms_norm_eps": 1e-6,
              "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "linear_num_key_heads": 8,
              "linear_num_value_heads": 16, "num_experts": 128, "num_experts_per_tok": 4,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
              "norm_topk_prob": True},
    quirks=("per-head q/k RMSNorm", "full-attention layers without rotary"),
)
# OLMo Hybrid (Olmo-Hybrid-7B): OLMo 3's attention layers (norms after the sublayers, q/k
# RMSNorm over the whole projection, no window) beside Llama-style pre-norm Gated DeltaNet
# layers, whose projections are separate (q, k, v, the gate g, b, a), whose gated norm has
# an epsilon of its own (1e-5) and whose beta doubles (linear_allow_neg_eigval).
# As transformers saves it (and loads it, conversion_mapping.py): every layer's norm after
# its mixer (before the MLP in a DeltaNet layer, after the attention in an attention layer)
# is feedforward_layer_norm, a DeltaNet layer's input norm attention_layer_norm.
OLMO_HYBRID_NAMES = replace(LLAMA_NAMES, input_norm="attention_layer_norm",
                            post_attn_norm="feedforward_layer_norm")
OLMO_HYBRID = replace(
    OLMO2, delta_net=True, state_block="pre",
    names=OLMO_HYBRID_NAMES,
    delta_names=DeltaNames(projections=("q_proj", "k_proj", "v_proj", "g_proj", "b_proj",
                                        "a_proj"),
                           conv=("q_conv1d", "k_conv1d", "v_conv1d"), out="o_proj",
                           norm="o_norm"),
    delta_norm_eps=1e-5, delta_beta_key="linear_allow_neg_eigval",
    legacy=_olmo_hybrid_config, refuse=_olmo_hybrid_unsupported, ignores=("head_dim",),
    defaults={"vocab_size": 100_352, "hidden_size": 3840, "intermediate_size": 11_008,
              "num_hidden_layers": 32, "num_attention_heads": 30,
              "max_position_embeddings": 65_536, "rms_norm_eps": 1e-6,
              "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True},
    quirks=("norms after attention and MLP on the attention layers",
            "q/k RMSNorm over the whole projection", "Gated DeltaNet layers (pre-norm)",
            "DeltaNet beta doubled (linear_allow_neg_eigval)"),
)
# GraniteMoeHybridConfig's Mamba-2 keys and their defaults (BambaConfig's and
# FalconH1Config's too).
MAMBA_DEFAULTS = {"mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256,
                  "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2,
                  "mamba_conv_bias": True, "mamba_proj_bias": False}
# Bamba's and Falcon-H1's names: the MLP is `feed_forward`, its norm `pre_ff_layernorm`.
HYBRID_NAMES = replace(LLAMA_NAMES, final_norm="model.final_layernorm",
                       gate="feed_forward.gate_proj", up="feed_forward.up_proj",
                       down="feed_forward.down_proj", post_attn_norm="pre_ff_layernorm")
# Liquid's LFM2: gated short convolutions between attention layers (export/short_conv.py).
LFM2 = FamilySpec(
    names=replace(LLAMA_NAMES, final_norm="model.embedding_norm", o="self_attn.out_proj",
                  q_norm="self_attn.q_layernorm", k_norm="self_attn.k_layernorm",
                  gate="feed_forward.w1", up="feed_forward.w3", down="feed_forward.w2",
                  input_norm="operator_norm", post_attn_norm="ffn_norm"),
    qk_norm="head", conv=True, tie_default=True, act_key=None, eps_key="norm_eps",
    legacy=_lfm2_config,
    defaults={"norm_eps": 1e-5, "rope_theta": 1_000_000.0,
              "max_position_embeddings": 128_000, "conv_L_cache": 3},
    quirks=("per-head q/k RMSNorm",),
)
# Liquid's LFM3: LFM2's layers (as Qwen3's attention: o_proj, q_norm, k_norm) with sliding
# layers beside the global ones, each kind its own rope; an output gate per head and norms
# after each sublayer, each switched by the config; an MLP of intermediate_size as given.
LFM3_NAMES = replace(LLAMA_NAMES, final_norm="model.embedding_norm", gate="feed_forward.w1",
                     up="feed_forward.w3", down="feed_forward.w2", input_norm="operator_norm",
                     post_attn_norm="post_operator_norm", pre_mlp_norm="ffn_norm",
                     post_mlp_norm="post_ffn_norm")
LFM3 = FamilySpec(
    **ATTENTION_BIAS, names=LFM3_NAMES, block="sandwich", qk_norm="head", conv=True,
    window="always", tie_default=True, act_key=None, eps_key="norm_eps",
    block_from_config=lambda raw: "sandwich" if raw["use_sandwich_norm"] else "pre",
    block_names={"pre": replace(LFM3_NAMES, post_attn_norm="ffn_norm")},
    head_gate_key="use_attention_gate", rope_types=("proportional",), legacy=_lfm3_config,
    refuse=_lfm3_unsupported,
    # Lfm3Config's defaults (LFM3-1.7B's): head_dim is not hidden_size / heads
    defaults={"vocab_size": 128_000, "hidden_size": 2048, "intermediate_size": 7680,
              "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 128_000, "norm_eps": 1e-5,
              "rope_theta": 1_000_000.0, "conv_L_cache": 7, "sliding_window": 256,
              "use_sandwich_norm": True, "use_attention_gate": True},
    quirks=("per-head q/k RMSNorm",),
)


def _lfm2_moe_config(raw: dict[str, Any]) -> dict[str, Any]:
    # Lfm2MoeConfig: `tie_embedding`, the older name, wins; the dense MLP is
    # intermediate_size wide as given (no auto-adjust, unlike LFM2's).
    if "tie_embedding" in raw:
        raw = {**raw, "tie_word_embeddings": raw["tie_embedding"]}
    return raw


# LFM2-MoE (LFM2-8B-A1B): LFM2's short convolutions and attention, a dense MLP in the first
# num_dense_layers and routed experts after (sigmoid routing, an expert bias that chooses).
LFM2_MOE = replace(
    LFM2, legacy=_lfm2_moe_config, required=("layer_types",),
    moe=MoeSpec(names=MoeNames(router=("feed_forward.gate.weight",),
                               expert="feed_forward.experts.{j}.", gate="w1", up="w3",
                               down="w2",
                               fused_gate_up=("feed_forward.experts.gate_up_proj",),
                               fused_down=("feed_forward.experts.down_proj",),
                               expert_bias=("feed_forward.expert_bias",)),
                routing="sigmoid", layers=after_dense_layers, norm_eps=1e-6),
    defaults={**LFM2.defaults, "num_dense_layers": 2, "num_experts": 32,
              "num_experts_per_tok": 4, "moe_intermediate_size": 1792, "norm_topk_prob": True,
              "use_expert_bias": True, "routed_scaling_factor": 1.0, "intermediate_size": 7168,
              "tie_word_embeddings": True},
)
# Mamba-1 (MambaForCausalLM): Mamba-2's layout (`backbone.`, no MLP), its own mixer.
MAMBA1 = FamilySpec(
    names=replace(LLAMA_NAMES, embed=("model.embeddings.weight", "model.embedding.weight"),
                  final_norm="model.norm_f"),
    eps_key="layer_norm_epsilon", mamba=True, selective=True, blocks=True,
    attention_free=True, legacy=_mamba1_config, refuse=_mamba_unsupported,
    renames=(("backbone.", "model."),),
    # MambaConfig's defaults (a recurrent model has no position limit: export's cap)
    defaults={"state_size": 16, "expand": 2, "conv_kernel": 4, "use_bias": False,
              "use_conv_bias": True, "layer_norm_epsilon": 1e-5, "time_step_rank": "auto",
              "max_position_embeddings": 4096, "tie_word_embeddings": True},
    quirks=("no attention (no KV cache)",),
)

def _jamba_config(raw: dict[str, Any]) -> dict[str, Any]:
    """JambaConfig: layer i attends where i % attn_layer_period == attn_layer_offset, the
    others are Mamba-1 mixers (expand x hidden wide, read under MambaConfig's keys), whose
    dt, B and C RMS norms have weights (rms_norm_eps); no layer rotates."""
    count = int(raw["num_hidden_layers"])
    period, offset = int(raw["attn_layer_period"]), int(raw["attn_layer_offset"])
    return {**raw, "layer_types": ["full_attention" if i % period == offset else "mamba"
                                   for i in range(count)],
            "mamba_inner": int(raw["mamba_expand"]) * int(raw["hidden_size"]),
            "state_size": raw["mamba_d_state"], "conv_kernel": raw["mamba_d_conv"],
            "time_step_rank": raw["mamba_dt_rank"], "use_conv_bias": raw["mamba_conv_bias"],
            "use_bias": raw["mamba_proj_bias"], "mamba_bc_dt_eps": raw["rms_norm_eps"],
            "mamba_bc_dt_weighted": True, "no_rope_layer_interval": 1}


def _jamba_unsupported(raw: dict[str, Any]) -> str | None:
    # JambaConfig's validate_architecture
    for kind in ("attn", "expert"):
        period, offset = raw[f"{kind}_layer_period"], raw[f"{kind}_layer_offset"]
        if not 0 <= int(offset) < int(period):
            return f"{kind}_layer_offset ({offset}) must be 0 to {kind}_layer_period ({period})"
    return _mamba_unsupported(raw)


def _jamba_expert_layers(raw: dict[str, Any]) -> tuple[int, ...]:
    """JambaConfig's layers_num_experts: experts where i % expert_layer_period is
    expert_layer_offset, and only with more than one expert (one is the dense MLP)."""
    if int(raw["num_experts"]) < 2:
        return ()
    period, offset = int(raw["expert_layer_period"]), int(raw["expert_layer_offset"])
    return tuple(i for i in range(int(raw["num_hidden_layers"])) if i % period == offset)


# AI21's Jamba: Mamba-1 mixers (dt, B and C RMS-normed with weights) and attention without
# rotary, each followed by a gated MLP or, every expert_layer_period layers, routed experts
# (softmax top k, the weights not renormalized).
JAMBA = FamilySpec(
    names=HYBRID_NAMES,
    mamba=True, selective=True, legacy=_jamba_config, refuse=_jamba_unsupported,
    moe=MoeSpec(names=MoeNames(router=("feed_forward.router.weight",),
                               expert="feed_forward.experts.{j}.",
                               fused_gate_up=("feed_forward.experts.gate_up_proj",),
                               fused_down=("feed_forward.experts.down_proj",)),
                experts_keys=("num_experts", "num_local_experts"), width_key="intermediate_size",
                layers=_jamba_expert_layers, norm_key=None, scaling_key=None),
    # JambaConfig's defaults (Jamba-v0.1's)
    defaults={"vocab_size": 65_536, "hidden_size": 4096, "intermediate_size": 14_336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 262_144,
              "num_experts_per_tok": 2, "num_experts": 16, "expert_layer_period": 2,
              "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4,
              "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
              "mamba_dt_rank": "auto", "mamba_conv_bias": True, "mamba_proj_bias": False},
    quirks=("Mamba-1 mixers with dt, B and C RMS norms", "attention without rotary",
            "softmax top-k experts, not renormalized"),
)

# Zamba2Config's layers without `layers_block_type` (Zamba2-2.7B's 54)
ZAMBA2_LAYERS = (["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"]
                 + ["mamba"] * 3 + ["hybrid"] + ["mamba"] * 2)


def _zamba2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Zamba2Config: every layer (`layers_block_type`, whose legacy "mamba" is
    "linear_attention") a Mamba-2 mixer, the `hybrid` ones after a shared block
    (export/shared_block.py) whose attention has heads of 2 x hidden / heads scaled by
    (head_dim / 2)^-0.5 and rotary only with use_mem_rope; the mixer is n_mamba_heads of
    mamba_expand x hidden / n_mamba_heads, its conv biased whatever use_conv_bias says, its
    gated RMSNorm (gate first, per group) at 1e-5 and dt clamped below at time_step_min."""
    kinds = raw.get("layers_block_type") or raw.get("layer_types") or ZAMBA2_LAYERS
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    inner, mamba_heads = int(raw["mamba_expand"]) * hidden, int(raw["n_mamba_heads"])
    head_dim = 2 * hidden // heads
    return {**raw, "layer_types": ["mamba"] * len(kinds), "num_hidden_layers": len(kinds),
            "zamba_layer_kinds": kinds, "zamba_layer_count": raw["num_hidden_layers"],
            "zamba_hybrid_layers": [i for i, kind in enumerate(kinds) if kind == "hybrid"],
            "head_dim": head_dim, "query_pre_attn_scalar": head_dim / 2,
            "intermediate_size": raw.get("intermediate_size") or 4 * hidden,
            "mamba_n_heads": mamba_heads, "mamba_d_head": inner // mamba_heads,
            "mamba_n_groups": raw["mamba_ngroups"], "mamba_conv_bias": True,
            "mamba_proj_bias": raw["add_bias_linear"], "mamba_norm_eps": 1e-5,
            "time_step_limit": [raw["time_step_min"], float("inf")],
            **({} if raw["use_mem_rope"] else {"no_rope_layer_interval": 1})}


def _zamba2_unsupported(raw: dict[str, Any]) -> str | None:
    # the layer kinds as config.json gives them (the legacy reader made them all mamba)
    kinds = set(map(str, raw["zamba_layer_kinds"]))
    if not kinds <= {"mamba", "linear_attention", "hybrid"}:
        return (f"layers_block_type holds unsupported kinds: "
                f"{', '.join(sorted(kinds - {'mamba', 'linear_attention', 'hybrid'}))}")
    if "hybrid" not in kinds:
        return "layers_block_type has no hybrid layer; export needs at least one"
    count = raw["zamba_layer_count"]
    if int(count) != len(raw["zamba_layer_kinds"]):
        return (f"num_hidden_layers ({count}) must equal the number of layers_block_type "
                f"({len(raw['zamba_layer_kinds'])})")
    if raw.get("use_long_context"):
        return "use_long_context (its rescaled rope_theta) is not supported"
    return None


# ZambaConfig's layers without `layers_block_type`: two mamba layers, a hybrid one, then a
# hybrid one where i % attn_layer_period is attn_layer_offset (i counting from the fourth)
def _zamba_layers(raw: dict[str, Any]) -> list[str]:
    period, offset = int(raw["attn_layer_period"]), int(raw["attn_layer_offset"])
    return ["mamba", "mamba", "hybrid"] + [
        "hybrid" if i % period == offset else "mamba"
        for i in range(int(raw["num_hidden_layers"]) - 3)]


def _zamba_config(raw: dict[str, Any]) -> dict[str, Any]:
    """ZambaConfig: Zamba2's layout (one shared block, `shared_transf.`, with a plain gated
    MLP, no adapters, no rotary) around multi-head Mamba-1 mixers (export/mamba1_heads.py):
    mamba_expand x hidden channels in n_mamba_heads heads, a dt rank of hidden / 16 rounded
    up where "auto"; attention heads of attention_head_dim (2 x hidden / heads by default)
    scaled by (head_dim / 2)^-0.5."""
    kinds = raw.get("layers_block_type") or raw.get("layer_types") or _zamba_layers(raw)
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    head_dim = int(raw.get("attention_head_dim") or 2 * hidden // heads)
    return {**raw, "layer_types": ["mamba"] * len(kinds), "num_hidden_layers": len(kinds),
            "zamba_layer_kinds": kinds, "zamba_layer_count": raw["num_hidden_layers"],
            "zamba_hybrid_layers": [i for i, kind in enumerate(kinds) if kind == "hybrid"],
            "head_dim": head_dim, "query_pre_attn_scalar": head_dim / 2,
            "num_mem_blocks": 1, "use_shared_attention_adapter": False,
            "add_bias_linear": False, "zamba_shared_module": "shared_transf.",
            "zamba_mlp_adapters": False,
            "mamba_inner": int(raw["mamba_expand"]) * hidden,
            "mamba_heads_per_layer": raw["n_mamba_heads"], "state_size": raw["mamba_d_state"],
            "conv_kernel": raw["mamba_d_conv"], "time_step_rank": raw["mamba_dt_rank"],
            "use_conv_bias": raw["mamba_conv_bias"], "use_bias": raw["mamba_proj_bias"],
            "no_rope_layer_interval": 1}


def _zamba_unsupported(raw: dict[str, Any]) -> str | None:
    hidden = int(raw["hidden_size"])
    width = raw.get("attention_hidden_size")
    if width is not None and int(width) != 2 * hidden:
        return (f"attention_hidden_size {width} is not 2 x hidden_size ({2 * hidden}), the "
                "width of the shared block's input")
    act = raw.get("hidden_mamba_act", "silu")
    if act not in ("silu", "swish"):
        return f"hidden_mamba_act {act!r} is not supported; the mixer's convolution takes silu only"
    if (int(raw["mamba_expand"]) * hidden) % int(raw["n_mamba_heads"]):
        return "mamba_expand x hidden_size must be a multiple of n_mamba_heads"
    return _zamba2_unsupported(raw)


# Zyphra's Zamba (v1): Zamba2's shared block (one, without adapters) before the mixers of
# the hybrid layers, multi-head Mamba-1 mixers.
ZAMBA = FamilySpec(
    names=replace(LLAMA_NAMES, final_norm="model.final_layernorm"), mamba=True,
    selective=True, shared_block=True, tie_default=True, legacy=_zamba_config,
    refuse=_zamba_unsupported,
    # ZambaConfig's defaults (Zamba-7B-v1's)
    defaults={"vocab_size": 32_000, "hidden_size": 3712, "intermediate_size": 14_848,
              "num_hidden_layers": 76, "num_attention_heads": 16, "num_key_value_heads": 16,
              "n_mamba_heads": 2, "hidden_act": "gelu", "hidden_mamba_act": "silu",
              "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "attn_layer_period": 6,
              "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4,
              "mamba_expand": 2, "mamba_dt_rank": "auto", "mamba_conv_bias": True,
              "mamba_proj_bias": False, "tie_word_embeddings": True},
    quirks=("multi-head Mamba-1 layers, a shared attention + MLP block before some of them",
            "the shared block reads the stream beside the embeddings"),
)

# Zyphra's Zamba2: Mamba-2 layers, a shared attention + MLP block (of num_mem_blocks)
# before the mixer of every `hybrid` layer, on the stream beside the embeddings.
ZAMBA2 = FamilySpec(
    names=replace(LLAMA_NAMES, final_norm="model.final_layernorm"), mamba=True,
    shared_block=True, tie_default=True, legacy=_zamba2_config, refuse=_zamba2_unsupported,
    # Zamba2Config's defaults (Zamba2-2.7B's)
    defaults={"vocab_size": 32_000, "max_position_embeddings": 4096, "hidden_size": 2560,
              "num_hidden_layers": 54,
              "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1,
              "time_step_min": 0.001, "n_mamba_heads": 8, "add_bias_linear": False,
              "hidden_act": "gelu", "num_attention_heads": 32, "num_mem_blocks": 1,
              "use_shared_attention_adapter": False, "adapter_rank": 128,
              "use_mem_rope": False, "rms_norm_eps": 1e-5, "tie_word_embeddings": True},
    quirks=("Mamba-2 layers, shared attention + MLP blocks before some of them",
            "the shared blocks read the stream beside the embeddings",
            "per-application LoRA adapters"),
)

def _recurrent_gemma_config(raw: dict[str, Any]) -> dict[str, Any]:
    """RecurrentGemmaConfig: `block_types` repeated over the layers ("recurrent": an RG-LRU
    block, "attention": local attention within attention_window_size); its MLP is
    intermediate_size / 2 wide, its head_dim hidden / heads whatever the config says, its
    rotary on half of each head unless partial_rotary_factor says otherwise; the logits
    soft-capped at logits_soft_cap."""
    count = int(raw["num_hidden_layers"])
    kinds = (list(raw["block_types"]) * count)[:count]
    factor = raw.get("partial_rotary_factor", 0.5)
    raw = {**raw, "layer_types": ["rg_lru" if kind == "recurrent" else "sliding_attention"
                                  for kind in kinds],
           # sliding_window is the config class's alias of attention_window_size
           "sliding_window": raw.get("attention_window_size", raw.get("sliding_window", 2048)),
           "final_logit_softcapping": raw["logits_soft_cap"],
           "intermediate_size": int(raw["intermediate_size"]) // 2,
           "lru_width": raw.get("lru_width") or raw["hidden_size"],
           "head_dim": int(raw["hidden_size"]) // int(raw["num_attention_heads"]),
           "partial_rotary_factor": factor}
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        raw["rope_parameters"] = {"partial_rotary_factor": factor, **params}
    return raw


def _recurrent_gemma_unsupported(raw: dict[str, Any]) -> str | None:
    kinds = set(raw["block_types"]) - {"recurrent", "attention"}
    if kinds:
        return f"block_types holds unsupported kinds: {', '.join(sorted(map(str, kinds)))}"
    if "attention" not in raw["block_types"][: int(raw["num_hidden_layers"])]:
        return "block_types gives no attention layer; export needs at least one"
    return None


# Google's RecurrentGemma (Griffin): RG-LRU recurrent blocks and local attention (MQA,
# rotary on half of each head), Gemma's (1+w) RMSNorms, scaled embeddings and soft-capped
# logits; biases on the MLP, the recurrent block and o_proj.
RECURRENT_GEMMA = FamilySpec(
    names=replace(LLAMA_NAMES, final_norm="model.final_norm", q="temporal_block.q_proj",
                  k="temporal_block.k_proj", v="temporal_block.v_proj",
                  o="temporal_block.o_proj", gate="mlp_block.gate_proj",
                  up="mlp_block.up_proj", down="mlp_block.down_proj",
                  input_norm="temporal_pre_norm", post_attn_norm="channel_pre_norm"),
    norm="rms_plus_one", bias_key="attention_bias", o_bias=True, mlp_bias=True,
    partial_rotary=True, embed_scale="sqrt_hidden_bf16", tie_default=True,
    act_default="gelu_tanh", act_key="hidden_activation", window="always",
    softcaps=("final",), rg_lru=True, legacy=_recurrent_gemma_config,
    refuse=_recurrent_gemma_unsupported,
    # RecurrentGemmaConfig's defaults (recurrentgemma-2b's); it has no position limit (nor
    # the key): export's cap stands for it
    defaults={"num_hidden_layers": 26, "vocab_size": 256_000, "hidden_size": 2560,
              "intermediate_size": 3 * 2560, "num_attention_heads": 10,
              "conv1d_width": 4, "logits_soft_cap": 30.0,
              "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
              "block_types": ["recurrent", "recurrent", "attention"],
              "attention_bias": False, "tie_word_embeddings": True,
              "max_position_embeddings": 4096},
    quirks=("RG-LRU recurrent blocks (a conv and a float32 state) beside local attention",
            "embeddings times sqrt(hidden) rounded to bfloat16", "soft-capped logits"),
)

FAMILIES: dict[str, FamilySpec] = {
    # The language model alone; also as transformers 5 saves it after loading it from the
    # Hub's image-text checkpoint (AutoModelForCausalLM, as fine-tuning scripts load it):
    # with that checkpoint's names, `model.language_model.` (spec.SAVED_ALONE).
    "qwen3_5_text": replace(QWEN3_5, renames=SAVED_ALONE),
    # Qwen3_5ForConditionalGeneration (the Hub's Qwen3.5-0.8B/2B/4B/9B/27B): its language
    # model, exported alone; the outer config decides the tying (false unless it says
    # otherwise). M-RoPE sections (interleaved) are plain rotary on text positions.
    "qwen3_5": replace(
        QWEN3_5, nested="text_config", text_types=("qwen3_5_text",),
        renames=QWEN_VL["renames"], left_out=(*QWEN_VL["left_out"], "mtp."),
        outer={"tie_word_embeddings": False, "eos_token_id": None, "bos_token_id": None},
        quirks=(*QWEN3_5.quirks, *MROPE_QUIRKS),
    ),
    "qwen3_5_moe_text": replace(QWEN3_5_MOE, renames=SAVED_ALONE),  # as qwen3_5_text
    "qwen3_next": QWEN3_NEXT,
    # Qwen3_5MoeForConditionalGeneration (the Hub's Qwen3.5-35B-A3B etc.), as `qwen3_5`.
    "qwen3_5_moe": replace(
        QWEN3_5_MOE, nested="text_config", text_types=("qwen3_5_moe_text",),
        renames=QWEN_VL["renames"], left_out=(*QWEN_VL["left_out"], "mtp."),
        outer={"tie_word_embeddings": False, "eos_token_id": None, "bos_token_id": None},
        quirks=(*QWEN3_5.quirks, *MROPE_QUIRKS),
    ),
    "lara_mini": LARA_MINI,
    "olmo_hybrid": OLMO_HYBRID,
    # LFM2: most layers are gated short convolutions (in_proj to B, C, x; a depthwise causal
    # conv of B*x over conv_L_cache tokens; C times that; out_proj), the rest GQA attention
    # with per-head q/k RMSNorm; the final norm is `embedding_norm`.
    "lfm2": LFM2,
    "lfm3": LFM3,
    "lfm2_moe": LFM2_MOE,
    # Granite 4.0 dense (granite-4.0-micro, the -H models' Mamba-2 layers among attention
    # ones): Granite's multipliers, a gated MLP of fused weights (`shared_mlp`), and
    # rotary only with position_embedding_type "rope".
    "granitemoehybrid": FamilySpec(
        names=replace(LLAMA_NAMES, gate_up="shared_mlp.input_linear",
                      down="shared_mlp.output_linear"),
        **ATTENTION_BIAS, embed_scale="multiplier", legacy=_granite4_layers,
        refuse=_granite4_unsupported, mamba=True,
        defaults={"attention_multiplier": 1.0, "num_local_experts": 8,
                  "shared_intermediate_size": 1024, **MAMBA_DEFAULTS},
        quirks=("embedding, attention and residual multipliers", "logits scaling",
                "fused gate_up weights"),
    ),
    # Bamba: Mamba-2 layers, and attention ones (rotary on half of each head) where
    # attn_layer_indices says, each followed by a gated MLP.
    "bamba": FamilySpec(
        names=HYBRID_NAMES, bias_key="attention_bias", o_bias=None, partial_rotary=True,
        mamba=True, legacy=_bamba_config, unsupported=("mlp_bias",),
        defaults={"num_key_value_heads": 8, "max_position_embeddings": 262144,
                  "rms_norm_eps": 1e-5, **MAMBA_DEFAULTS},
    ),
    # Falcon-H1: attention and a Mamba-2 mixer side by side on each layer's input norm
    # (each keeps KV and states), muP multipliers on both and on the MLP.
    "falcon_h1": FamilySpec(
        names=HYBRID_NAMES, block="hybrid", bias_key="attention_bias", o_bias=None,
        embed_scale="multiplier", mamba=True, legacy=_falcon_h1_config, unsupported=("mlp_bias",),
        defaults={"num_key_value_heads": 8, "max_position_embeddings": 8192,
                  "rms_norm_eps": 1e-5, **MAMBA_DEFAULTS, "mamba_d_ssm": 1024,
                  "mamba_norm_before_gate": True,
                  "mamba_rms_norm": False, "projectors_bias": False,
                  "lm_head_multiplier": 1.0, "embedding_multiplier": 1.0},
        quirks=("attention and Mamba-2 side by side in every layer", "muP multipliers"),
    ),
    # Nemotron-H (Nemotron Nano 9B v2, Nemotron-H 4B/8B): blocks of one Mamba-2 mixer,
    # attention (without rotary) or ReLU-squared MLP each, read as pre-norm layers of a mixer
    # and the MLP after it (export/layer_groups.py).
    "nemotron_h": FamilySpec(
        names=replace(LLAMA_NAMES, embed=("model.embeddings.weight",), final_norm="model.norm_f",
                      gate="", up="mlp.up_proj", down="mlp.down_proj"),
        gated_mlp=False, act_default="relu2", act_key="mlp_hidden_act",
        eps_key="layer_norm_epsilon", mamba=True, blocks=True, legacy=_nemotron_h_config,
        refuse=_nemotron_h_unsupported, unsupported=("mlp_bias",),
        renames=(("backbone.", "model."),),
        defaults={"head_dim": 128, "num_key_value_heads": 8, "max_position_embeddings": 4096,
                  "intermediate_size": 21504, "layer_norm_epsilon": 1e-5,
                  "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8,
                  "ssm_state_size": 128, "conv_kernel": 4, "use_conv_bias": True,
                  "use_bias": False, "time_step_min": 0.001},
        quirks=("blocks of one Mamba-2 mixer, attention or MLP, each after its own norm",
                "ReLU-squared MLP without a gate"),
    ),
    # Mamba-2 (Mamba2ForCausalLM: mamba-codestral, the state-spaces mamba2 models): every
    # layer one Mamba-2 mixer after an RMS norm, nothing attends, so the bundle has no KV
    # (export/layer_groups.py reads the layers as Nemotron-H's mixer blocks).
    "mamba2": FamilySpec(
        names=replace(LLAMA_NAMES, embed=("model.embeddings.weight", "model.embedding.weight"),
                      final_norm="model.norm_f"),
        eps_key="layer_norm_epsilon", mamba=True, blocks=True, attention_free=True,
        legacy=_mamba2_config, refuse=_mamba_unsupported, renames=(("backbone.", "model."),),
        # Mamba2Config's defaults; a recurrent model has no position limit, so a bundle's
        # context defaults to export's cap
        defaults={"num_heads": 128, "head_dim": 64, "n_groups": 8, "state_size": 128,
                  "conv_kernel": 4, "expand": 2, "use_bias": False, "use_conv_bias": True,
                  "layer_norm_epsilon": 1e-5, "max_position_embeddings": 4096,
                  "tie_word_embeddings": False},
        quirks=("no attention (no KV cache)",),
    ),
    # Mamba (Mamba-1, state-spaces/mamba-*-hf) and Falcon-Mamba 7B, whose mixer RMS-norms
    # B, C and dt without weight: every layer one selective-scan mixer after an RMS norm,
    # nothing attends (export/mamba1.py, on Mamba-2's Scan body).
    "mamba": MAMBA1,
    "falcon_mamba": replace(MAMBA1, legacy=_falcon_mamba_config,
                            defaults={**MAMBA1.defaults, "mixer_rms_eps": 1e-6},
                            quirks=(*MAMBA1.quirks, "B, C and dt RMS-normed without weight")),
    # Jamba (ai21labs/Jamba-v0.1, AI21-Jamba-Mini-1.6, AI21-Jamba-Large-1.6)
    "jamba": JAMBA,
    # Zamba2 (Zyphra/Zamba2-1.2B, -2.7B, -7B and their -instruct models)
    "zamba2": ZAMBA2,
    # RecurrentGemma (google/recurrentgemma-2b, -9b and their -it models)
    "recurrent_gemma": RECURRENT_GEMMA,
    # Zamba (Zyphra/Zamba-7B-v1)
    "zamba": ZAMBA,
}
