"""Apple's OpenELM (`model_type: openelm`, remote code: configuration_openelm.py and
modeling_openelm.py; transformers has no class for it): a Llama-like decoder whose layers
grow with depth (layer-wise scaling). Each layer has query heads, KV heads and an FFN
width of its own, derived from `qkv_multipliers`, `num_gqa_groups` and `ffn_multipliers`
as OpenELMConfig.__post_init__ derives them; q, k and v are one projection (all query
heads, then the keys, then the values), each head's q and k RMS-normed before rotary
(`normalize_qk_projections`), the FFN's gate and up one projection (gate first).
"""

from __future__ import annotations

from numbers import Number
from typing import Any

import numpy as np

from edgeprefill.export.families.spec import FamilySpec, TensorNames

NAMES = TensorNames(
    embed=("transformer.token_embeddings.weight",), final_norm="transformer.norm",
    lm_head=("lm_head",), layer="transformer.layers.{i}.", qkv="attn.qkv_proj",
    o="attn.out_proj", q_norm="attn.q_norm", k_norm="attn.k_norm", gate_up="ffn.proj_1",
    down="ffn.proj_2", input_norm="attn_norm", post_attn_norm="ffn_norm",
)
# The config keys export reads each layer's head counts from, as the legacy hook fills them.
HEAD_LISTS = ("num_query_heads", "num_kv_heads")


def make_divisible(value: float, divisor: int) -> int:
    """configuration_openelm.make_divisible: `value` rounded to a multiple of `divisor`
    (at least one), never more than 10% below it."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _per_layer(multipliers: Any, layers: int, key: str, pair_only: bool) -> list[float]:
    """One multiplier per layer: a number for all, a pair spread linearly from the first
    layer to the last (rounded to 2 decimals, as numpy rounds them), or (`pair_only`
    false: ffn_multipliers) one per layer already."""
    if isinstance(multipliers, Number) and not isinstance(multipliers, bool):
        return [float(multipliers)] * layers
    if isinstance(multipliers, list) and len(multipliers) == 2:
        return [float(round(v, 2)) for v in np.linspace(float(multipliers[0]),
                                                          float(multipliers[1]), num=layers)]
    if isinstance(multipliers, list) and not pair_only and len(multipliers) == layers:
        return [float(v) for v in multipliers]
    what = "a number or a pair" if pair_only else "a number, a pair or one per layer"
    raise ValueError(f"{key} must be {what} (OpenELMConfig), got {multipliers!r}")


def _openelm_config(raw: dict[str, Any]) -> dict[str, Any]:
    """OpenELMConfig read into the reader's keys. Query heads come from qkv_multipliers
    whatever num_query_heads a config.json lists (__post_init__ recomputes them); a listed
    num_kv_heads stands (PretrainedConfig sets the extra key after __post_init__), else
    query heads / num_gqa_groups. Each FFN is make_divisible(multiplier x model_dim,
    ffn_dim_divisor) wide: the graph reads it from the weights, intermediate_size is the
    widest. The norms' epsilon is OpenELMRMSNorm's 1e-6 (no key sets it); the head is the
    embedding where share_input_output_layers, or where transformers ties a stored
    lm_head to it (tie_word_embeddings, true unless set false)."""
    layers, dim, head_dim, groups, divisor = (_positive(raw, key) for key in (
        "num_transformer_layers", "model_dim", "head_dim", "num_gqa_groups", "ffn_dim_divisor"))
    qkv = _per_layer(raw["qkv_multipliers"], layers, "qkv_multipliers", pair_only=True)
    heads = [make_divisible(dim * m, head_dim * groups) // head_dim for m in qkv]
    kv = raw.get("num_kv_heads")
    kv = [h // groups for h in heads] if kv is None else kv
    ffn = _per_layer(raw["ffn_multipliers"], layers, "ffn_multipliers", pair_only=False)
    widths = [make_divisible(m * dim, divisor) for m in ffn]
    return {**raw, "hidden_size": dim, "num_hidden_layers": layers, "head_dim": head_dim,
            "num_query_heads": heads, "num_kv_heads": kv, "num_attention_heads": heads[0],
            "num_key_value_heads": kv[0] if isinstance(kv, list) and kv else None,
            "intermediate_size": max(widths), "rms_norm_eps": 1e-6,
            "rope_theta": raw["rope_freq_constant"],
            "max_position_embeddings": raw["max_context_length"],
            "tie_word_embeddings": bool(raw["share_input_output_layers"])
            or bool(raw.get("tie_word_embeddings", True))}


def _positive(raw: dict[str, Any], key: str) -> int:
    """raw[key], a positive integer (the sizes the layer-wise scaling divides by)."""
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def _openelm_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("ffn_with_glu") is False:
        return "ffn_with_glu false (an ungated FFN) is not supported; OpenELM's releases gate"
    return None


# OpenELMConfig's defaults (its __init__'s), where config.json leaves a key out.
DEFAULTS = {
    "vocab_size": 32000, "max_context_length": 2048, "num_transformer_layers": 12,
    "model_dim": 2048, "head_dim": 128, "qkv_multipliers": 1.0, "num_gqa_groups": 1,
    "ffn_multipliers": 4.0, "ffn_with_glu": True, "ffn_dim_divisor": 256,
    "activation_fn_name": "swish", "normalize_qk_projections": False,
    "share_input_output_layers": False, "rope_freq_constant": 10000,
    "bos_token_id": 1, "eos_token_id": 2,
}

FAMILIES: dict[str, FamilySpec] = {
    "openelm": FamilySpec(
        names=NAMES, qk_norm="head", qk_norm_key="normalize_qk_projections",
        act_key="activation_fn_name", act_default="swish", heads_per_layer=HEAD_LISTS,
        defaults=DEFAULTS, legacy=_openelm_config, refuse=_openelm_unsupported,
        quirks=("query heads, KV heads and FFN width per layer (layer-wise scaling)",
                "remote-code family: no transformers class"),
    ),
}
