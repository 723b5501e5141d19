"""The Gemma families: Gemma 1-3, Gemma 3n, Gemma 4 (and Unified), VaultGemma, and the
language models of their image-text checkpoints.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.families.dense import ATTENTION_BIAS, IMAGE_TEXT_QUIRK, every_nth_global
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec
from edgeprefill.export.families.wrapped import towers_left_out


def _gemma_tanh_gelu(raw: dict[str, Any]) -> dict[str, Any]:
    # GemmaConfig: "gelu" is a legacy value of the official releases meant as the tanh form.
    if raw.get("hidden_act") == "gelu":
        raw = {**raw, "hidden_act": "gelu_pytorch_tanh"}
    return raw


def _gemma3_ropes(raw: dict[str, Any]) -> dict[str, Any]:
    # Gemma3TextConfig: a legacy `rope_scaling` updates the global layers' entry of
    # `rope_parameters` (its keys win, the entry's others stay), never the local layers'.
    scaling = raw.get("rope_scaling")
    if scaling is None:
        return raw
    params = raw.get("rope_parameters") or {}
    full = {"rope_type": "default", **(params.get("full_attention") or {}), **scaling}
    rest = {k: v for k, v in raw.items() if k != "rope_scaling"}
    return {**rest, "rope_parameters": {**params, "full_attention": full}}


def _gemma4_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma4TextConfig.__post_init__: without `layer_types` every 6th layer attends
    globally; the last layer always does; a config without `per_layer_config` (the Hub's)
    gives the full-attention layers `global_head_dim` (512 unless given) and, with
    attention_k_eq_v, `num_global_key_value_heads`; rope per layer type. Its attention
    scales q.k by 1 (its q/k norms stand in for 1/sqrt(head_dim))."""
    raw = dict(raw)
    count = int(raw["num_hidden_layers"])
    types = list(raw.get("layer_types") or ["sliding_attention" if (i + 1) % 6
                                            else "full_attention" for i in range(count)])
    if types:
        types[-1] = "full_attention"
    raw["layer_types"] = types
    if raw.get("per_layer_config") is None:
        full = {"head_dim": raw.get("global_head_dim") or 512}
        heads = raw.get("num_global_key_value_heads")
        if heads is not None and raw.get("attention_k_eq_v"):
            full["num_key_value_heads"] = heads
        raw["per_layer_config"] = {str(i): full for i, kind in enumerate(types)
                                   if kind == "full_attention"}
    if raw.get("rope_parameters") is None:
        raw["rope_parameters"] = GEMMA4_ROPES
    raw["attention_multiplier"] = 1.0
    if raw.get("use_bidirectional_attention") == "vision":
        raw["use_bidirectional_attention"] = None  # text tokens stay causal
    return raw


