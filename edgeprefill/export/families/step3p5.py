"""StepFun's Step 3.5 / 3.7 language model (`step3p5`, transformers' Step3p7TextConfig: the
language model of `step3p7`, Step 3.7's image-text checkpoints), read as transformers'
Step3p7TextModel reads it: Laguna's layout (per-head q/k norms; sliding and full layers,
each type a rope base and rotated share of its own; an output gate of its own projection,
per head or per channel by `gating`; a dense MLP on the `dense` layers of
`mlp_layer_types`, experts on the `sparse` ones: the top k of sigmoid(logits) + bias,
weighed by the sigmoid alone, renormalized, times `moe_router_scaling_factor`, beside an
ungated shared MLP of `share_expert_dim`) with Gemma's norms (x * (1 + w), the q/k norms
too), a sigmoid gate, the sliding layers' query heads of their own
(`num_sliding_attention_heads`), scores scaled by `query_pre_attn_scalar` ** -0.5 (head_dim
where null) and SwiGLU clamped per layer (export/swiglu_clamps.py).

The Hub's config.json (Step-3.5-Flash's, Step 3.7's text_config) as the config class reads
it: the aliases of its attribute_map (moe_num_experts, moe_top_k, num_attention_groups,
share_expert_dims), `moe_layers_enum` (the sparse layers; all from the 4th without it),
`attention_other_setting` (the sliding layers' query heads), `rope_theta` and
`partial_rotary_factors` per layer (each layer type's taken from its first layer),
`rope_scaling` on the full layers' rope, and per-layer lists padded with the
`num_nextn_predict_layers` multi-token-prediction layers' entries (cut off; their weights
are left out). Its tensors as the Hub stores them (what transformers saves):
`moe.gate.weight`, `moe.router_bias`, `moe.{gate,up,down}_proj.weight` stacked per layer
[E, I, H] / [E, H, I], `share_expert.`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import MoeNames, MoeSpec, mlp_layer_types_sparse
from edgeprefill.export.families.dense import ATTENTION_BIAS
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec

# Step3p7TextConfig.attribute_map: config.json's names -> the fields they set
ALIASES = {"moe_num_experts": "n_routed_experts", "moe_top_k": "num_experts_per_tok",
           "num_attention_groups": "num_key_value_heads",
           "share_expert_dims": "share_expert_dim", "num_mtp_layers": "num_nextn_predict_layers"}
# The per-layer lists the Hub pads with the multi-token-prediction layers' entries
PADDED = ("layer_types", "mlp_layer_types", "swiglu_limits", "swiglu_limits_shared",
          "rope_theta", "partial_rotary_factors")
LAYER_TYPES = ("full_attention", "sliding_attention")
FIRST_SPARSE = 3  # without moe_layers_enum, the layers from the 4th are sparse


def _step3p5_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Step3p7TextConfig.__post_init__'s fields from the Hub's keys and its own saves."""
    raw = dict(raw)
    for alias, key in ALIASES.items():
        if alias in raw:  # as the config class sets them, after the fields
            raw[key] = raw.pop(alias)
    count = int(raw["num_hidden_layers"])
    extra = int(raw.get("num_nextn_predict_layers") or 0)
    for key in PADDED:
        if extra and isinstance(raw.get(key), list) and len(raw[key]) == count + extra:
            raw[key] = raw[key][:count]
    types = raw["layer_types"] if raw.get("layer_types") is not None \
        else ["full_attention"] * count
    mlp = raw["mlp_layer_types"] if raw.get("mlp_layer_types") is not None \
        else _mlp_layer_types(raw.get("moe_layers_enum"), count)
    out = {k: v for k, v in raw.items()
           if k not in ("rope_theta", "rope_scaling", "partial_rotary_factors")}
    return {**out, "layer_types": types, "mlp_layer_types": mlp,
            "num_attention_heads_per_layer": _heads(raw, types),
            "rope_parameters": _ropes(raw, types, count),
            "shared_expert_intermediate_size": raw["share_expert_dim"],
            # the config class names it silu whatever the Hub's says ("swigluoai")
            "hidden_act": "silu",
            "query_pre_attn_scalar": raw.get("query_pre_attn_scalar") or raw["head_dim"]}


def _mlp_layer_types(enum: Any, count: int) -> list[str]:
    """`moe_layers_enum` (a comma-separated string or a list of layer indices) as the
    config class reads it into mlp_layer_types."""
    if enum is None:
        sparse = set(range(FIRST_SPARSE, count))
    else:
        items = enum.split(",") if isinstance(enum, str) else list(enum)
        sparse = {int(i) for i in items if str(i).strip()}
    return ["sparse" if i in sparse else "dense" for i in range(count)]


