"""The family registry: what distinguishes each decoder family from plain Llama, declared.

A family is a `FamilySpec` of switches the graph builder understands (norm kind, block
layout, MLP kind, q/k norms, embedding scaling, tensor names, which layers slide). The
numbers behind the switches (soft-caps, multipliers, windows, rope) are read from
config.json by `ModelConfig.from_hf`; nothing downstream looks at a family's name.

One module per kind of language model (dense, gemma, moe, latent, recurrent, alibi, and
the GPT-2-era classic) and the image-text checkpoints that wrap one; `FamilySpec` and the
tensor names in `spec`. The checkpoints that wrap any text family (LLaVA's kin, `wrapped`)
take the spec of the one their text_config names: `family_spec`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from edgeprefill.export.families import (
    alibi,
    classic,
    dense,
    gemma,
    image_text,
    latent,
    moe,
    recurrent,
)
from edgeprefill.export.families.spec import BLOCKS, NORMS, FamilySpec, TensorNames
from edgeprefill.export.families.wrapped import text_type_of, wrapped_spec

__all__ = ["BLOCKS", "FAMILIES", "NORMS", "REFUSED_TYPES", "FamilySpec", "TensorNames",
           "family_spec", "wrapped_text_type"]

# model_types close to a supported family that export refuses -> why, in words.
REFUSED_TYPES: dict[str, str] = {
    "deepseek_v32": "DeepSeek-V3.2's sparse attention (an indexer choosing each query's "
                    "keys) is not supported",
    "glm_moe_dsa": "GLM-5's DeepSeek sparse attention (an indexer choosing each query's keys) "
                   "is not supported",
    "kimi_linear": "Kimi Linear's KDA (Kimi delta attention) layers are not supported",
    "axk1": "A.X K1's RMSNorm after the experts (post_mlp_layernorm) is not supported",
    "mistral4": "Mistral 4's position-scaled queries and softmax group routing are not "
                "supported",
    "bailing_hybrid": "Bailing hybrid's gated delta attention with per-channel forget gates "
                      "(KDA) is not supported",
    "minimax": "MiniMax's lightning attention layers (linear attention with a decay per head) "
               "are not supported",
    "xlstm": "xLSTM's mLSTM blocks (a matrix memory with exponential gates) are not supported",
    "rwkv": "RWKV's time-mix (WKV) and channel-mix blocks are not supported",
    # Its processor marks every prompt token as prefix (token_type_ids 0), which its model
    # attends bidirectionally: a causal bundle computes other logits for any prompt.
    "paligemma": "PaliGemma attends its whole prompt bidirectionally (a prefix LM), which a "
                 "causal bundle cannot compute",
    "jetmoe": "JetMoE's mixture of attention heads (routed query and output projections) "
              "is not supported",
    "longcat_flash": "LongCat-Flash's zero-computation experts and two attentions per layer "
                     "are not supported",
    "diffllama": "DiffLlama's differential attention (two softmaxes subtracted with a "
                 "learned lambda) is not supported",
    # transformers 5.24's newer causal LMs that need a new state, attention or structure
    "zaya": "ZAYA's compressed convolutional attention (q/k convolved over time, values "
            "from a delayed recurrent state) is not supported",
    "dots3_note_text": "dots.3's DeepSeek sparse attention (an indexer choosing each query's "
                       "keys) is not supported",
    "dots3_note": "dots.3's DeepSeek sparse attention (an indexer choosing each query's keys) "
                  "is not supported",
    "inkling_text": "Inkling's relative-position attention logits (a learned bias per distance "
                    "from each token's state) are not supported",
    "inkling2_text": "Inkling 2's relative-position attention logits and dynamic short "
                     "convolutions are not supported",
    "inkling2_loop_text": "Inkling 2 Loop's looped layers (a second pass over depth, mixing "
                          "the first pass's messages) are not supported",
    "doge": "Doge's dynamic mask attention (a per-key bias from the values, top-k keys kept) "
            "is not supported",
    "minimax_m3_vl_text": "MiniMax-M3's sparse attention (an indexer choosing each query's "
                          "keys) is not supported",
    "gemma4_assistant": "the Gemma 4 assistant is a drafter that reads its target model's "
                        "hidden states; it is not a language model export can run alone",
    "gemma4_unified_assistant": "the Gemma 4 Unified assistant is a drafter that reads its "
                                "target model's hidden states; it is not a language model "
                                "export can run alone",
    "hrm_text": "HRM-Text's recurrence over depth (high- and low-level cycles through its "
                "layer stacks) and prefix-LM attention are not supported",
    "blt": "BLT's byte-level patching (local byte encoder and decoder around a global "
           "patch transformer) is not supported",
    "axk2": "A.X K2's DeepSeek sparse attention (an indexer choosing each query's keys) is "
            "not supported",
    "deepseek_v4": "DeepSeek-V4's compressed sparse attention and hyper-connections are not "
                   "supported",
    "hy_v4": "Hy4's DeepSeek sparse attention (an indexer choosing each query's keys) and "
             "hyper-connections are not supported",
    "qwen4_exp_text": "Qwen4-Exp's sparse attention indexer, n-gram embeddings and gated "
                      "residuals are not supported",
    # close to supported families, each a few graph pieces short
    "laguna": "Laguna's softplus attention output gate, per-layer head counts and a rotary "
              "width per layer type are not supported",
    # image-text checkpoints whose language model is none export supports
    "minimax_m3_vl": "MiniMax-M3-VL's language model (minimax_m3_vl_text) uses sparse "
                     "attention (an indexer choosing each query's keys), which is not supported",
    "mistral_large4": "Mistral Large 4's DeepSeek sparse attention (an indexer choosing each "
                      "query's keys) and position-scaled queries are not supported",
    "molmo2": "Molmo2's language model (molmo2_text: the Hub's fused projections and extra "
              "vocabulary table, per-layer rope scaling) is not supported",
    "muse_glimmer": "Muse Glimmer's language model (normed embeddings, scaled weightless q/k "
                    "norms, a sigmoid attention output gate) is not supported",
    "muse_spark": "Muse Spark's language model (Muse Glimmer's normed embeddings and gated "
                  "attention, with projected experts and residual gates) is not supported",
    "step3p7": "Step 3.7's language model (step3p5: a sigmoid output gate per head, head "
               "counts per layer, clamped SwiGLU experts) is not supported",
    "unlimited_ocr": "Unlimited OCR's reference sliding-window attention (the whole prompt "
                     "kept, a window over the generated tokens) is not supported",
    # transformers 5.24's newer image-text checkpoints whose language model export refuses
    # (stop 43, first half)
    "glm5_next": "GLM-5-Next's language model (DeepSeek sparse attention, linear attention "
                 "layers with forget gates, hyper-connections) is not supported",
    "hy_v4_vl": "Hy4-VL's language model is Hy4's (DeepSeek sparse attention, "
                "hyper-connections), which is not supported",
}


def _merged(*kinds: dict[str, FamilySpec]) -> dict[str, FamilySpec]:
    merged: dict[str, FamilySpec] = {}
    for kind in kinds:
        twice = merged.keys() & kind.keys()
        assert not twice, f"model types in two kinds: {sorted(twice)}"
        merged.update(kind)
    return merged


_TEXT: dict[str, FamilySpec] = _merged(
    dense.FAMILIES,
    gemma.FAMILIES,
    moe.FAMILIES,
    latent.FAMILIES,
    recurrent.FAMILIES,
    alibi.FAMILIES,
    classic.FAMILIES,
)
# A wrapper's entry is the spec of its default language model (its config class's).
FAMILIES: dict[str, FamilySpec] = _merged(
    _TEXT,
    image_text.FAMILIES,
    {name: wrapped_spec(wrapper, _TEXT[wrapper.default_text])
     for name, wrapper in image_text.WRAPPERS.items()},
)


def wrapped_text_type(family: str, raw: dict[str, Any]) -> str | None:
    """The text family a wrapper's config.json (image_text.WRAPPERS) holds; None for other
    families. A ValueError says why it is none export takes, a KeyError the missing key."""
    wrapper = image_text.WRAPPERS.get(family)
    return None if wrapper is None else text_type_of(wrapper, raw, _TEXT)


def family_spec(family: str, text_type: str | None = None) -> FamilySpec:
    """The spec of `family`; of a wrapper, the spec of `text_type` as it holds it."""
    return FAMILIES[family] if text_type is None else _wrapped(family, text_type)


@cache
def _wrapped(family: str, text_type: str) -> FamilySpec:
    return wrapped_spec(image_text.WRAPPERS[family], _TEXT[text_type])
