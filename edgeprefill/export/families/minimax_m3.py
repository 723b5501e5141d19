"""MiniMax-M3's language model (minimax_m3_vl_text, as transformers' MiniMaxM3VLForCausalLM
computes it): Gemma's (1 + w) RMSNorms everywhere (the q/k norms per head too), rotary on
the first partial_rotary_factor of each head, grouped KV heads; on the layers layer_types
marks "minimax_m3_sparse" a lightning indexer that keeps each query's best blocks of keys
(export/block_index.py). Experts on the layers mlp_layer_types marks "sparse": the top k
of sigmoid + e_score_correction_bias, weighed by the sigmoid, renormalized (no epsilon),
times routed_scaling_factor, beside an ungated shared MLP shared_intermediate_size wide;
a dense MLP dense_intermediate_size wide on the others. Every one of them (routed, shared,
dense) is gpt-oss's clamped SwiGLU, (clamp(up, -L, L) + 1) * g * sigmoid(alpha g) with
g = min(gate, L), its gate and up one projection (gate rows first).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import MoeNames, MoeSpec, mlp_layer_types_sparse
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec

SPARSE = "minimax_m3_sparse"  # layer_types' name of the indexed layers

# MiniMaxM3VLTextConfig's flat names <- the keys of its legacy sparse_attention_config
LEGACY_INDEX = {"index_n_heads": "sparse_num_index_heads", "index_head_dim": "sparse_index_dim",
                "index_block_size": "sparse_block_size",
                "index_topk_blocks": "sparse_topk_blocks",
                "index_local_blocks": "sparse_local_block"}


HUB_NAMES = ((".block_sparse_moe.", ".mlp."), (".w1.", ".gate_proj."), (".w3.", ".up_proj."),
             (".w2.", ".down_proj."),
             *((f".self_attn.index_{part}.", f".self_attn.indexer.{part}.")
               for part in ("q_proj", "k_proj", "q_norm", "k_norm")))


def _m3_config(raw: dict[str, Any]) -> dict[str, Any]:
    """MiniMaxM3VLTextConfig.__post_init__: the indexer's keys from a legacy
    sparse_attention_config (its sparse_attention_freq the layer types where layer_types
    is absent), mlp_layer_types from moe_layer_freq; each absent, every layer full
    attention and every MLP experts. The indexed layers are read as full attention, listed
    in `block_index_layers` (block_index.read_block_index). Its `rotary_dim` is a key the
    model never reads (its rotary takes partial_rotary_factor): dropped."""
    # (its hidden_act, the Hub's "swigluoai", it reads as silu: no MLP of its reads it)
    raw = {**{k: v for k, v in raw.items() if k != "rotary_dim"}, "hidden_act": "silu"}
    legacy = raw.get("sparse_attention_config") or {}
    if not isinstance(legacy, dict):
        raise ValueError("sparse_attention_config must be an object")
    for flat, old in LEGACY_INDEX.items():
        if old in legacy:
            raw[flat] = legacy[old]
    count = int(raw["num_hidden_layers"])
    if raw.get("layer_types") is None:
        freq = legacy.get("sparse_attention_freq")
        raw["layer_types"] = [SPARSE if f else "full_attention" for f in freq] \
            if freq is not None else ["full_attention"] * count
    if raw.get("mlp_layer_types") is None:
        freq = raw.get("moe_layer_freq")
        raw["mlp_layer_types"] = ["sparse" if f else "dense" for f in freq] \
            if freq is not None else ["sparse"] * count
    kinds = list(raw["layer_types"])
    raw["block_index_layers"] = [i for i, kind in enumerate(kinds) if kind == SPARSE]
    raw["layer_types"] = ["full_attention" if kind == SPARSE else kind for kind in kinds]
    raw["shared_expert_intermediate_size"] = raw.get("shared_intermediate_size")
    return raw


def _m3_refused(raw: dict[str, Any]) -> str | None:
    kinds = set(raw["layer_types"]) - {"full_attention"}
    if kinds:
        return f"layer_types {sorted(kinds)} are not supported; only full_attention and " \
               f"{SPARSE}"
    mlp = set(raw["mlp_layer_types"]) - {"sparse", "dense"}
    if mlp or len(raw["mlp_layer_types"]) != int(raw["num_hidden_layers"]):
        return f"mlp_layer_types must list \"sparse\" or \"dense\" for each of the " \
               f"{raw['num_hidden_layers']} layers, got {raw['mlp_layer_types']!r}"
    return None


MINIMAX_M3 = FamilySpec(
    names=replace(LLAMA_NAMES, gate_up="mlp.gate_up_proj"),
    norm="rms_plus_one", qk_norm="head", partial_rotary=True, swiglu_clamps="oai",
    block_index=True, legacy=_m3_config, refuse=_m3_refused,
    # the Hub's names (what save_pretrained writes of the image-text checkpoint) read as its
    # conversion mapping renames them on load; its MLPs' gate and up stored apart
    # (checkpoint.stored_apart), its experts' one by one
    segment_renames=HUB_NAMES,
    moe=MoeSpec(names=MoeNames(expert_bias=("mlp.gate.e_score_correction_bias",
                                            "mlp.e_score_correction_bias"),
                               shared="mlp.shared_experts.", shared_gate_up="gate_up_proj"),
                routing="sigmoid", experts_keys=("num_local_experts", "num_experts"),
                width_key="intermediate_size", layers=mlp_layer_types_sparse, norm_key=None,
                renormalize=True, bias_key=None, clamped_swiglu=True),
    # MiniMaxM3VLTextConfig's defaults
    defaults={"vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 3072,
              "num_hidden_layers": 60, "num_attention_heads": 64, "num_key_value_heads": 4,
              "head_dim": 128, "max_position_embeddings": 524288, "rms_norm_eps": 1e-6,
              "rope_theta": 5_000_000.0, "tie_word_embeddings": False,
              "num_experts_per_tok": 4, "num_local_experts": 128,
              "dense_intermediate_size": 12288, "shared_intermediate_size": 3072,
              "routed_scaling_factor": 2.0, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
              "index_n_heads": 4, "index_head_dim": 128, "index_block_size": 128,
              "index_topk_blocks": 16, "index_local_blocks": 1},
    quirks=("per-head q/k RMSNorm", "sigmoid routing",
            "clamped SwiGLU (gpt-oss's) in every MLP",
            "dense and sparse layers (mlp_layer_types)"),
)

FAMILIES = {"minimax_m3_vl_text": MINIMAX_M3}
