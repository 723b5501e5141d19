"""dots.3 Note's language model (dots3_note_text, and dots3_note's: image_text.WRAPPERS):
DeepSeek-V3.2's sparse attention (GLM-5's interleaved indexer) on its indexed layers,
beside sliding-window layers of latent attention sizes of their own and no indexer
(export/layer_latents.py), each head's output gated, DeepSeek-V3's experts.

What Dots3NoteTextAttention adds to DeepSeek-V3.2's attention: q_a_layernorm and
kv_a_layernorm at rms_norm_eps; the normed query latent times sqrt(hidden / q_lora_rank)
(the bundle scales the query after q_b_proj, as LongCat-Flash's: the same, q_b_proj being
linear; the indexer, which transformers feeds the scaled latent, reads it unscaled: a
positive factor on every index score keeps the same keys) and the normed KV latent times
sqrt(hidden / kv_lora_rank); the shared key part RMS-normed (k_rope_only_layernorm)
before rotary; sigmoid(g_proj(x)) per head on the values before o_proj; a rope per layer
type (its own theta, rotating each type's qk_rope_head_dim).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.errors import ExportError
from edgeprefill.export.experts import sparse_mlp_layers
from edgeprefill.export.families.latent import MLA_QUIRKS
from edgeprefill.export.families.moe_sigmoid import DEEPSEEK_MOE
from edgeprefill.export.families.sparse_attention import GLM_MOE_DSA

# Dots3NoteTextConfig's sizes of the sliding layers where neither per_layer_config nor
# the released checkpoints' swa_* keys give them
_SLIDING_DEFAULTS = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1024,
                     "kv_lora_rank": 1024, "head_dim": 256, "qk_nope_head_dim": 192,
                     "v_head_dim": 128}
_RENAMED = {"indexed_attention": "full_attention"}


def _layer_types(raw: dict[str, Any]) -> list[str]:
    """Dots3NoteTextConfig's layer_types: its own, else indexed on the first two layers and
    every fourth from the second, sliding elsewhere (use_sliding_window, true by default);
    use_dsa false names the indexed ones full_attention."""
    layers = int(raw["num_hidden_layers"])
    use_dsa = raw.get("use_dsa", None if "per_layer_config" in raw else True)
    types = raw.get("layer_types")
    if types is None:
        full = "full_attention" if use_dsa is False else "indexed_attention"
        slides = raw.get("use_sliding_window", True)
        types = [full if not slides or i < 2 or i % 4 == 1 else "sliding_attention"
                 for i in range(layers)]
    if use_dsa is not None:
        old, new = ("full_attention", "indexed_attention") if use_dsa else \
            ("indexed_attention", "full_attention")
        types = [new if kind == old else kind for kind in types]
    return list(types)


def _per_layer_config(raw: dict[str, Any], types: list[str]) -> dict[str, Any]:
    """per_layer_config, else the sliding layers' sizes from the swa_* keys (qk_rope_head_dim
    their head_dim less qk_nope_head_dim), Dots3NoteTextConfig's defaults where absent."""
    if "per_layer_config" in raw:
        return raw["per_layer_config"] or {}
    sizes = {key: raw.get(f"swa_{key}", value) for key, value in _SLIDING_DEFAULTS.items()}
    sizes["qk_rope_head_dim"] = raw.get("swa_qk_rope_head_dim",
                                        sizes["head_dim"] - sizes["qk_nope_head_dim"])
    return {str(i): sizes for i, kind in enumerate(types) if kind == "sliding_attention"}


