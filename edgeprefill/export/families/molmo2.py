"""Molmo 2 (`molmo2`, e.g. allenai/Molmo2-8B): the language model of
Molmo2ForConditionalGeneration, exported alone (its vision backbone left out), read as
transformers 5.24's Molmo2TextModel computes it on text: Qwen3-like layers whose q/k
RMSNorms are per head (`qk_norm_type` "qwen3") or over the whole projection ("olmo"),
pre-norm, or post-norm where `norm_after` is true (each sublayer's output normed before
its residual add), and a plain LM head over `vocab_size` rows (never tied: the model
declares no tied weights).

The Hub's checkpoints (and transformers 5.24's saves, which convert back to them) store
the layers as the original code names them, which transformers renames as it loads them:
`model.transformer.blocks.{i}.` with one fused `self_attn.att_proj` ([q | k | v] rows),
`self_attn.attn_out`, `mlp.ff_proj` ([up | gate] rows: transformers chunks it into up_proj
then gate_proj), `mlp.ff_out`, `attn_norm` and `ff_norm`; the final norm `ln_f`; the
embedding as two tables, `wte.embedding` (vocab_size rows) and `wte.new_embedding` (the
`additional_vocab_size` image tokens' rows), joined (export/joined_tensors.py).

Its rope: the layers `rope_scaling_layers` lists rotate on `rope_parameters` (or the Hub's
`rope_theta` and `rope_scaling`), the others on the default rope of the same theta
(export/unscaled_rope.py); null lists every layer.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.export.families.dense import IMAGE_TEXT_QUIRK
from edgeprefill.export.families.spec import FamilySpec, TensorNames
from edgeprefill.export.families.wrapped import towers_left_out

_QK_NORMS = {"qwen3": "head", "olmo": "full"}  # qk_norm_type -> FamilySpec.qk_norm's kind
_NAMES = TensorNames(
    embed=("model.embed_tokens.weight",), final_norm="model.transformer.ln_f",
    layer="model.transformer.blocks.{i}.", qkv="self_attn.att_proj", o="self_attn.attn_out",
    gate_up="mlp.ff_proj", down="mlp.ff_out", input_norm="attn_norm",
    post_attn_norm="ff_norm")
# norm_after: attn_norm follows the attention, ff_norm the MLP (the "post" block's)
_POST_NAMES = TensorNames(
    embed=_NAMES.embed, final_norm=_NAMES.final_norm, layer=_NAMES.layer, qkv=_NAMES.qkv,
    o=_NAMES.o, gate_up=_NAMES.gate_up, down=_NAMES.down, post_attn_norm="attn_norm",
    post_mlp_norm="ff_norm")
_EMBEDDING = ("model.embed_tokens.weight",
              ("model.transformer.wte.embedding", "model.transformer.wte.new_embedding"))


def _text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Molmo2Config's text_config, never tied (Molmo2ForConditionalGeneration ties no
    weights, whatever either level says); the Hub's `qkv_bias` read as attention_bias,
    as Molmo2TextConfig's attribute_map does."""
    inner = raw["text_config"]  # a KeyError names the missing key
    if not isinstance(inner, dict):
        got = "null" if inner is None else type(inner).__name__
        raise ValueError(f"text_config must be an object, got {got}")
    text = {**inner, "tie_word_embeddings": False}
    if "qkv_bias" in text and "attention_bias" not in text:
        text["attention_bias"] = text.pop("qkv_bias")
    return text


def _refuse(raw: dict[str, Any]) -> str | None:
    if raw.get("qk_norm_type") not in _QK_NORMS:
        return f"qk_norm_type {raw.get('qk_norm_type')!r} is not supported; supported: " \
               "qwen3, olmo"
    if raw.get("use_qk_norm") is False:
        # the Hub's code then has no q/k norms; transformers 5.24 builds them anyway
        return "use_qk_norm=false (Molmo 2 without q/k norms) is not supported"
    return None


# Molmo2TextConfig's defaults (the Hub's text_config spells out its own)
MOLMO2_DEFAULTS = {
    "vocab_size": 151_936, "additional_vocab_size": 128, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 36864,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_bias": False,
    "qk_norm_type": "qwen3", "norm_after": False, "hidden_act": "silu",
}
MOLMO2 = FamilySpec(
    names=_NAMES, bias_key="attention_bias", qk_norm="head",
    qk_norm_from_config=lambda raw: _QK_NORMS[raw["qk_norm_type"]],
    block_from_config=lambda raw: "post" if raw.get("norm_after") else "pre",
    block_names={"post": _POST_NAMES}, up_first=True, joined=(_EMBEDDING,),
    embed_extra_rows_key="additional_vocab_size",
    rope_scaling_layers_key="rope_scaling_layers",
    nested="text_config", unnest=_text_config, refuse=_refuse, defaults=MOLMO2_DEFAULTS,
    left_out=towers_left_out(("vision_backbone.", "vision_tower.", "multi_modal_projector.")),
    quirks=("q/k RMSNorm per head (qwen3) or over the projection (olmo)",
            "fused q/k/v and up/gate projections", "extra vocabulary rows (image tokens)",
            "rope scaled on the layers rope_scaling_layers lists", IMAGE_TEXT_QUIRK),
)

FAMILIES: dict[str, FamilySpec] = {"molmo2": MOLMO2}
