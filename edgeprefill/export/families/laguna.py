"""Poolside's Laguna (`laguna`, e.g. poolside/laguna-XS.2), read as transformers' Laguna
reads it: AFMoE's attention (per-head q/k RMSNorm, sliding and full layers) with a
softplus output gate of its own projection (`g_proj`: per head, or per channel by
`gating`), query heads per layer (`num_attention_heads_per_layer`), a rope per layer type
each rotating its own share of the head (`rope_parameters` keyed by layer type), in a
pre-norm block; a dense MLP on the `dense` layers of `mlp_layer_types` and experts on the
`sparse` ones: the top k of sigmoid(logits) + `e_score_correction_bias` (the logits
tanh-soft-capped first where `moe_router_logit_softcapping` is above 0), weighed by the
sigmoid alone, renormalized (no epsilon), times `moe_routed_scaling_factor`, beside an
ungated shared MLP.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import MoeNames, MoeSpec, mlp_layer_types_sparse
from edgeprefill.export.families.dense import ATTENTION_BIAS
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec

# LagunaConfig's rope where config.json has none
LAGUNA_ROPES = {
    "full_attention": {"rope_type": "default", "rope_theta": 500000.0,
                       "partial_rotary_factor": 0.5},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                          "partial_rotary_factor": 1.0},
}


def _laguna_config(raw: dict[str, Any]) -> dict[str, Any]:
    """LagunaConfig.__post_init__'s lists where config.json leaves them out: every layer
    full attention, the first MLP dense and the rest sparse, num_attention_heads on each
    layer; its rope per layer type (a top-level rope_theta it ignores)."""
    count = int(raw["num_hidden_layers"])
    heads = raw.get("num_attention_heads_per_layer")
    return {**raw,
            "layer_types": raw.get("layer_types") or ["full_attention"] * count,
            "mlp_layer_types": raw.get("mlp_layer_types")
            or ["dense"] + ["sparse"] * (count - 1),
            "num_attention_heads_per_layer": [int(raw["num_attention_heads"])] * count
            if heads is None else heads,
            "rope_parameters": raw.get("rope_parameters") or LAGUNA_ROPES}


def _laguna_refuse(raw: dict[str, Any]) -> str | None:
    """What LagunaConfig or its model refuses or fails on, and a window-less sliding layer."""
    if raw.get("moe_apply_router_weight_on_input"):  # LagunaConfig raises on it
        return ("moe_apply_router_weight_on_input=true is not supported (transformers' "
                "Laguna refuses it too)")
    if raw.get("rope_scaling") is not None:  # it replaces the per-type dict, which fails
        return "rope_scaling is not supported; Laguna's rope_parameters are keyed by layer type"
    for kind, count in (("layer_types", raw["num_hidden_layers"]),
                        ("mlp_layer_types", raw["num_hidden_layers"])):
        if len(raw[kind]) != int(count):
            return f"{kind} lists {len(raw[kind])} layers; num_hidden_layers is {count}"
    ropes = raw["rope_parameters"]
    for kind in sorted(set(raw["layer_types"])):
        entry = ropes.get(kind) if isinstance(ropes, dict) else None
        if not isinstance(entry, dict) or "rope_theta" not in entry:
            return (f"rope_parameters needs a {kind} entry with rope_theta (Laguna's rotary "
                    "reads one per layer type)")
    unknown = set(raw["mlp_layer_types"]) - {"dense", "sparse"}
    if unknown:
        return f"mlp_layer_types holds {', '.join(sorted(map(str, unknown)))}; dense or sparse"
    if "sliding_attention" in raw["layer_types"] and raw.get("sliding_window") is None:
        # its sliding layers would then attend without a window, rotated by their own rope
        return "config.json needs sliding_window (layer_types has sliding_attention layers)"
    return None


LAGUNA = FamilySpec(
    **ATTENTION_BIAS, names=replace(LLAMA_NAMES, head_gate=("self_attn.g_proj",)),
    qk_norm="head", window="always", softplus_gate=True, rotary_per_type=True,
    heads_per_layer=("num_attention_heads_per_layer", "num_key_value_heads"),
    legacy=_laguna_config, refuse=_laguna_refuse,
    # the Hub's names (what save_pretrained writes), read as transformers renames them
    segment_renames=((".mlp.shared_expert.", ".mlp.shared_experts."),
                     (".mlp.experts.e_score_correction_bias",
                      ".mlp.gate.e_score_correction_bias")),
    moe=MoeSpec(names=MoeNames(expert_bias=("mlp.gate.e_score_correction_bias",),
                               shared="mlp.shared_experts."),
                routing="sigmoid", layers=mlp_layer_types_sparse, norm_key=None,
                renormalize=True, bias_key=None, scaling_key="moe_routed_scaling_factor",
                softcap_key="moe_router_logit_softcapping"),
    defaults={"vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192,
              "num_hidden_layers": 40, "num_attention_heads": 48, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
              "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512, "sliding_window": 512,
              "moe_routed_scaling_factor": 1.0, "moe_router_logit_softcapping": 0.0},
    quirks=("per-head q/k RMSNorm", "a softplus attention output gate (its own projection)",
            "query heads per layer", "a rotary base and width per layer type",
            "sigmoid routing"),
)

FAMILIES: dict[str, FamilySpec] = {"laguna": LAGUNA}
