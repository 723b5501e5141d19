"""Muse Glimmer (`muse_glimmer`, e.g. meta-models/Muse-Glimmer-30B) and Muse Spark
(`muse_spark`, e.g. meta-models/Muse-Spark-Open-816B-A42B).

Muse Glimmer: the language model of
MuseGlimmerForConditionalGeneration, exported alone, read as transformers 5.24's
MuseGlimmerTextModel computes it: the embedding RMS-normed without weight, Gemma 2's
sandwich of (1 + w) RMSNorms (those after each sublayer at their own `post_norm_eps`),
q and k RMS-normed per head without weight and q times `qk_scale_factor` (before rotary,
so the scores' scale is qk_scale_factor / sqrt(head_dim)), a sigmoid output gate of its
own projection (`self_attn.gate_proj`, one per channel), sliding layers beside full ones
without rotary, a final RMSNorm of x * w, and the logits times `output_multiplier` before
the final soft-cap.

Its rotary: a layer whose `layer_rope_theta` is 0 goes without; every other layer
rotates on the global `rope_parameters`, whatever its own entry says (transformers'
model builds one rotary table and reads the list for zeros only).

Muse Spark: the language model of MuseSparkForConditionalGeneration, read as transformers
5.24's MuseSparkTextModel computes it: Muse Glimmer's embedding, attention (each head's
output also RMS-normed without weight before the gate), rotary, final norm and logits; its
sandwich's norms after the sublayers at `post_norm_eps`: without weight after the
attention, input-scaled after the MLP (RMS of x * (1 + w)); each residual add gated per
channel (export/residual_gate.py); the MLPs of `mlp_layer_types`' "sparse" layers routed
experts of their own width `moe_hidden_size` between two projections, the router on the
layer's normed input (sigmoid of its logits times `output_multiplier`, the top k of those
plus its selection bias, renormalized + 1e-15, times `routed_scaling_factor`), their input
a (1 + w) RMSNorm of the first projection, each expert's output input-scaled RMS-normed
before its weight. Its LM head is never tied (its class ties nothing).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import MoeNames, MoeSpec, mlp_layer_types_sparse
from edgeprefill.export.families.dense import IMAGE_TEXT_QUIRK
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec
from edgeprefill.export.families.wrapped import towers_left_out


def _every_fourth_from_last(raw: dict[str, Any]) -> list[bool]:
    """MuseGlimmerTextConfig's full NoPE layers: every 4th, counted back from the last."""
    count = int(raw["num_hidden_layers"])
    return [(count - 1 - i) % 4 == 0 for i in range(count)]


def _glimmer_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MuseGlimmerTextConfig.__post_init__'s lists where config.json leaves them out, and
    its model's scales in the keys export reads: the NoPE layers (`layer_rope_theta`'s
    zeros) as `no_rope_layers`, q's factor in `attention_multiplier`, the logits' in
    `logit_scale`."""
    raw = dict(raw)
    full = _every_fourth_from_last(raw)
    if raw.get("layer_types") is None:
        raw["layer_types"] = ["full_attention" if f else "sliding_attention" for f in full]
    thetas = raw.get("layer_rope_theta")
    raw["no_rope_layers"] = [int(not f) for f in full] if thetas is None else \
        [int(bool(theta)) for theta in thetas]
    head_dim = int(raw["head_dim"])
    raw["attention_multiplier"] = float(raw["qk_scale_factor"]) * head_dim**-0.5
    raw["logit_scale"] = float(raw["output_multiplier"])
    return raw


def _glimmer_refuse(raw: dict[str, Any]) -> str | None:
    thetas = raw.get("layer_rope_theta")
    if thetas is not None and len(thetas) != int(raw["num_hidden_layers"]):
        return (f"layer_rope_theta lists {len(thetas)} layers; num_hidden_layers is "
                f"{raw['num_hidden_layers']}")
    if raw.get("attention_bias"):
        # its q/k/v/o projections would have biases and its gate_proj none
        return "attention_bias=true is not supported for Muse Glimmer"
    return None


# MuseGlimmerTextConfig's defaults (its token ids, 200000 and 200001, left to config.json
# and generation_config.json, which carry them)
GLIMMER_DEFAULTS = {
    "vocab_size": 202_048, "hidden_size": 6656, "intermediate_size": 19968,
    "num_hidden_layers": 52, "num_attention_heads": 32, "num_key_value_heads": 2,
    "head_dim": 128, "hidden_activation": "silu", "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-5, "sliding_window": 2048, "final_logit_softcapping": 20.0,
    "qk_scale_factor": 3.87, "output_multiplier": 0.19611613513818404, "post_norm_eps": 1e-8,
}
MUSE_GLIMMER = FamilySpec(
    names=replace(LLAMA_NAMES, attn_gate="self_attn.gate_proj"),
    norm="rms_plus_one", block="sandwich", qk_norm="weightless", attn_gate=True,
    embed_norm_weightless=True, final_norm_kind="rms", post_norm_eps_key="post_norm_eps",
    window="always", softcaps=("final",), act_key="hidden_activation",
    legacy=_glimmer_config, refuse=_glimmer_refuse, defaults=GLIMMER_DEFAULTS,
    # the outer config's tie_word_embeddings ties (its class has no such key: false)
    nested="text_config", text_types=("muse_glimmer_text",),
    outer={"tie_word_embeddings": False},
    renames=(("model.language_model.", "model."),),
    left_out=towers_left_out(("vision_tower.", "vision_adapter.", "vision_projection.")),
    quirks=("embedding RMS-normed without weight", "(1+w) RMSNorm",
            "norms before and after attention and MLP",
            "per-head q/k RMSNorm without weight, q scaled",
            "attention output gate (its own projection)",
            "full-attention layers without rotary", "final norm x*w",
            "logits scaled before the final soft-cap", IMAGE_TEXT_QUIRK),
)



def _spark_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Muse Glimmer's reading, and the LM head untied whatever the configs say
    (MuseSparkForConditionalGeneration has no tied weights)."""
    return {**_glimmer_config(raw), "tie_word_embeddings": False}


