"""The ALiBi families (BLOOM, MPT): no rotary and no position table; each head's scores
get a linear bias by distance (export/alibi.py, `FamilySpec.alibi`)."""

from __future__ import annotations

from typing import Any

from edgeprefill.export.config_checks import check_sizes
from edgeprefill.export.families.spec import FamilySpec, TensorNames

# Keys other families read that these config classes have no use for (their own names and
# fixed shapes win): dropped before reading.
OTHER_FAMILIES_KEYS = ("intermediate_size", "num_key_value_heads", "head_dim", "no_rope_layers",
                       "no_rope_layer_interval", "layer_types", "attention_multiplier",
                       "query_pre_attn_scalar", "rope_parameters", "rope_scaling", "clip_qkv")


def _own_names(raw: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """The config class's own key names read as the generic ones; an alias config.json
    gives (its attribute_map's) wins. Every layer attends without rotary, one KV head per
    query head, and the MLP is 4 x hidden wide (both models hard-code it)."""
    raw = dict(raw)
    for key, alias in aliases.items():
        raw[alias] = raw.get(alias, raw[key])
    check_sizes(raw)  # n_layer as num_hidden_layers, before its layers are listed
    raw["intermediate_size"] = 4 * int(raw["hidden_size"])
    raw["num_key_value_heads"] = raw["num_attention_heads"]
    raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    return raw


def _bloom_config(raw: dict[str, Any]) -> dict[str, Any]:
    """BloomConfig: n_layer and n_head (num_hidden_layers and num_attention_heads win), and
    a legacy n_embed that wins over hidden_size."""
    raw = _own_names(raw, {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads"})
    if raw.get("n_embed") is not None:
        raw["hidden_size"] = raw["n_embed"]
        raw["intermediate_size"] = 4 * int(raw["n_embed"])
    return raw


def _bloom_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("apply_residual_connection_post_layernorm"):
        return ("apply_residual_connection_post_layernorm=true (the residual taken after the "
                "norm) is not supported")
    return None


BLOOM_NAMES = TensorNames(
    embed=("transformer.word_embeddings.weight",),
    embed_norm="transformer.word_embeddings_layernorm", final_norm="transformer.ln_f",
    layer="transformer.h.{i}.", qkv="self_attention.query_key_value",
    o="self_attention.dense", gate="", up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h",
)
# BLOOM/BLOOMZ: LayerNorm with bias (the embedding normed too), biases on every projection,
# a tanh gelu MLP (BloomGelu, whatever the config says), the fused q/k/v interleaved per
# head as GPT-NeoX's. The Hub's checkpoints store the base model's tensors without the
# `transformer.` prefix (h.0.self_attention..., word_embeddings.weight).
BLOOM = FamilySpec(
    names=BLOOM_NAMES, norm="layer", gated_mlp=False, qkv_interleaved=True, qkv_bias=True,
    o_bias=True, mlp_bias=True, tie_default=True, act_default="gelu_new", act_key=None,
    eps_key="layer_norm_epsilon", alibi=True, legacy=_bloom_config, refuse=_bloom_unsupported,
    renames=tuple((p, "transformer." + p) for p in
                  ("h.", "word_embeddings.", "word_embeddings_layernorm.", "ln_f.")),
    ignores=OTHER_FAMILIES_KEYS,
    # ALiBi has no position limit: export's cap of 4096 stands for one (as Mamba's)
    defaults={"hidden_size": 64, "n_layer": 2, "n_head": 8, "vocab_size": 250880,
              "layer_norm_epsilon": 1e-5, "max_position_embeddings": 4096},
    quirks=("LayerNorm with bias (the embedding normed too)", "gelu MLP",
            "fused q/k/v interleaved per head"),
)

# MptAttentionConfig's defaults: what an attn_config leaves out.
MPT_ATTENTION = {"attn_type": "multihead_attention", "clip_qkv": None, "softmax_scale": None,
                 "prefix_lm": False, "qk_ln": False, "alibi": True, "alibi_bias_max": 8}


def _mpt_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MptConfig: d_model, n_heads, n_layers (their attribute_map aliases win), max_seq_len
    (the alibi table transformers builds: no key past it); clip_qkv and softmax_scale
    from attn_config. A null logit_scale is no scale (the generic reader's Cohere key)."""
    raw = _own_names(raw, {"d_model": "hidden_size", "n_heads": "num_attention_heads",
                           "n_layers": "num_hidden_layers"})
    attn = {**MPT_ATTENTION, **(raw.get("attn_config") or {})}
    raw["max_position_embeddings"] = raw["max_seq_len"]
    raw["clip_qkv"] = attn["clip_qkv"]
    if attn["softmax_scale"] is not None:
        raw["attention_multiplier"] = attn["softmax_scale"]
    if raw.get("logit_scale") is None:
        raw.pop("logit_scale", None)
    return raw


def _mpt_unsupported(raw: dict[str, Any]) -> str | None:
    """What transformers' MPT ignores where MosaicML's own code honours it: the two models
    differ there, so export refuses rather than pick one."""
    attn = {**MPT_ATTENTION, **(raw.get("attn_config") or {})}
    refused = {
        "attn_config.alibi=false (learned positions)": not attn["alibi"],
        f"attn_config.alibi_bias_max={attn['alibi_bias_max']} (transformers uses 8)":
            float(attn["alibi_bias_max"]) != 8.0,
        "attn_config.qk_ln=true (q/k LayerNorm)": bool(attn["qk_ln"]),
        "attn_config.prefix_lm=true": bool(attn["prefix_lm"]),
        f"attn_config.attn_type={attn['attn_type']!r}": attn["attn_type"] != "multihead_attention",
        "no_bias=false (biases)": not raw["no_bias"],
        f"expansion_ratio={raw['expansion_ratio']} (transformers' MLP is 4 x d_model)":
            raw["expansion_ratio"] != 4,
        f"logit_scale={raw.get('logit_scale')}": raw.get("logit_scale") is not None,
    }
    what = [reason for reason, bad in refused.items() if bad]
    return f"{what[0]} is not supported" if what else None


MPT_NAMES = TensorNames(
    embed=("transformer.wte.weight",), final_norm="transformer.norm_f",
    layer="transformer.blocks.{i}.", qkv="attn.Wqkv", o="attn.out_proj", gate="",
    up="ffn.up_proj", down="ffn.down_proj", input_norm="norm_1", post_attn_norm="norm_2",
)
# MPT: LayerNorm without bias, no biases at all, an exact gelu MLP, the fused q/k/v
# [q | k | v], q/k/v clamped where attn_config.clip_qkv is set.
MPT = FamilySpec(
    names=MPT_NAMES, norm="layer_no_bias", gated_mlp=False, tie_default=True,
    act_default="gelu", act_key=None, eps_key="layer_norm_epsilon", alibi=True, clip_qkv=True,
    legacy=_mpt_config, refuse=_mpt_unsupported,
    ignores=(*OTHER_FAMILIES_KEYS, "max_position_embeddings"),
    defaults={"d_model": 2048, "n_heads": 16, "n_layers": 24, "expansion_ratio": 4,
              "max_seq_len": 2048, "vocab_size": 50368, "layer_norm_epsilon": 1e-5,
              "no_bias": True},
    quirks=("LayerNorm without bias", "gelu MLP", "no biases"),
)

FAMILIES: dict[str, FamilySpec] = {
    "bloom": BLOOM,
    "mpt": MPT,
}