def _gemma3n_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma3nTextConfig.__post_init__: without `layer_types` every 5th layer attends
    globally; `intermediate_size` may be one width per layer (read by the checkpoint's
    shapes: the widest stands for all); without `activation_sparsity_pattern` the first
    10 layers of a model of more than 10 keep 5% of their gate; the legacy rope keys as
    Gemma 3's. Its attention scales q.k by 1 (a Hub config's query_pre_attn_scalar is
    never read)."""
    raw = _gemma3_ropes(dict(raw))
    count = int(raw["num_hidden_layers"])
    if raw.get("layer_types") is None:
        raw["layer_types"] = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                              for i in range(count)]
    widths = raw["intermediate_size"]
    if isinstance(widths, list):
        if len(widths) != count:
            raise ValueError(f"intermediate_size lists {len(widths)} widths for {count} layers")
        raw["intermediate_size"] = max(widths)
    if raw.get("activation_sparsity_pattern") is None:
        sparse = 10 if count > 10 else 0
        raw["activation_sparsity_pattern"] = [0.95] * sparse + [0.0] * (count - sparse)
    raw["attention_multiplier"] = 1.0
    return raw


def _gemma4_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("enable_moe_block"):
        return ("the mixture-of-experts block (enable_moe_block, Gemma 4 26B-A4B) is not "
                "supported; only the dense Gemma 4 models")
    return None


def _gemma3n_unsupported(raw: dict[str, Any]) -> str | None:
    # Gemma 4 may have no per-layer inputs (0), Gemma 3n's AltUp layers always add them.
    missing = [key for key in PER_LAYER_INPUT_KEYS if not raw.get(key)]
    if missing:
        return f"{' and '.join(missing)} must be positive: every Gemma 3n layer reads them"
    return None


GEMMA4_ROPES = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}
GEMMA = FamilySpec(
    **ATTENTION_BIAS, norm="rms_plus_one", embed_scale="sqrt_hidden", tie_default=True,
    act_default="gelu_pytorch_tanh", legacy=_gemma_tanh_gelu,
    defaults={"head_dim": 256, "max_position_embeddings": 8192},
    quirks=("embedding x sqrt(hidden)", "(1+w) RMSNorm", "gelu-tanh MLP"),
)
SANDWICH = ("norms before and after attention and MLP", "query_pre_attn_scalar")
GEMMA2 = replace(
    GEMMA, block="sandwich", window="always", sliding=lambda i, raw: i % 2 == 0,
    softcaps=("attn", "final"), legacy=None, act_key="hidden_activation",
    defaults={"head_dim": 256, "max_position_embeddings": 8192, "sliding_window": 4096,
              "query_pre_attn_scalar": 256,
              "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    quirks=(*GEMMA.quirks, *SANDWICH, "attention and final-logit soft-capping"),
)
GEMMA4 = FamilySpec(
    **ATTENTION_BIAS, block="sandwich", qk_norm="head", v_norm=True, layer_scalar=True,
    embed_scale="sqrt_hidden", tie_default=True, act_default="gelu_pytorch_tanh",
    act_key="hidden_activation", window="always", softcaps=("final",),
    rope_types=("proportional",), per_layer_heads=True, legacy=_gemma4_config,
    refuse=_gemma4_unsupported,
    defaults={"vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216,
              "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
              "head_dim": 256, "max_position_embeddings": 131_072, "sliding_window": 512,
              "rms_norm_eps": 1e-6, "vocab_size_per_layer_input": 262_144,
              "hidden_size_per_layer_input": 256, "final_logit_softcapping": None},
    quirks=("embedding x sqrt(hidden)", "gelu-tanh MLP", *SANDWICH[:1],
            "per-head q/k RMSNorm, v RMSNorm without weight", "q.k unscaled",
            "per-layer inputs (a second embedding fed to every layer)",
            "a learned scalar on each layer's output"),
)
# Gemma 3n (E2B, E4B): Gemma 4's attention (per-head q/k RMSNorm, v norm without weight,
# q.k unscaled), per-layer inputs and KV sharing, on AltUp's streams with LAuReL and
# activation sparsity (block "altup"), the final soft-cap.
GEMMA3N = FamilySpec(
    **ATTENTION_BIAS, block="altup", qk_norm="head", v_norm=True, altup=True,
    embed_scale="sqrt_hidden", tie_default=True, act_default="gelu_pytorch_tanh",
    act_key="hidden_activation", window="always", softcaps=("final",),
    legacy=_gemma3n_config, refuse=_gemma3n_unsupported,
    defaults={"vocab_size": 262_400, "hidden_size": 2048, "intermediate_size": 16_384,
              "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2,
              "head_dim": 256, "max_position_embeddings": 32_768, "sliding_window": 512,
              "rms_norm_eps": 1e-6, "vocab_size_per_layer_input": 262_144,
              "hidden_size_per_layer_input": 256, "final_logit_softcapping": 30.0,
              "num_kv_shared_layers": 15, "altup_num_inputs": 4, "altup_active_idx": 0,
              "altup_correct_scale": True, "laurel_rank": 64,
              "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},
    quirks=("embedding x sqrt(hidden)", "gelu-tanh MLP",
            "per-head q/k RMSNorm, v RMSNorm without weight", "q.k unscaled",
            "per-layer inputs (a second embedding fed to every layer)",
            "AltUp streams (predicted before each layer, corrected after it)",
            "a LAuReL low-rank branch beside each layer's attention"),
)
# Gemma 4 Unified (gemma-4-12B): Gemma 4's language model without per-layer inputs nor
# experts (its config class has no such keys, and its model reads none that a config.json
# may carry), its own defaults (window 1024, 262,144 positions).
PER_LAYER_INPUT_KEYS = ("hidden_size_per_layer_input", "vocab_size_per_layer_input")
GEMMA4_UNIFIED = replace(
    GEMMA4, ignores=(*PER_LAYER_INPUT_KEYS, "enable_moe_block", "num_experts",
                     "top_k_experts", "moe_intermediate_size"),
    refuse=None,
    defaults={**{k: v for k, v in GEMMA4.defaults.items() if k not in PER_LAYER_INPUT_KEYS},
              "max_position_embeddings": 262_144, "sliding_window": 1024},
    quirks=tuple(q for q in GEMMA4.quirks if not q.startswith("per-layer inputs")),
)

FAMILIES: dict[str, FamilySpec] = {
    "gemma": GEMMA,
    "gemma2": GEMMA2,
    # VaultGemma: Gemma 2 without the norms after attention and MLP (pre-norm layers).
    "vaultgemma": replace(
        GEMMA2, block="pre", names=replace(LLAMA_NAMES, post_attn_norm="pre_feedforward_layernorm"),
        quirks=(*GEMMA.quirks, SANDWICH[1], "attention and final-logit soft-capping"),
    ),
    "gemma3_text": replace(
        GEMMA, block="sandwich", qk_norm="head", window="always", sliding=every_nth_global,
        softcaps=("final",), legacy=_gemma3_ropes, act_key="hidden_activation",
        defaults={"head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 4096,
                  "query_pre_attn_scalar": 256, "rope_theta": 1_000_000.0,
                  "rope_local_base_freq": 10000.0},
        quirks=(*GEMMA.quirks, *SANDWICH, "per-head q/k (1+w) RMSNorm"),
    ),
    # The image-text checkpoints (gemma-3-4b-it and larger): Gemma3ForConditionalGeneration's
    # language model, exported alone. Their text_config lists only what differs from
    # Gemma3TextConfig's defaults (the 4B's has no head counts nor vocab_size), so all of
    # those are defaults here. The outer config decides the tying (true unless it says
    # otherwise, whatever text_config says) and the EOS ids ([1, 106]). Unlike
    # Gemma3ForCausalLM, the multimodal model applies no final soft-cap.
    "gemma3": replace(
        GEMMA, block="sandwich", qk_norm="head", window="always", sliding=every_nth_global,
        legacy=_gemma3_ropes, act_key="hidden_activation", nested="text_config",
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=towers_left_out(("vision_tower.", "multi_modal_projector.")),
        defaults={"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                  "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                  "head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 4096,
                  "query_pre_attn_scalar": 256, "rope_theta": 1_000_000.0,
                  "rope_local_base_freq": 10000.0},
        quirks=(*GEMMA.quirks, *SANDWICH, "per-head q/k (1+w) RMSNorm",
                "language model of an image-text checkpoint (vision tower left out)"),
    ),
    # Gemma 4 (E2B, E4B, 31B): Gemma 3's sandwich without (1+w) norms, per-head q/k
    # RMSNorm and a v norm without weight, q.k unscaled, wider heads on the full-attention
    # layers with a proportional rope, per-layer inputs, KV shared by the last layers,
    # a scalar on each layer's output, the final soft-cap.
    "gemma4_text": GEMMA4,
    # Gemma4ForConditionalGeneration (the Hub's gemma-4-E2B/E4B, -it): its language model,
    # exported alone; the vision and audio towers and their embedders left out. The outer
    # config decides the tying (true unless it says otherwise).
    "gemma4": replace(
        GEMMA4, nested="text_config", text_types=("gemma4_text",),
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("model.language_model.", "model."),),
        left_out=("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                  "model.embed_audio."),
        quirks=(*GEMMA4.quirks, IMAGE_TEXT_QUIRK),
    ),
    # Gemma 3n: see GEMMA3N.
    "gemma3n_text": GEMMA3N,
    # Gemma3nForConditionalGeneration (the Hub's gemma-3n-E2B/E4B, -it): its language model,
    # exported alone, as Gemma 4's; the vision and audio towers and their embedders (which
    # embed only the ids from 262144 up, none of them text) left out.
    "gemma3n": replace(
        GEMMA3N, nested="text_config", text_types=("gemma3n_text",),
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("model.language_model.", "model."),),
        left_out=("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                  "model.embed_audio."),
        quirks=(*GEMMA3N.quirks, IMAGE_TEXT_QUIRK),
    ),
    "gemma4_unified_text": GEMMA4_UNIFIED,
    # Gemma4UnifiedForConditionalGeneration: its language model, exported alone; the
    # encoder-free vision and audio embedders left out, the tying as gemma4's.
    "gemma4_unified": replace(
        GEMMA4_UNIFIED, nested="text_config", text_types=("gemma4_unified_text",),
        outer={"tie_word_embeddings": True, "eos_token_id": None, "bos_token_id": None},
        renames=(("model.language_model.", "model."),),
        left_out=("model.vision_embedder.", "model.embed_vision.", "model.embed_audio."),
        quirks=(*GEMMA4_UNIFIED.quirks, IMAGE_TEXT_QUIRK),
    ),
}
