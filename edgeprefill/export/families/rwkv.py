"""RWKV-4 (RwkvForCausalLM: RWKV/rwkv-4-169m-pile ... rwkv-4-14b-pile, the rwkv-raven
models): every layer an RWKV block, a time mix (its WKV a recurrence per channel) and a
channel mix, each reading the token before; nothing attends, so the bundle has no KV
(export/rwkv.py). LayerNorms with bias, the first on the embeddings (block 0's pre_ln).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec

# RwkvModel's ln_out is nn.LayerNorm's default epsilon whatever layer_norm_epsilon says;
# export has one epsilon for every norm.
LN_OUT_EPS = 1e-5


def _rwkv_config(raw: dict[str, Any]) -> dict[str, Any]:
    """RwkvConfig: `intermediate_size` and `attention_hidden_size` null or absent are
    4 x hidden_size and hidden_size; `context_length` is its position limit (the config
    class's alias of max_position_embeddings). Every layer is an RWKV block; the attention
    keys it lacks get placeholders no layer reads."""
    hidden, count = int(raw["hidden_size"]), int(raw["num_hidden_layers"])
    return {**raw, "layer_types": ["rwkv"] * count,
            "intermediate_size": raw.get("intermediate_size") or 4 * hidden,
            "attention_hidden_size": raw.get("attention_hidden_size") or hidden,
            "max_position_embeddings": raw["context_length"],
            "num_attention_heads": 1, "num_key_value_heads": 1,
            "no_rope_layer_interval": 1}  # no layer rotates (none attends)


def _rwkv_unsupported(raw: dict[str, Any]) -> str | None:
    hidden, width = int(raw["hidden_size"]), raw.get("attention_hidden_size")
    if width is not None and int(width) != hidden:
        # RwkvModel's state is hidden_size wide per layer: its forward fails on another width.
        return (f"attention_hidden_size {width} differs from hidden_size {hidden}, which "
                "transformers' RWKV cannot run (its state is hidden_size wide)")
    eps = raw.get("layer_norm_epsilon", LN_OUT_EPS)
    if float(eps) != LN_OUT_EPS:
        return (f"layer_norm_epsilon {eps} is not supported: RwkvModel's final norm keeps "
                f"{LN_OUT_EPS} whatever the config says, and export has one epsilon")
    return None


RWKV = FamilySpec(
    names=replace(LLAMA_NAMES, embed=("rwkv.embeddings.weight",), final_norm="rwkv.ln_out",
                  lm_head=("head",), layer="rwkv.blocks.{i}.", embed_norm="rwkv.blocks.0.pre_ln",
                  input_norm="ln1", post_attn_norm="ln2"),
    norm="layer", block="rwkv", rwkv=True, attention_free=True, act_key=None,
    eps_key="layer_norm_epsilon", legacy=_rwkv_config, refuse=_rwkv_unsupported,
    # RwkvConfig's defaults
    defaults={"vocab_size": 50277, "context_length": 1024, "hidden_size": 4096,
              "num_hidden_layers": 32, "attention_hidden_size": None,
              "intermediate_size": None, "layer_norm_epsilon": 1e-5, "bos_token_id": 0,
              "eos_token_id": 0, "rescale_every": 6, "tie_word_embeddings": False},
    quirks=("no attention (no KV cache)", "time mix and channel mix read the token before",
            "the stream halved every rescale_every layers"),
)

FAMILIES: dict[str, FamilySpec] = {"rwkv": RWKV}
