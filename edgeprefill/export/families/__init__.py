"""The family registry: what distinguishes each decoder family from plain Llama, declared.

A family is a `FamilySpec` of switches the graph builder understands (norm kind, block
layout, MLP kind, q/k norms, embedding scaling, tensor names, which layers slide). The
numbers behind the switches (soft-caps, multipliers, windows, rope) are read from
config.json by `ModelConfig.from_hf`; nothing downstream looks at a family's name.

One module per kind of language model (dense, gemma, moe, latent, recurrent) and the
image-text checkpoints that wrap one; `FamilySpec` and the tensor names in `spec`.
"""

from __future__ import annotations

from edgeprefill.export.families import dense, gemma, image_text, latent, moe, recurrent
from edgeprefill.export.families.spec import BLOCKS, NORMS, FamilySpec, TensorNames

__all__ = ["BLOCKS", "FAMILIES", "NORMS", "REFUSED_TYPES", "FamilySpec", "TensorNames"]

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
}


def _merged(*kinds: dict[str, FamilySpec]) -> dict[str, FamilySpec]:
    merged: dict[str, FamilySpec] = {}
    for kind in kinds:
        twice = merged.keys() & kind.keys()
        assert not twice, f"model types in two kinds: {sorted(twice)}"
        merged.update(kind)
    return merged


FAMILIES: dict[str, FamilySpec] = _merged(
    dense.FAMILIES,
    gemma.FAMILIES,
    moe.FAMILIES,
    latent.FAMILIES,
    recurrent.FAMILIES,
    image_text.FAMILIES,
)
