"""Zyphra's ZAYA (`zaya`, e.g. Zyphra/ZAYA1-8B), read as transformers' Zaya reads it: every
layer attends through compressed convolutional attention (export/cca.py: q/k convolved
over time with residual paths, values half from the token before, L2-normed q/k with a
learned key scale; `hybrid` layers full, `hybrid_sliding` ones within `sliding_window`),
with a rope per layer type rotating its own share of each head (`rope_parameters` keyed
by layer type), then routed experts on every layer: one expert or none per token, chosen
by an MLP router that carries its state across depth (export/zaya_router.py). The
embedding and both residual adds of each layer are scaled per channel (learned scales
and biases: the "scaled" block).

Each layer keeps its KV beside two states (the convolution's last raw q/k and the last
delayed value), so chunked prefill and decode compute what one unchunked forward does.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.export.experts import MoeNames, MoeSpec
from edgeprefill.export.families.spec import FamilySpec

# ZayaConfig's rope where config.json has none (the layer types' own names)
ZAYA_ROPES = {
    "hybrid": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
    "hybrid_sliding": {"rope_type": "default", "rope_theta": 10_000.0,
                       "partial_rotary_factor": 0.5},
}
# ZAYA's layer types as the reader's: attention beside CCA's states, full or sliding
KINDS = {"hybrid": "full_attention", "hybrid_sliding": "sliding_attention"}


def _zaya_config(raw: dict[str, Any]) -> dict[str, Any]:
    """ZayaConfig.__post_init__'s layer types (every layer `hybrid`) and ropes where
    config.json leaves them out, the rope dict's top-level `rope_type` dropped as its
    convert_rope_params_to_dict drops it (the Hub's config has both); its layer types
    read as the reader's kinds (an unknown one kept, for _zaya_refuse to name)."""
    count = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or ["hybrid"] * count
    ropes = raw.get("rope_parameters") or ZAYA_ROPES
    if isinstance(ropes, dict):
        ropes = {KINDS.get(kind, kind): entry for kind, entry in ropes.items()
                 if kind != "rope_type"}
    return {**raw, "layer_types": [KINDS.get(str(kind), kind) for kind in types],
            "rope_parameters": ropes,
            # the experts' width; ZayaConfig has no dense MLP width
            "intermediate_size": raw["moe_intermediate_size"]}


def _zaya_refuse(raw: dict[str, Any]) -> str | None:
    """What ZayaConfig refuses, and what its model would fail on."""
    if int(raw["num_experts_per_tok"]) != 1:
        return "num_experts_per_tok must be 1 (transformers' ZAYA supports 1 only)"
    if raw.get("rope_scaling") is not None:
        return "rope_scaling is not supported; ZAYA's rope_parameters are keyed by layer type"
    types = raw["layer_types"]
    if len(types) != int(raw["num_hidden_layers"]):
        return f"layer_types lists {len(types)} layers; num_hidden_layers is " \
               f"{raw['num_hidden_layers']}"
    unknown = {str(kind) for kind in types} - set(KINDS.values())
    if unknown:
        return f"layer_types holds {', '.join(sorted(unknown))}; hybrid or hybrid_sliding"
    ropes = raw["rope_parameters"]
    names = {value: key for key, value in KINDS.items()}
    for kind in sorted(set(types)):
        entry = ropes.get(kind) if isinstance(ropes, dict) else None
        if not isinstance(entry, dict) or "rope_theta" not in entry:
            return (f"rope_parameters needs a {names[kind]} entry with rope_theta (ZAYA's "
                    "rotary reads one per layer type)")
    if "sliding_attention" in types and raw.get("sliding_window") is None:
        return "config.json needs sliding_window (layer_types has hybrid_sliding layers)"
    if int(raw["num_key_value_heads"]) * int(raw["head_dim"]) % 2:
        return "num_key_value_heads x head_dim must be even (ZAYA's values are two halves)"
    return None


ZAYA = FamilySpec(
    cca=True, embed_affine=True, block="scaled", window="always", rotary_per_type=True,
    tie_default=True, bias_key="attention_bias", o_bias=None, lm_head_bias_key="lm_head_bias",
    legacy=_zaya_config, refuse=_zaya_refuse,
    moe=MoeSpec(names=MoeNames(router=("mlp.gate.down_proj.weight",)), routing="zaya",
                norm_key=None, bias_key=None, scaling_key=None),
    # ZayaConfig's defaults (ZAYA1-8B's sizes)
    defaults={"vocab_size": 262272, "hidden_size": 2048, "num_hidden_layers": 40,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": True, "moe_intermediate_size": 2048,
              "num_experts_per_tok": 1, "num_experts": 16, "router_hidden_size": 256,
              "cca_time0": 2, "cca_time1": 2, "attention_bias": False,
              "lm_head_bias": False, "bos_token_id": 2, "eos_token_id": 106,
              "pad_token_id": 0},
    quirks=("compressed convolutional attention (q/k convolved over time, values half "
            "from the token before: two states beside each layer's KV)",
            "L2-normed q/k with a learned key scale", "a rotary base and width per layer type",
            "an MLP router carrying its state across layers, with a skip expert",
            "learned scales and biases on the embedding and every residual add"),
)

FAMILIES: dict[str, FamilySpec] = {"zaya": ZAYA}