def _heads(raw: dict[str, Any], types: list[str]) -> list[int]:
    """Each layer's query heads: `per_layer_config`'s (transformers' saves), else
    num_sliding_attention_heads (or attention_other_setting's num_attention_heads, the
    Hub's) on the sliding layers, num_attention_heads elsewhere."""
    heads = int(raw["num_attention_heads"])
    table = raw.get("per_layer_config")
    if table is None:
        sliding = raw.get("num_sliding_attention_heads")
        other = raw.get("attention_other_setting")
        if other is not None and not isinstance(other, dict):
            raise ValueError("attention_other_setting must be an object")
        if sliding is None:
            sliding = other.get("num_attention_heads", heads) if other else heads
        table = {i: {"num_attention_heads": sliding}
                 for i, kind in enumerate(types) if kind == "sliding_attention"}
    if not isinstance(table, dict):
        raise ValueError("per_layer_config must be an object of layer -> overrides")
    out = [heads] * len(types)
    for key, overrides in table.items():
        unknown = set(overrides) - {"num_attention_heads"}
        if unknown or not 0 <= int(key) < len(types):
            raise ValueError(f"per_layer_config[{key}] overrides {sorted(overrides)}; only "
                             f"num_attention_heads of layers 0 to {len(types) - 1}")
        out[int(key)] = overrides.get("num_attention_heads", heads)
    return out


def _ropes(raw: dict[str, Any], types: list[str], count: int) -> dict[str, Any]:
    """rope_parameters keyed by layer type: as saved where every type has its entry, else
    each type's from its first layer's rope_theta (a list, or one for all; 10000 where
    absent) and partial_rotary_factors, rope_scaling merged into the full layers'."""
    saved = raw.get("rope_parameters") or {}
    kinds = sorted(set(types))
    if isinstance(saved, dict) and all(isinstance(saved.get(k), dict) for k in kinds):
        return {k: saved[k] for k in kinds}
    theta = raw.get("rope_theta", 10000.0)
    factors = raw.get("partial_rotary_factors")
    for key, value in (("rope_theta", theta), ("partial_rotary_factors", factors)):
        if isinstance(value, list) and len(value) != count:
            raise ValueError(f"{key} lists {len(value)} layers; num_hidden_layers is {count}")
    thetas = theta if isinstance(theta, list) else [theta] * count
    ropes: dict[str, Any] = {}
    for kind in kinds:
        first = types.index(kind)
        ropes[kind] = {"rope_type": "default", "rope_theta": thetas[first]}
        if factors:
            ropes[kind]["partial_rotary_factor"] = factors[first]
    scaling = raw.get("rope_scaling")
    if scaling and "full_attention" in ropes:
        ropes["full_attention"] = {**ropes["full_attention"], **scaling}
    return ropes


def _step3p5_refuse(raw: dict[str, Any]) -> str | None:
    """What export cannot compute as Step3p7TextModel does, and a window-less sliding layer."""
    count = int(raw["num_hidden_layers"])
    for key in ("layer_types", "mlp_layer_types"):
        if len(raw[key]) != count:
            return f"{key} lists {len(raw[key])} layers; num_hidden_layers is {count}"
    unknown = set(raw["layer_types"]) - set(LAYER_TYPES)
    if unknown:  # MiniMax-M3's sparse attention (sparse_attention_config) among them
        return (f"layer_types holds {', '.join(sorted(map(str, unknown)))}; only "
                "full_attention and sliding_attention layers are supported")
    unknown = set(raw["mlp_layer_types"]) - {"dense", "sparse"}
    if unknown:
        return f"mlp_layer_types holds {', '.join(sorted(map(str, unknown)))}; dense or sparse"
    if "sliding_attention" in raw["layer_types"] and raw.get("sliding_window") is None:
        return "config.json needs sliding_window (layer_types has sliding_attention layers)"
    if raw.get("mlp_bias"):  # the shared expert's biases, which export does not read
        return "mlp_bias=true is not supported"
    return None


STEP3P5_NAMES = replace(LLAMA_NAMES, head_gate=("self_attn.g_proj",))
STEP3P5 = FamilySpec(
    **ATTENTION_BIAS, names=STEP3P5_NAMES, norm="rms_plus_one", qk_norm="head",
    window="always", sigmoid_gate=True, swiglu_clamps="after", rotary_per_type=True,
    heads_per_layer=("num_attention_heads_per_layer", "num_key_value_heads"),
    legacy=_step3p5_config, refuse=_step3p5_refuse,
    # (the config class ignores a top-level one: each layer type's rope has its own)
    ignores=("partial_rotary_factor",),
    moe=MoeSpec(names=MoeNames(router=("moe.gate.weight",), expert_bias=("moe.router_bias",),
                               split_gate_up=("moe.gate_proj.weight", "moe.up_proj.weight"),
                               fused_down=("moe.down_proj.weight",), shared="share_expert."),
                routing="sigmoid", experts_keys=("n_routed_experts",),
                layers=mlp_layer_types_sparse, norm_key=None, renormalize=True,
                bias_key=None, scaling_key="moe_router_scaling_factor"),
    defaults={"vocab_size": 128815, "hidden_size": 4096, "intermediate_size": 11264,
              "num_hidden_layers": 45, "num_attention_heads": 64, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 128000, "rms_norm_eps": 1e-5,
              "n_routed_experts": 288, "num_experts_per_tok": 8,
              "moe_intermediate_size": 1280, "share_expert_dim": 1280,
              "moe_router_scaling_factor": 1.0},
    quirks=("per-head q/k RMSNorm (1 + w)", "a sigmoid attention output gate (its own "
            "projection)", "query heads per layer type", "a rotary base and width per layer "
            "type", "sigmoid routing", "clamped SwiGLU per layer"),
)

FAMILIES: dict[str, FamilySpec] = {"step3p5": STEP3P5}
