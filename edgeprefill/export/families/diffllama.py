"""DiffLlama (`diffllama`: kajuma/DiffLlama-0.3B-handcut and its kin), read as transformers'
DiffLlama reads it: Llama's layers with differential attention (export/differential.py):
each pair of query heads attends over both halves of the values, the second pair's output
times lambda subtracted from the first's, each difference RMS-normed (without weight) and
scaled by 1 - lambda_init. The cache holds Llama's keys and values.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.export.families.dense import ATTENTION_BIAS
from edgeprefill.export.families.spec import FamilySpec


def _diffllama_refuse(raw: dict[str, Any]) -> str | None:
    """What DiffLlamaAttention refuses to build, refused as it is."""
    kv_heads = raw.get("num_key_value_heads")
    if kv_heads is None:  # DiffLlamaConfig: one KV head per query head
        kv_heads = raw.get("num_attention_heads")
    if not isinstance(kv_heads, int) or kv_heads % 2:
        return (f"num_key_value_heads must be even (differential attention splits the "
                f"values in two halves of KV heads), got {kv_heads!r}")
    if raw.get("attention_dropout"):
        return "attention_dropout > 0 is refused by DiffLlama's own model"
    return None


DIFFLLAMA = FamilySpec(
    **ATTENTION_BIAS, differential=True, refuse=_diffllama_refuse,
    # DiffLlamaConfig's defaults where they differ from the reader's (Llama's)
    defaults={"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
              "num_attention_heads": 32, "rms_norm_eps": 1e-5},
    quirks=("differential attention (two softmaxes subtracted with a learned lambda, "
            "an RMSNorm per head pair)",),
)

FAMILIES: dict[str, FamilySpec] = {"diffllama": DIFFLLAMA}