def _spark_refuse(raw: dict[str, Any]) -> str | None:
    kinds = raw.get("mlp_layer_types")
    if kinds is not None:
        if len(kinds) != int(raw["num_hidden_layers"]):
            return (f"mlp_layer_types lists {len(kinds)} layers; num_hidden_layers is "
                    f"{raw['num_hidden_layers']}")
        other = sorted(set(kinds) - {"dense", "sparse"})
        if other:
            return f"mlp_layer_types {other[0]!r} is not supported (dense or sparse)"
    return _glimmer_refuse(raw)


# MuseSparkTextConfig's defaults (its token ids, 200000 and 200001, left to config.json)
SPARK_DEFAULTS = {
    "vocab_size": 202_048, "hidden_size": 8192, "intermediate_size": 16384,
    "num_hidden_layers": 62, "num_attention_heads": 128, "num_key_value_heads": 16,
    "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 1_048_576,
    "rms_norm_eps": 1e-5, "sliding_window": 2048, "final_logit_softcapping": 20.0,
    "qk_scale_factor": 5.4730064863875, "output_multiplier": 0.1767766952966369,
    "post_norm_eps": 1e-8, "rope_parameters": {"rope_type": "default", "rope_theta": 500_000.0},
    "moe_intermediate_size": 4096, "num_local_experts": 256, "num_experts_per_tok": 8,
    "routed_scaling_factor": 1.0, "moe_hidden_size": 4096, "residual_gate_temperature": 0.3,
}
SPARK_EXPERTS = MoeSpec(
    names=MoeNames(expert_bias=("mlp.gate.e_score_correction_bias",),
                   pre_proj="mlp.pre_expert_proj", pre_norm="mlp.pre_expert_norm",
                   expert_norm="mlp.experts.post_expert_norm", post_proj="mlp.post_expert_proj"),
    routing="sigmoid", experts_keys=("num_local_experts",), layers=mlp_layer_types_sparse,
    norm_key=None, renormalize=True, norm_eps=1e-15, bias_key=None,
    inner_width_key="moe_hidden_size", logit_scale_key="output_multiplier",
    expert_norm_eps_key="post_norm_eps")
MUSE_SPARK = replace(
    MUSE_GLIMMER, act_key="hidden_act", post_norm_kinds=("rms_no_weight", "rms_input_scaled"),
    out_norm_weightless=True, residual_gate_key="residual_gate_temperature",
    moe=SPARK_EXPERTS, legacy=_spark_config, refuse=_spark_refuse, defaults=SPARK_DEFAULTS,
    text_types=("muse_spark_text",), outer={},
    left_out=towers_left_out(("vision_tower.", "vision_adapter.", "vision_projection.",
                              "audio_tower.")),
    quirks=("embedding RMS-normed without weight", "(1+w) RMSNorm",
            "norms before and after attention and MLP (after: without weight, input-scaled)",
            "per-head q/k RMSNorm without weight, q scaled",
            "each head's attention output RMS-normed without weight",
            "attention output gate (its own projection)", "gated residual adds",
            "routed experts between projections, each expert's output normed",
            "full-attention layers without rotary", "final norm x*w",
            "logits scaled before the final soft-cap", IMAGE_TEXT_QUIRK),
)

FAMILIES: dict[str, FamilySpec] = {"muse_glimmer": MUSE_GLIMMER, "muse_spark": MUSE_SPARK}