def _rope_parameters(raw: dict[str, Any], types: list[str]) -> dict[str, Any]:
    """A rope per layer type (rope_theta, 8e7 by default, and swa_rope_theta, 5e4, where
    absent), under the names export's ropes have; the rotated width is each type's
    qk_rope_head_dim (its partial_rotary_factor of head_dim), so the factor is dropped."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling")
    if params is None:
        theta = raw.get("rope_theta", 80_000_000.0)
        params = {kind: {"rope_type": "default", "rope_theta": raw.get(
            "swa_rope_theta", 50_000.0) if kind == "sliding_attention" else theta}
            for kind in set(types)}
    elif not set(params) & {"indexed_attention", "sliding_attention", "full_attention"}:
        params = {kind: dict(params) for kind in set(types)}
    for kind, entry in params.items():
        if not isinstance(entry, dict):
            raise ExportError(f"config.json: rope_parameters.{kind} must be an object, got "
                              f"{entry!r}")
    return {_RENAMED.get(kind, kind): {k: v for k, v in entry.items()
                                       if k != "partial_rotary_factor"}
            for kind, entry in params.items()}


def _dots3_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Dots3NoteTextConfig as config.json (or a released checkpoint's keys) gives it."""
    types = _layer_types(raw)
    layers = int(raw["num_hidden_layers"])
    kinds = raw.get("mlp_layer_types")
    if kinds is None:
        first, freq = int(raw.get("first_k_dense_replace", 1)), raw.get("moe_layer_freq", 1)
        kinds = ["sparse" if i >= first and (bool(freq[i]) if isinstance(freq, list)
                                              else i % int(freq) == 0) else "dense"
                 for i in range(layers)]
    shared = raw.get("moe_shared_expert_intermediate_size",
                     raw.get("shared_experts_intermediate_size", 1536))
    window = raw.get("sliding_window")
    return {**raw, "layer_types": [_RENAMED.get(kind, kind) for kind in types],
            "dsa_layer_types": types, "mlp_layer_types": kinds,
            "per_layer_config": _per_layer_config(raw, types),
            "rope_parameters": _rope_parameters(raw, types),
            "sliding_window": raw.get("sliding_window_size", 512) if window is None else window,
            "shared_expert_intermediate_size": int(shared) * int(raw.get("n_shared_experts")
                                                                 or 0)}


def _dots3_refused(raw: dict[str, Any]) -> str | None:
    # (after _dots3_config) every full layer DSA's: plain full layers would cache no index
    # key beside the indexed ones' at the model's latent sizes
    if "full_attention" in raw["dsa_layer_types"]:
        return "full_attention layers (latent attention without the indexer, use_dsa " \
               "false) are not supported"
    named = {new: old for old, new in _RENAMED.items()}  # the layer types config.json says
    for kind, entry in sorted(raw["rope_parameters"].items()):
        if entry.get("rope_type", "default") != "default":
            return f"rope_type {entry['rope_type']!r} ({named.get(kind, kind)}) is not " \
                   "supported; supported: default"
    if not int(raw.get("n_shared_experts") or 0):
        return "no shared expert (n_shared_experts 0) is not supported"
    return None


# dots.3 Note (dots3_note_text): GLM-5's DSA (interleaved indexer rotary, interleaved
# latent rotary) on its indexed_attention layers, sliding_attention layers of their own
# latent sizes without an indexer (export/layer_latents.py), the attention's output gated
# per head, DeepSeek-V3's experts on the layers mlp_layer_types marks "sparse". Its
# multi-token-prediction layers (model.mtp.) are left out.
DOTS3 = replace(
    GLM_MOE_DSA, legacy=_dots3_config, refuse=_dots3_refused, latent_layers=True,
    latent_head_gate=True, window="always",
    moe=replace(DEEPSEEK_MOE, layers=sparse_mlp_layers),
    defaults={"vocab_size": 152064, "hidden_size": 5120, "intermediate_size": 13824,
              "moe_intermediate_size": 1536, "num_hidden_layers": 46,
              "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
              "n_routed_experts": 256, "routed_scaling_factor": 1.0, "kv_lora_rank": 512,
              "q_lora_rank": 1024, "qk_rope_head_dim": 64, "v_head_dim": 128,
              "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1,
              "num_experts_per_tok": 8, "norm_topk_prob": True,
              "max_position_embeddings": 524288, "rms_norm_eps": 1e-5,
              "attention_bias": False, "index_topk": 2048, "index_head_dim": 128,
              "index_n_heads": 64, "head_dim": 256, "tie_word_embeddings": False},
    quirks=(*MLA_QUIRKS, "interleaved rotary", "sliding layers of their own latent sizes",
            "a sigmoid gate per attention head"),
)

FAMILIES = {"dots3_note_text": DOTS3}
