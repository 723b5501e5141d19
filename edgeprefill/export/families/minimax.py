"""MiniMax (MiniMax-Text-01, MiniMax-M1): lightning attention (export/lightning.py) on
most layers, Mixtral's softmax attention and experts, each residual add on the normed
stream, scaled per layer type (block "normed")."""

from __future__ import annotations

from typing import Any

from edgeprefill.export.families.moe_softmax import MIXTRAL
from edgeprefill.export.families.spec import FamilySpec

# The remote-code config's names (MiniMaxText01Config) -> MiniMaxConfig's, which the
# conversion to transformers wrote; the new names win where both are given.
REMOTE_FACTORS = {"layernorm_full_attention_alpha": "full_attn_alpha_factor",
                  "layernorm_full_attention_beta": "full_attn_beta_factor",
                  "layernorm_linear_attention_alpha": "linear_attn_alpha_factor",
                  "layernorm_linear_attention_beta": "linear_attn_beta_factor",
                  "layernorm_mlp_alpha": "mlp_alpha_factor",
                  "layernorm_mlp_beta": "mlp_beta_factor"}


def _minimax_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MiniMaxConfig: without layer_types the remote code's attn_type_list (0 lightning, 1
    softmax), else every even layer (from 0) softmax; the remote code's residual factor
    names. With a sliding_window every softmax layer slides (MiniMaxModel masks its
    full_attention layers so), read as sliding_attention. transformers' default rope
    rotates each whole head whatever `rotary_dim` or `partial_rotary_factor` say, so both
    are dropped."""
    raw = {k: v for k, v in raw.items() if k not in ("rotary_dim", "partial_rotary_factor")}
    for remote, name in REMOTE_FACTORS.items():
        if remote in raw and name not in raw:
            raw[name] = raw[remote]
    if raw.get("layer_types") is None:
        kinds = raw.get("attn_type_list")
        raw["layer_types"] = (
            ["full_attention" if kind else "linear_attention" for kind in kinds]
            if kinds is not None else
            ["full_attention" if (i + 1) % 2 else "linear_attention"
             for i in range(int(raw["num_hidden_layers"]))])
    raw["minimax_layer_types"] = raw["layer_types"]  # as given, for the refusal
    if raw.get("sliding_window") is not None:
        raw["layer_types"] = ["sliding_attention" if kind == "full_attention" else kind
                              for kind in raw["layer_types"]]
    return raw


def _minimax_unsupported(raw: dict[str, Any]) -> str | None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        return (f"hidden_act {act!r} is not supported: the lightning layers' q/k/v take it, "
                "and export's is SiLU")
    given = raw["minimax_layer_types"]
    kinds = set(given) - {"full_attention", "linear_attention"}
    if kinds:
        return f"layer_types {sorted(kinds)} are not supported; only full_attention and " \
               "linear_attention"
    if "full_attention" not in given:
        # transformers' MiniMaxCache reads its length from a softmax layer's KV
        return "a config without a full_attention layer is not supported"
    return None


# MiniMax-Text-01 (MiniMaxAI/MiniMax-Text-01-hf, MiniMax-M1-40k-hf, -80k-hf)
MINIMAX = FamilySpec(
    window="always", block="normed", lightning=True, moe=MIXTRAL.moe,
    legacy=_minimax_config, refuse=_minimax_unsupported,
    # MiniMaxConfig's defaults
    defaults={"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_act": "silu", "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "rope_theta": 1_000_000.0, "num_local_experts": 8, "num_experts_per_tok": 2,
              "block_size": 256},
    quirks=("lightning attention: linear attention with a fixed decay per head",
            "residual adds on the normed stream, scaled per layer type"),
)

FAMILIES = {"minimax": MINIMAX}
