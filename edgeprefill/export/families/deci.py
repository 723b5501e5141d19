"""Deci's DeciLM (`model_type: deci`: DeciLM-7B, DeciLM-7B-instruct, DeciLM-6B; remote
code, configuration_decilm.py and modeling_decilm.py over a copy of transformers 4.35's
Llama; transformers has no class for it): Llama whose layers each have a KV head count
of their own (variable grouped-query attention, `num_key_value_heads_per_layer`), every
layer num_attention_heads query heads. Its attention is LlamaAttention's of that copy:
head size hidden_size / num_attention_heads whatever head_dim a config carries, no
biases whatever attention_bias or mlp_bias say (DeciLMAttention and that LlamaMLP build
their projections without), and a rope_scaling of type linear or dynamic only (that
LlamaConfig refuses others). The releases' dynamic rope is plain rope within
max_position_embeddings, which caps a bundle's context (export/rope.py).
"""

from __future__ import annotations

from typing import Any

from edgeprefill.export.families.spec import FamilySpec

# The config keys export reads each layer's head counts from: one query count for all.
HEAD_LISTS = ("num_attention_heads", "num_key_value_heads_per_layer")
# transformers 4.35's LlamaConfig._rope_scaling_validation: these types only.
ROPE_TYPES = ("linear", "dynamic")


def _deci_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The model-wide KV head count (the manifest's num_kv_heads; each layer's own where it
    differs) is the first layer's, as OpenELM's: DeciLMConfig's num_key_value_heads
    (num_attention_heads unless set) is no layer's, and its model never reads it."""
    kv = raw.get("num_key_value_heads_per_layer")
    first = kv[0] if isinstance(kv, list) and kv and isinstance(kv[0], int) else None
    return {**raw, "num_key_value_heads": first} if first is not None else raw


def _deci_unsupported(raw: dict[str, Any]) -> str | None:
    scaling = raw.get("rope_scaling")
    kind = scaling.get("type", scaling.get("rope_type")) if isinstance(scaling, dict) else None
    if scaling is not None and kind not in ROPE_TYPES:
        return (f"rope_scaling {scaling!r} is not one DeciLM's remote code takes (its Llama "
                f"of transformers 4.35 scales rope by type {' or '.join(ROPE_TYPES)} only)")
    return None


FAMILIES: dict[str, FamilySpec] = {
    "deci": FamilySpec(
        heads_per_layer=HEAD_LISTS, required=("num_key_value_heads_per_layer",),
        ignores=("head_dim", "attention_bias", "mlp_bias"), legacy=_deci_config,
        refuse=_deci_unsupported,
        quirks=("KV heads per layer (variable grouped-query attention)",
                "remote-code family: no transformers class"),
    ),
}
