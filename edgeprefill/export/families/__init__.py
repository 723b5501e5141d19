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
