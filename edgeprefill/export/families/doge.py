"""SmallDoge's Doge (`doge`: Doge-20M/60M/160M/320M and their -Instruct models), read as
transformers' Doge reads it: Llama's pre-norm layers with per-head q/k RMSNorm, dynamic
mask attention (each key's bias from its values, each query's `keep_window_size` keys of
the largest bias kept: export/dynamic_mask.py) and learned residual weights per channel
(`input_residual`, `post_attention_residual`). Its CDMoE (`is_moe`: product-key experts
that are rows of two embedding tables, beside the dense MLP) is refused.
"""

from __future__ import annotations

from typing import Any

from edgeprefill.export.families.spec import FamilySpec


def _doge_refuse(raw: dict[str, Any]) -> str | None:
    if raw.get("is_moe"):
        return ("is_moe=true (Doge's CDMoE: product-key experts from two embedding tables "
                "beside the MLP) is not supported")
    return None


DOGE = FamilySpec(
    bias_key="attention_bias", o_bias=None, mlp_bias_key="mlp_bias",
    qk_norm="head", window="always", dynamic_mask=True, residual_weights=True,
    refuse=_doge_refuse,
    # DogeConfig's defaults where they differ from the reader's
    defaults={"vocab_size": 32768, "hidden_size": 1024, "intermediate_size": 2048,
              "num_hidden_layers": 32, "num_attention_heads": 8,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-6},
    quirks=("per-head q/k RMSNorm", "dynamic mask attention (a per-key bias from the "
            "values, the top keep_window_size keys kept)", "residual weights per channel"),
)

FAMILIES: dict[str, FamilySpec] = {"doge": DOGE}
