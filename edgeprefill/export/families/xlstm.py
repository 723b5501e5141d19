"""xLSTM (xLSTMForCausalLM: NX-AI/xLSTM-7b): every layer an mLSTM cell (a matrix memory
with exponential gates, export/mlstm.py) and a SwiGLU feed-forward, each after an RMS
norm; nothing attends, so the bundle has no KV. The logits are soft-capped at
output_logit_soft_cap. transformers' own torch code is the reference (without the `xlstm`
package, whose kernels it would run instead); its kernel and mode keys choose how that
code computes the same cell and are not read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.errors import ExportError
from edgeprefill.export.config_checks import SIZE_LIMITS
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec


def _round_up(x: float, multiple: int) -> int:
    """configuration_xlstm.round_up_to_next_multiple_of."""
    return int(((x + multiple - 1) // multiple) * multiple)


def _given(raw: dict[str, Any], key: str, alias: str) -> Any:
    """xLSTMConfig.__post_init__: `key` where it is set, else its `alias`."""
    return raw[key] if raw.get(key) is not None else raw.get(alias)


def _widths(raw: dict[str, Any]) -> tuple[int, int, int]:
    """(hidden, q/k width, v width) as xLSTMLayer sizes its projections: int(hidden x
    factor), where the config's qk_dim and v_dim (and the cache) round up to 64."""
    hidden = int(_given(raw, "hidden_size", "embedding_dim"))
    return (hidden, int(hidden * float(raw["qk_dim_factor"])),
            int(hidden * float(raw["v_dim_factor"])))


def _xlstm_config(raw: dict[str, Any]) -> dict[str, Any]:
    """xLSTMConfig: `hidden_size` else `embedding_dim`, `num_blocks` (the blocks
    xLSTMModel builds) else `num_hidden_layers`; the feed-forward is hidden x
    ffn_proj_factor rounded up to ffn_round_up_to_multiple_of wide. Every layer is an
    mLSTM cell; the attention keys it lacks get placeholders no layer reads."""
    hidden, qk, v = _widths(raw)
    key = "num_blocks" if raw.get("num_blocks") is not None else "num_hidden_layers"
    count = int(raw[key])
    most = SIZE_LIMITS["num_hidden_layers"][1]
    if count > most:  # checked before a list of as many layers is built
        raise ExportError(f"config.json: {key} must be at most {most}, got {count}")
    return {**raw, "hidden_size": hidden, "num_hidden_layers": count,
            "layer_types": ["mlstm"] * count, "mlstm_qk_dim": qk, "mlstm_v_dim": v,
            "intermediate_size": _round_up(hidden * float(raw["ffn_proj_factor"]),
                                           int(raw["ffn_round_up_to_multiple_of"])),
            "final_logit_softcapping": raw["output_logit_soft_cap"],
            "num_attention_heads": 1, "num_key_value_heads": 1,
            "no_rope_layer_interval": 1}  # no layer rotates (none attends)


def _xlstm_unsupported(raw: dict[str, Any]) -> str | None:
    embed = raw.get("embedding_dim")
    if embed is not None and int(embed) != int(raw["hidden_size"]):
        return (f"embedding_dim {embed} differs from hidden_size {raw['hidden_size']}, "
                "which transformers' xLSTM cannot run (its blocks are hidden_size wide)")
    if raw.get("weight_mode", "single") != "single":
        return (f"weight_mode {raw['weight_mode']!r} is not supported; only 'single' "
                "(separate q, k, v and gate projections, as NX-AI/xLSTM-7b stores them)")
    hidden, qk, v = _widths(raw)
    heads = int(raw["num_heads"])
    for name, width in (("qk_dim_factor", qk), ("v_dim_factor", v)):
        if width != _round_up(width, 64) or width % heads:
            # xLSTMCache sizes C and n by the rounded width: the layer's state then fails
            # its shape check in transformers.
            return (f"hidden_size {hidden} x {name} {raw[name]} = {width} is not a "
                    f"multiple of 64 and of num_heads {heads}, which transformers' xLSTM "
                    "cannot run (its cache rounds the width up to 64)")
    return None


XLSTM = FamilySpec(
    names=replace(LLAMA_NAMES, embed=("backbone.embeddings.weight",),
                  final_norm="backbone.out_norm", layer="backbone.blocks.{i}.",
                  input_norm="norm_mlstm", post_attn_norm="norm_ffn", gate="ffn.proj_up_gate",
                  up="ffn.proj_up", down="ffn.proj_down"),
    mlstm=True, attention_free=True, act_key=None, eps_key="norm_eps", softcaps=("final",),
    legacy=_xlstm_config, refuse=_xlstm_unsupported, unsupported=("use_bias",),
    # xLSTMConfig's defaults (a recurrent model has no position limit: export's cap, as
    # Mamba-1's)
    defaults={"vocab_size": 50304, "hidden_size": 4096, "num_hidden_layers": 32,
              "num_heads": 8, "use_bias": False, "norm_eps": 1e-6, "qk_dim_factor": 0.5,
              "v_dim_factor": 1.0, "eps": 1e-6, "ffn_proj_factor": 2.667,
              "ffn_round_up_to_multiple_of": 64, "gate_soft_cap": 15.0,
              "output_logit_soft_cap": 30.0, "weight_mode": "single",
              "tie_word_embeddings": False, "pad_token_id": 1, "bos_token_id": 0,
              "eos_token_id": 2, "max_position_embeddings": 4096},
    quirks=("no attention (no KV cache)", "mLSTM matrix memory with exponential gates",
            "logits soft-capped"),
)

FAMILIES: dict[str, FamilySpec] = {"xlstm": XLSTM}
