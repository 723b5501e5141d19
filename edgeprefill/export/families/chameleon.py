"""Chameleon (`chameleon`: facebook/chameleon-7b and -30b, GAIR's Anole), read as
transformers' ChameleonForConditionalGeneration runs text: Llama's layers with a q/k
LayerNorm per head of its own weight and bias (export/head_affine_norm.py), Swin-norm
layers where `swin_norm` (each norm after its sublayer, OLMo 2's "post" block: the
checkpoint's input_layernorm after the attention, post_attention_layernorm after the MLP),
and the image tokens' logits at the dtype's minimum (export/masked_logits.py). Text in,
text out: the VQ-VAE image tokenizer (model.vqmodel.) is left out; the language model is
stored under Llama's names.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.families.dense import ATTENTION_BIAS, IMAGE_TEXT_QUIRK
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec
from edgeprefill.export.masked_logits import image_tokens

# ChameleonSwinDecoderLayer: x += input_layernorm(attn(x)); x += post_attention_layernorm(
# mlp(x)), which the "post" block reads as its post_attn_norm and post_mlp_norm
SWIN_NAMES = replace(LLAMA_NAMES, post_attn_norm="input_layernorm",
                     post_mlp_norm="post_attention_layernorm")


def _block(raw: dict[str, Any]) -> str:
    """ChameleonModel's layers: Swin-norm ones where swin_norm, else Llama's."""
    return "post" if raw.get("swin_norm") else "pre"


CHAMELEON = FamilySpec(
    **ATTENTION_BIAS, mlp_bias_key="mlp_bias", qk_norm="head_affine",
    block_from_config=_block, block_names={"post": SWIN_NAMES}, masked_logits=image_tokens,
    left_out=("model.vqmodel.",),
    # ChameleonAttention's heads are hidden_size / num_attention_heads whatever head_dim says
    ignores=("head_dim",),
    # ChameleonConfig's defaults where they differ from the reader's (Llama's)
    defaults={"vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5},
    quirks=("q/k LayerNorm per head, each head's own weight and bias",
            "image tokens' logits masked to the dtype's minimum",
            IMAGE_TEXT_QUIRK.replace("vision tower", "VQ-VAE image tokenizer")),
)

FAMILIES: dict[str, FamilySpec] = {"chameleon": CHAMELEON}
