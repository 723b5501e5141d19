"""Image-text checkpoints whose language model is another kind's family, read from its
nested config and stored prefix (vision tower left out).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    sparse_layers,
    sparse_mlp_layers,
)
from edgeprefill.export.families.dense import (
    ATTENTION_BIAS,
    COHERE_COMPASS,
    GRANITE,
    HUNYUAN_V1_DENSE,
    IMAGE_TEXT_QUIRK,
    MROPE_QUIRKS,
    QWEN_VL,
    after_max_window_layers,
    hunyuan_ntk_alpha,
)
from edgeprefill.export.families.dense import FAMILIES as DENSE_FAMILIES
from edgeprefill.export.families.gemma import FAMILIES as GEMMA_FAMILIES
from edgeprefill.export.families.latent import DEEPSEEK_V2
from edgeprefill.export.families.moe_sigmoid import GLM4_MOE, shared_experts
from edgeprefill.export.families.moe_softmax import ERNIE4_5_MOE, EXPERT_ALIASES, QWEN3_MOE
from edgeprefill.export.families.moe_top_k import LLAMA4_TEXT
from edgeprefill.export.families.recurrent import FAMILIES as RECURRENT_FAMILIES
from edgeprefill.export.families.recurrent import LFM2, LFM3
from edgeprefill.export.families.sparse_attention import HY_V4_VL_TEXT
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec
from edgeprefill.export.families.wrapped import Wrapper, lm_renames, towers_left_out


def _mrope_as_default(raw: dict[str, Any]) -> dict[str, Any]:
    # Qwen2VLTextConfig (and 2.5's): the Hub's "mrope" type is the default rope. M-RoPE
    # splits the frequencies into time, height and width sections, each rotated by its own
    # position; a text token's three positions are equal, so on text it is that rope.
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) == "mrope":
            raw = {**raw, key: {**params, "rope_type": "default"}}
    return raw


def _qwen2_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen2VLConfig and Qwen2_5_VLConfig: a config without `text_config` (the Hub's,
    written before transformers 5) keeps the language model's keys at the top level; with
    one, the model ties the embeddings when either level says so, and generates with the
    outer config's BOS and EOS ids where it has them (else text_config's)."""
    inner = raw.get("text_config")
    if inner is None:
        return raw
    tie = bool(raw.get("tie_word_embeddings") or inner.get("tie_word_embeddings"))
    ids = {k: raw[k] for k in ("bos_token_id", "eos_token_id") if raw.get(k) is not None}
    return {**inner, **ids, "tie_word_embeddings": tie}


def _lfm2_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Lfm2VlConfig: its LFM2 language model, tied by the outer `tie_embedding` (the older
    name, which wins) or `tie_word_embeddings`, true by default (_liquid_vl_text)."""
    tie = raw.get("tie_embedding", raw.get("tie_word_embeddings", True))
    return _liquid_vl_text(raw, "lfm2", tie)


def _lfm3_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Lfm3VlConfig: its LFM3 language model, tied by the outer `tie_word_embeddings`,
    true by default (it has no older name; _liquid_vl_text)."""
    return _liquid_vl_text(raw, "lfm3", raw.get("tie_word_embeddings", True))


def _liquid_vl_text(raw: dict[str, Any], text_type: str, tie: Any) -> dict[str, Any]:
    """LFM2-VL's and LFM3-VL's config: the language model is text_config (of `text_type`,
    also where it names no type); the outer config decides the tying (`tie`, whatever
    text_config says) and the EOS/BOS ids where it gives them."""
    inner = raw["text_config"]  # a KeyError names the missing key
    if not isinstance(inner, dict):
        got = "null" if inner is None else type(inner).__name__
        raise ValueError(f"text_config must be an object, got {got}")
    if inner.get("model_type", text_type) != text_type:
        raise ValueError(f"text_config model_type {inner['model_type']!r} is not supported; "
                         f"supported: {text_type}")
    text = {k: v for k, v in inner.items() if k != "tie_embedding"}
    text["tie_word_embeddings"] = tie
    for key in ("eos_token_id", "bos_token_id"):
        if raw.get(key) is not None:
            text[key] = raw[key]
    return text


# A Qwen3 language model without sliding windows; the outer config decides the tying
# (false unless it says otherwise, whatever text_config says) and a "mrope" rope type is
# refused, as Qwen3VLForConditionalGeneration fails to build on one.
QWEN3_VL = FamilySpec(
    **QWEN_VL, **ATTENTION_BIAS, qk_norm="head",
    outer={"tie_word_embeddings": False, "eos_token_id": None, "bos_token_id": None},
    defaults={"head_dim": 128, "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
              "rope_theta": 500_000.0},
    quirks=("per-head q/k RMSNorm", *MROPE_QUIRKS),
)
# A Qwen2 language model (Qwen2-VL's and Qwen2.5-VL's alike).
QWEN2_VL = FamilySpec(
    **QWEN_VL, qkv_bias=True, window="opt_in", sliding=after_max_window_layers,
    unnest=_qwen2_vl_text, legacy=_mrope_as_default,
    defaults={"max_position_embeddings": 32768, "sliding_window": 4096,
              "max_window_layers": 80, "rms_norm_eps": 1e-5, "rope_theta": 1_000_000.0},
    quirks=("q/k/v biases", *MROPE_QUIRKS),
)


def _glm4v_moe_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Glm4vMoeConfig: its text_config, tied where either level says so (pre-v5 saves
    kept tie_word_embeddings inside text_config); M-RoPE is the default rope on text."""
    inner = raw["text_config"]  # a KeyError names the missing key
    if not isinstance(inner, dict) or inner.get("model_type", "glm4v_moe_text") != \
            "glm4v_moe_text":
        raise ValueError("text_config must be an object of model_type glm4v_moe_text")
    tie = bool(raw.get("tie_word_embeddings") or inner.get("tie_word_embeddings"))
    return {**inner, "tie_word_embeddings": tie}


# GLM-4.5V: GLM-4.5's language model (no q/k norms; attention_bias true by default) under
# model.language_model., beside its vision tower (model.visual.), left out. Its M-RoPE
# turns each section by the token's time, height or width position, all equal on text.
GLM4V_MOE = replace(
    GLM4_MOE, qk_norm=None, qk_norm_key=None, nested="text_config",
    unnest=_glm4v_moe_text,
    legacy=lambda raw: shared_experts("n_shared_experts")(_mrope_as_default(raw)),
    renames=(("model.language_model.", "model."),), left_out=("model.visual.", "visual."),
    defaults={**GLM4_MOE.defaults, "vocab_size": 151424, "max_position_embeddings": 65536,
              "attention_bias": True},
    quirks=(*MROPE_QUIRKS[:1], IMAGE_TEXT_QUIRK),
)

def _shieldgemma2_text(raw: dict[str, Any]) -> dict[str, Any]:
    """ShieldGemma2Config: its Gemma 3 text_config, tied where either level says so (the
    language model's own tying true unless it says otherwise), with the outer config's
    BOS and EOS ids where it has them."""
    inner = raw["text_config"]  # a KeyError names the missing key
    if not isinstance(inner, dict):
        got = "null" if inner is None else type(inner).__name__
        raise ValueError(f"text_config must be an object, got {got}")
    tie = bool(raw.get("tie_word_embeddings") or inner.get("tie_word_embeddings", True))
    ids = {k: raw[k] for k in ("bos_token_id", "eos_token_id") if raw.get(k) is not None}
    return {**inner, **ids, "tie_word_embeddings": tie}


def _glm4v_text(raw: dict[str, Any], text_type: str = "glm4v_text",
                either_ties: bool = True) -> dict[str, Any]:
    """Glm4vConfig: its text_config (of `text_type`), tied where either level says so
    (pre-v5 saves kept tie_word_embeddings inside text_config; Glm4vTextConfig has no
    default of its own); without `either_ties` (GlmgaConfig) as the outer config says,
    false unless given."""
    inner = raw["text_config"]  # a KeyError names the missing key
    if not isinstance(inner, dict) or inner.get("model_type", text_type) != text_type:
        raise ValueError(f"text_config must be an object of model_type {text_type}")
    tie = bool(raw.get("tie_word_embeddings") or
               (either_ties and inner.get("tie_word_embeddings")))
    return {**inner, "tie_word_embeddings": tie}


_GLM4 = DENSE_FAMILIES["glm4"]
# GLM-4.1V / GLM-4.6V (Glm4vForConditionalGeneration): GLM-4's layers under
# model.language_model., the vision tower (model.visual.) left out. Its text attention
# always has q/k/v biases and head_dim hidden / heads (a head_dim or attention_bias key is
# ignored); its rotary turns partial_rotary_factor of each head (all unless given) on
# interleaved pairs, by M-RoPE sections all equal on text positions.
GLM4V = replace(
    _GLM4, qkv_bias=True, bias_key=None, ignores=("head_dim", "attention_bias"),
    nested="text_config", unnest=_glm4v_text, legacy=_mrope_as_default,
    defaults={"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
              "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2,
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0},
    renames=(("model.language_model.", "model."),), left_out=("model.visual.", "visual."),
    quirks=(*_GLM4.quirks, *MROPE_QUIRKS),
)

_GEMMA3 = GEMMA_FAMILIES["gemma3"]
# ShieldGemma 2: a Gemma 3 image-text model (its `model.`) whose classifier reads two of
# its logits; the bundle gives all its logits. transformers 5.24 saves its language model
# under `model.model.language_model.model.` (its head `model.lm_head.`), the Hub's 4.50
# layout is `model.language_model.model.` (head `model.language_model.lm_head.`), and
# AutoModelForImageTextToText (its Gemma3ForConditionalGeneration alone) loads it as
# `model.language_model.`; first match wins.
SHIELDGEMMA2 = replace(
    _GEMMA3, unnest=_shieldgemma2_text,
    renames=(("model.language_model.lm_head.", "lm_head."), ("model.lm_head.", "lm_head."),
             ("model.model.language_model.model.", "model."),
             ("model.model.language_model.", "model."),
             ("model.language_model.model.", "model."), ("model.language_model.", "model.")),
    left_out=(*_GEMMA3.left_out, *(f"model.{prefix}" for prefix in _GEMMA3.left_out)),
)


def _paddleocr_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """PaddleOCRVLConfig: the Hub's flat config is its language model's keys, which its
    config class moves into text_config, leaving its own tie_word_embeddings (true by
    default) as it was: tied. With text_config, tied where either level says so (each
    true unless it says otherwise)."""
    inner = raw.get("text_config")
    if inner is None:
        return {**raw, "tie_word_embeddings": True}
    if not isinstance(inner, dict):
        raise ValueError(f"text_config must be an object, got {type(inner).__name__}")
    tie = bool(raw.get("tie_word_embeddings", True) or inner.get("tie_word_embeddings", True))
    return {**inner, "tie_word_embeddings": tie}


# PaddleOCR-VL (PaddleOCRVLForConditionalGeneration): ERNIE 4.5's layers with use_bias on
# every projection (q/k/v/o and MLP), Qwen2-VL's M-RoPE (halves rotated, not ERNIE's
# interleaved pairs; plain rotary on text positions). The Hub stores the language model as
# a causal LM's (model., lm_head.) beside visual. and mlp_AR.; transformers 5 saves it under
# model.language_model. beside model.visual. and model.projector.
PADDLEOCR_VL = FamilySpec(
    bias_key="use_bias", o_bias=None, mlp_bias=None, nested="text_config",
    unnest=_paddleocr_vl_text, legacy=_mrope_as_default,
    renames=(("model.language_model.", "model."),),
    left_out=("model.visual.", "model.projector.", "visual.", "mlp_AR."),
    defaults={"vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072,
              "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2,
              "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 500_000.0},
    quirks=("q/k/v/o and MLP biases (use_bias)", *MROPE_QUIRKS),
)
# The Qwen Omni thinkers (their ForConditionalGeneration alone): the language model under
# model.language_model. (the Hub's thinker.model., its head thinker.lm_head.), the audio
# and vision towers left out; the outer config decides the tying (false by default).
_THINKER = {
    "nested": "text_config", "outer": {"tie_word_embeddings": False},
    "renames": (("model.language_model.", "model."), ("thinker.model.", "model."),
                ("thinker.lm_head.", "lm_head.")),
    "left_out": tuple(f"{where}{tower}" for where in ("", "model.", "thinker.")
                      for tower in ("audio_tower.", "visual.")),
}
# Qwen2.5-Omni's thinker: a Qwen2 language model (Qwen2-VL's) with M-RoPE
QWEN2_5_OMNI_THINKER = replace(
    QWEN2_VL, unnest=None, **_THINKER,
    defaults={"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
              "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
              "max_position_embeddings": 32768, "sliding_window": 32768,
              "max_window_layers": 28, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0},
)
# Qwen3-Omni-MoE's thinker: Qwen3-MoE's layers (never sliding) with M-RoPE
QWEN3_OMNI_MOE_THINKER = replace(
    QWEN3_MOE, window="never", legacy=_mrope_as_default, **_THINKER,
    defaults={"vocab_size": 3584, "hidden_size": 2048, "intermediate_size": 18944,
              "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
              "rope_theta": 1_000_000.0, "decoder_sparse_step": 1, "num_experts": 128,
              "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True},
    quirks=(*QWEN3_MOE.quirks, *MROPE_QUIRKS),
)


def _nemotron_h_omni_text(raw: dict[str, Any]) -> dict[str, Any]:
    """NemotronH_Omni_Reasoning_V3_Config: its Nemotron-H language model is text_config,
    or llm_config in the released checkpoints (read where text_config is absent).
    transformers never ties its embeddings, whatever either level says."""
    inner = raw.get("text_config")
    inner = raw["llm_config"] if inner is None and "llm_config" in raw else inner
    if not isinstance(inner, dict):
        got = "null" if inner is None else type(inner).__name__
        raise ValueError(f"text_config must be an object, got {got}")
    return {**inner, "tie_word_embeddings": False}


_NEMOTRON_H = RECURRENT_FAMILIES["nemotron_h"]
# Nemotron 3 Nano Omni: a whole Nemotron-H causal LM as language_model. (its layers under
# backbone., as the Hub's, or model., as transformers 5 names them), beside the RADIO
# tower, the audio encoder and their projectors, left out.
NEMOTRON_H_OMNI = replace(
    _NEMOTRON_H, nested="text_config", unnest=_nemotron_h_omni_text,
    renames=(("language_model.backbone.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head.")),
    left_out=("vision_model.", "vision_final_layernorm.", "multi_modal_projector.",
              "audio_tower.", "embed_audio."),
    quirks=(*_NEMOTRON_H.quirks, IMAGE_TEXT_QUIRK),
)


# transformers 5.24's newer image-text checkpoints (stop 43, first half), whose language
# model is close to one of ours under a config class of its own.
# GLM-OCR: GLM-4V's language model without q/k/v biases, under GlmOcrTextConfig's defaults.
GLM_OCR = replace(
    GLM4V, qkv_bias=False, unnest=partial(_glm4v_text, text_type="glm_ocr_text"),
    defaults={"vocab_size": 59392, "hidden_size": 1024, "intermediate_size": 4096,
              "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8,
              "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 10000.0},
)


def _granite_image_text(text_type: str, tie: bool, lm: str, towers: tuple[str, ...],
                        defaults: dict[str, Any]) -> FamilySpec:
    """A Granite language model (text_config of `text_type`) stored under `lm` in
    transformers 5's layout (model.<lm>.) or the Hub's older one (<lm>.model.), whose
    wrapper divides the logits by logits_scaling as GraniteForCausalLM does; the outer
    config decides the tying (`tie` unless it says otherwise)."""
    return replace(
        GRANITE, nested="text_config", text_types=(text_type,),
        outer={"tie_word_embeddings": tie},
        renames=((f"model.{lm}.", "model."), (f"{lm}.model.", "model."),
                 (f"{lm}.lm_head.", "lm_head.")),
        left_out=tuple(prefix for tower in towers for prefix in (f"model.{tower}", tower)),
        defaults={**GRANITE.defaults, **defaults},
        quirks=(*GRANITE.quirks, IMAGE_TEXT_QUIRK),
    )


# Cosmos3 Edge: Llama attention with M-RoPE (plain rotary on text) and an ungated
# ReLU-squared MLP (fc1, fc2), as the Hub stores it (and transformers 5.24 saves it): the
# language model at the top level, attention to_q/to_k/to_v/to_out, MLP up_proj/down_proj.
# The generation modules its loader drops (action_*, time_embedder, *_moe_gen, add_*_proj,
# ...) are not read.
COSMOS3_EDGE = FamilySpec(
    **ATTENTION_BIAS, nested="text_config", text_types=("cosmos3_edge_text",),
    outer={"tie_word_embeddings": False}, unsupported=("mlp_bias",),
    names=replace(LLAMA_NAMES, embed=("embed_tokens.weight",), final_norm="norm",
                  layer="layers.{i}.", q="self_attn.to_q", k="self_attn.to_k",
                  v="self_attn.to_v", o="self_attn.to_out", gate="", up="mlp.up_proj",
                  down="mlp.down_proj"),
    gated_mlp=False, act_default="relu2",
    left_out=("visual.", "projector.", "model.visual.", "model.projector."),
    defaults={"vocab_size": 131072, "hidden_size": 2048, "intermediate_size": 9216,
              "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
              "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "rope_theta": 100_000_000.0},
    quirks=("ReLU-squared MLP without a gate", *MROPE_QUIRKS),
)


def _deepseek_ocr2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """DeepseekOcr2TextConfig: DeepseekV2Config's experts (read by DEEPSEEK_V2's legacy) on
    the layers mlp_layer_types marks "sparse"; head_dim is always hidden / heads."""
    raw = {**raw, "head_dim": int(raw["hidden_size"]) // int(raw["num_attention_heads"])}
    return DEEPSEEK_V2.legacy(raw) if DEEPSEEK_V2.legacy is not None else raw


# DeepSeek-OCR 2: DeepSeek-V2's experts (softmax, greedy or group-limited top k, times
# routed_scaling_factor, shared experts beside them) on the layers mlp_layer_types marks
# "sparse" (its model fails without it), under Llama's attention and rotary (no latent
# attention). The Hub stores the language model as a Llama's (model.layers.) beside its SAM
# and Qwen2 encoders; transformers 5 under model.language_model.
DEEPSEEK_OCR2 = replace(
    DEEPSEEK_V2, latent=False, rope_interleaved=False, nested="text_config",
    text_types=("deepseek_ocr2_text",), outer={"tie_word_embeddings": False},
    legacy=_deepseek_ocr2_config, required=("num_experts_per_tok", "mlp_layer_types"),
    moe=replace(DEEPSEEK_V2.moe, layers=sparse_mlp_layers) if DEEPSEEK_V2.moe else None,
    renames=(("model.language_model.", "model."),),
    left_out=tuple(f"model.{tower}" for tower in (
        "vision_tower.", "multi_modal_projector.", "view_separator", "sam_model.",
        "qwen2_model.", "projector.", "view_seperator")),
    defaults={k: v for k, v in DEEPSEEK_V2.defaults.items()
              if k not in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                           "qk_rope_head_dim", "v_head_dim")},
    quirks=("dense and sparse layers (mlp_layer_types)", IMAGE_TEXT_QUIRK),
)


def _hunyuan_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """HunYuanVLConfig: its text_config, or where it has none (the Hub's flat configs) the
    language model's keys at the top level; tied where either level says so, true unless
    the outer config says otherwise."""
    inner = raw.get("text_config")
    if inner is None:
        return {k: v for k, v in raw.items() if k != "vision_config"}
    if not isinstance(inner, dict):
        raise ValueError(f"text_config must be an object, got {type(inner).__name__}")
    if inner.get("model_type", "hunyuan_vl_text") != "hunyuan_vl_text":
        raise ValueError("text_config must be an object of model_type hunyuan_vl_text")
    tie = bool(raw.get("tie_word_embeddings", True) or inner.get("tie_word_embeddings"))
    return {**inner, "tie_word_embeddings": tie}


def _hunyuan_vl_rope(raw: dict[str, Any]) -> dict[str, Any]:
    # HunYuanVLTextConfig reads the Hub's "xdrope" as HunYuan's "dynamic" rope (with an
    # `alpha`: a fixed NTK stretch, hunyuan_ntk_alpha); its sections (xdrope_section or
    # mrope_section) turn text positions all alike.
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) == "xdrope":
            raw = {**raw, key: {**params, "rope_type": "dynamic", "type": "dynamic"}}
    return hunyuan_ntk_alpha(raw)


# HunyuanOCR (HunYuanVLForConditionalGeneration): HunYuan dense's language model under
# model.language_model. (the Hub's: model.), its ViT (vit., model.vision_tower.) left out.
HUNYUAN_VL = replace(
    HUNYUAN_V1_DENSE, unnest=_hunyuan_vl_text, legacy=_hunyuan_vl_rope,
    renames=(("model.language_model.", "model."),),
    left_out=("vit.", "model.vit.", "model.vision_tower.", "vision_tower."),
    defaults={**HUNYUAN_V1_DENSE.defaults, "vocab_size": 290943,
              "max_position_embeddings": 2048},
    quirks=(*HUNYUAN_V1_DENSE.quirks, *MROPE_QUIRKS),
)


def _ernie4_5_vl_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Ernie4_5_VLMoeTextConfig: ERNIE-4.5-MoE's keys (read by its legacy) with a width per
    modality in moe_intermediate_size ([text, vision], [1536, 512] unless given; the text
    experts and the shared MLP are the text's) and experts on the layers mlp_layer_types
    marks "sparse" (all but the first unless given)."""
    widths = raw.get("moe_intermediate_size") or [1536, 512]
    kinds = raw.get("mlp_layer_types") or \
        ["dense"] + ["sparse"] * (int(raw["num_hidden_layers"]) - 1)
    text = {**raw, "moe_intermediate_size": widths[0], "mlp_layer_types": kinds}
    return ERNIE4_5_MOE.legacy(text) if ERNIE4_5_MOE.legacy is not None else text


# ERNIE 4.5 VL (Ernie4_5_VLMoeForConditionalGeneration): ERNIE-4.5-MoE's language model
# whose experts are split by modality. On text every token takes the text experts: the
# first num_experts of the layer's list, its router `mlp.gate.weight` (stored [H, E]) and
# row 0 of the selection bias [2, E]; the vision experts (the rest of the list,
# `gate.weight_1`) are not read. Its 3-D rotary turns interleaved pairs by the token's
# time, height or width position, all equal on text: ERNIE's interleaved rotary.
ERNIE4_5_VL_MOE = replace(
    ERNIE4_5_MOE, nested="text_config", text_types=("ernie4_5_vl_moe_text",),
    outer={"tie_word_embeddings": True}, legacy=_ernie4_5_vl_text,
    moe=replace(ERNIE4_5_MOE.moe, layers=sparse_mlp_layers,
                names=replace(ERNIE4_5_MOE.moe.names, router_hidden_first=True,
                              modalities=2)) if ERNIE4_5_MOE.moe else None,
    renames=(("model.language_model.", "model."),),
    left_out=tuple(f"model.{tower}" for tower in (
        "vision_model.", "resampler_model.", "vision_tower.")),
    defaults={k: v for k, v in ERNIE4_5_MOE.defaults.items() if k != "moe_intermediate_size"},
    quirks=(*ERNIE4_5_MOE.quirks, "experts per modality (the text's read)",
            *MROPE_QUIRKS),
)

# Hy4-VL (HYV4VLForConditionalGeneration): Hy4-VL's language model (hy_v4_vl_text:
# families/sparse_attention.py), its head the outer config's (untied unless it says
# otherwise). transformers 5.24 saves the language model as the Hub stores it (model.,
# Hy4's Hub names) beside the tower (vit.), and loads it under model.language_model.
# (also read, as its conversion mapping keeps it) beside model.vision_tower.; the
# multi-token-prediction layers (model.mtp_layers.) are left out, as it ignores them.
HY_V4_VL = replace(
    HY_V4_VL_TEXT, nested="text_config", text_types=("hy_v4_vl_text",),
    outer={"tie_word_embeddings": False}, renames=(("model.language_model.", "model."),),
    left_out=("vit.", "model.vision_tower.", "model.mtp_layers.",
              "model.language_model.mtp_layers."),
    quirks=(*HY_V4_VL_TEXT.quirks, *MROPE_QUIRKS),
)

_PHI3 = DENSE_FAMILIES["phi3"]
# Phi-4-multimodal: Phi-3's layers beside image and audio embedders (embed_tokens_extend),
# which leave a text-only prompt's embeddings as they are; its config class's sizes.
PHI4_MULTIMODAL = replace(
    _PHI3, left_out=("model.embed_tokens_extend.",),
    defaults={**_PHI3.defaults, "vocab_size": 200064, "hidden_size": 3072,
              "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "max_position_embeddings": 131072},
    quirks=(*_PHI3.quirks, "language model of an image-audio-text checkpoint (the image and "
            "audio embedders left out)"),
)


# Emu3's language model (Emu3TextConfig): Llama, rope base 1e6 by default, untied.
EMU3_TEXT = FamilySpec(
    **ATTENTION_BIAS, unsupported=("mlp_bias",),
    defaults={"rope_theta": 1_000_000.0, "max_position_embeddings": 9216,
              "rms_norm_eps": 1e-5},
)
# Mllama's language model (MllamaTextConfig, Llama 3.2 Vision's): Llama as text runs it.
# Its cross-attention layers (cross_attention_layers) attend to an image only, and
# transformers runs past them without one: left out, the others read in order. The
# embedding holds 8 image-token rows more than the head, which transformers never ties to
# it whatever tie_word_embeddings says.
MLLAMA_TEXT = FamilySpec(
    skipped_layers_key="cross_attention_layers", embed_extra_rows=8,
    ignores=("tie_word_embeddings",),
    defaults={"rope_theta": 500_000.0, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]},
    quirks=("cross-attention layers left out (text skips them)",
            "embedding 8 rows taller than the LM head"),
)

FAMILIES: dict[str, FamilySpec] = {
    "phi4_multimodal": PHI4_MULTIMODAL,
    "qwen2_vl": QWEN2_VL,
    "qwen2_5_vl": QWEN2_VL,  # the same language model as Qwen2-VL's
    "qwen3_vl": QWEN3_VL,
    # Qwen3-VL-MoE (Qwen3-VL-30B-A3B, 235B-A22B): Qwen3-VL's language model with Qwen3-MoE's
    # experts (on the layers sparse_layers gives, where num_experts is not 0); its router
    # always renormalizes the top k, and the Hub stores each layer's experts fused and
    # transposed ([E, H, 2I], [E, I, H]; save_pretrained writes them untransposed).
    "qwen3_vl_moe": replace(
        QWEN3_VL,
        moe=MoeSpec(names=MoeNames(fused_transposable=True), experts_keys=EXPERT_ALIASES,
                    layers=sparse_layers, norm_key=None, renormalize=True),
        defaults={"max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
                  "rope_theta": 500_000.0, "intermediate_size": 5632,
                  "num_key_value_heads": 16, "decoder_sparse_step": 1, "num_experts": 60,
                  "num_experts_per_tok": 4, "moe_intermediate_size": 1408},
    ),
    # Lfm2VlForConditionalGeneration (LFM2-VL 450M/1.6B/3B): its LFM2 language model, the
    # SigLIP 2 tower and projector left out.
    "lfm2_vl": replace(
        LFM2, nested="text_config", unnest=_lfm2_vl_text,
        renames=lm_renames(),
        left_out=towers_left_out(("vision_tower.", "multi_modal_projector.")),
        quirks=(*LFM2.quirks, IMAGE_TEXT_QUIRK),
    ),
    # Lfm3VlForConditionalGeneration (LFM3-VL): its LFM3 language model, stored as LFM2-VL's;
    # the vision tower and projector left out.
    "lfm3_vl": replace(
        LFM3, nested="text_config", unnest=_lfm3_vl_text,
        renames=lm_renames(),
        left_out=towers_left_out(("vision_tower.", "multi_modal_projector.")),
        quirks=(*LFM3.quirks, IMAGE_TEXT_QUIRK),
    ),
    "glm4v_moe": GLM4V_MOE,
    "shieldgemma2": SHIELDGEMMA2,
    "glm4v": GLM4V,
    "glm46v": GLM4V,  # GLM-4.6V: Glm46VConfig, the same language model and layout
    # Llama4ForConditionalGeneration (Llama 4 Scout and Maverick on the Hub): its Llama 4
    # language model (language_model.model.*), the vision model and projector left out.
    "llama4": replace(
        LLAMA4_TEXT, nested="text_config", text_types=("llama4_text",),
        outer={"tie_word_embeddings": False},
        renames=(("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=towers_left_out(("vision_model.", "multi_modal_projector.")),
        quirks=(*LLAMA4_TEXT.quirks, IMAGE_TEXT_QUIRK),
    ),
    # CohereCompassForConditionalGeneration (North Vision): its Cohere Compass language
    # model under model.language_model., the Qwen3-VL tower left out; the outer config
    # decides the tying (false unless it says otherwise).
    "cohere_compass": replace(
        COHERE_COMPASS, nested="text_config", text_types=("cohere_compass_text",),
        outer={"tie_word_embeddings": False},
        renames=(("model.language_model.", "model."),), left_out=("model.visual.",),
        quirks=(*COHERE_COMPASS.quirks, IMAGE_TEXT_QUIRK),
    ),
    # Emu3ForConditionalGeneration (Emu3-Chat/Gen): its Llama language model (EMU3_TEXT)
    # stored under text_model. (model.text_model. as transformers 5 names it), its VQ-VAE
    # image tokenizer left out; the outer config decides the tying.
    "emu3": replace(
        EMU3_TEXT, nested="text_config", text_types=("emu3_text_model",),
        outer={"tie_word_embeddings": False},
        renames=(("text_model.model.", "model."), ("text_model.lm_head.", "lm_head."),
                 ("model.text_model.", "model.")),
        left_out=("vqmodel.", "model.vqmodel."),
        quirks=(IMAGE_TEXT_QUIRK.replace("vision tower", "VQ-VAE image tokenizer"),),
    ),
    # MllamaForConditionalGeneration (Llama 3.2 11B/90B Vision): its language model
    # (MLLAMA_TEXT) under language_model. or model.language_model., the vision tower and
    # projector left out.
    "mllama": replace(
        MLLAMA_TEXT, nested="text_config", text_types=("mllama_text_model",),
        renames=(("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=towers_left_out(("vision_model.", "multi_modal_projector.")),
        quirks=(*MLLAMA_TEXT.quirks, IMAGE_TEXT_QUIRK),
    ),
    # The two language models alone, as transformers 5 saves them after loading the
    # image-text checkpoint with AutoModelForCausalLM (Emu3ForCausalLM, MllamaForCausalLM:
    # config model_type emu3_text_model / mllama_text_model, tensors under model. and
    # lm_head.), as fine-tuning scripts load and save them.
    "emu3_text_model": EMU3_TEXT,
    "mllama_text_model": MLLAMA_TEXT,
    "nemotron_h_omni": NEMOTRON_H_OMNI,
    "paddleocr_vl": PADDLEOCR_VL,
    "qwen2_5_omni_thinker": QWEN2_5_OMNI_THINKER,
    "qwen3_omni_moe_thinker": QWEN3_OMNI_MOE_THINKER,
    # transformers 5.24's newer image-text checkpoints (stop 43, first half)
    "cosmos3_edge": COSMOS3_EDGE,
    "deepseek_ocr2": DEEPSEEK_OCR2,
    "ernie4_5_vl_moe": ERNIE4_5_VL_MOE,
    "glm_ocr": GLM_OCR,
    # Glm46VForConditionalGeneration under GlmgaConfig: GLM-4.6V's, tied as the outer
    # config alone says
    "glmga": replace(GLM4V, unnest=partial(_glm4v_text, either_ties=False)),
    "hunyuan_vl": HUNYUAN_VL,
    "hy_v4_vl": HY_V4_VL,
    # Granite 4 Vision: LLaVA-NeXT's layout, its projectors per layer (deepstack, added at
    # image positions only) and spatial ones
    "granite4_vision": _granite_image_text(
        "granite4_vision_text", tie=False, lm="language_model",
        towers=("vision_tower.", "image_newline", "layerwise_projectors.",
                "spatial_projectors."),
        defaults={"rms_norm_eps": 1e-6}),
    # Granite Docling: Idefics 3's layout (model.text_model.), tied unless it says otherwise
    "granite_docling": _granite_image_text(
        "granite_docling_text", tie=True, lm="text_model",
        towers=("vision_model.", "density_router."),
        defaults={"vocab_size": 133800, "hidden_size": 1024, "intermediate_size": 2048,
                  "num_hidden_layers": 28, "num_attention_heads": 16,
                  "num_key_value_heads": 4, "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-5, "embedding_multiplier": 12.0, "logits_scaling": 4.0,
                  "residual_multiplier": 0.263, "attention_multiplier": 0.015625}),
}

# The checkpoints whose language model is whichever text family of ours text_config names
# (families/wrapped.py), as transformers 5.24's config classes default and tie them. Their
# FAMILIES entry is their default language model's (__init__.py).
# The keys FuyuConfig moves from a config.json without text_config into the one it makes
FUYU_TEXT_KEYS = ("vocab_size", "max_position_embeddings", "hidden_size", "intermediate_size",
                  "num_hidden_layers", "num_attention_heads", "hidden_act", "initializer_range",
                  "layer_norm_eps", "use_cache", "qk_layernorm", "hidden_dropout",
                  "attention_dropout", "eos_token_id", "rope_scaling", "rope_theta")
# The keys Dots3NoteConfig passes from a config.json without text_config (its released
# checkpoints') to the Dots3NoteTextConfig it makes: the class's own and the legacy ones
# its __post_init__ reads
DOTS3_TEXT_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "n_shared_experts",
    "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "n_group", "topk_group",
    "num_experts_per_tok", "norm_topk_prob", "hidden_act", "max_position_embeddings",
    "rms_norm_eps", "pad_token_id", "bos_token_id", "eos_token_id", "rope_parameters",
    "mlp_layer_types", "attention_bias", "index_topk", "index_head_dim", "index_n_heads",
    "mlp_bias", "head_dim", "layer_types", "sliding_window",
    "shared_experts_intermediate_size", "per_layer_config", "first_k_dense_replace",
    "moe_layer_freq", "use_dsa", "use_sliding_window", "moe_shared_expert_intermediate_size",
    "sliding_window_size", "rope_theta", "rope_scaling", "swa_rope_theta",
    *(f"swa_{key}" for key in ("num_attention_heads", "num_key_value_heads", "q_lora_rank",
                               "kv_lora_rank", "head_dim", "qk_nope_head_dim", "v_head_dim",
                               "qk_rope_head_dim")))
_LLAVA_NEXT = ("vision_tower.", "multi_modal_projector.", "image_newline")
_IDEFICS = {"lm": "text_model", "towers": ("vision_model.", "connector.")}
WRAPPERS: dict[str, Wrapper] = {
    # LlavaConfig and its kin forward text_config's tying to the model (either_ties)
    "llava": Wrapper("llama", tie=False, either_ties=True),
    "llava_next": Wrapper("llama", tie=False, towers=_LLAVA_NEXT),
    "llava_next_video": Wrapper("llama", tie=False, either_ties=True, towers=_LLAVA_NEXT),
    "llava_onevision": Wrapper("qwen2", tie=False, either_ties=True, towers=_LLAVA_NEXT),
    "video_llava": Wrapper("llama", tie=False, towers=(
        "image_tower.", "video_tower.", "multi_modal_projector.")),
    "vipllava": Wrapper("llama", tie=False),
    # SmolVLM and Idefics 3: the language model is `model.text_model.`
    "smolvlm": Wrapper("llama", tie=False, **_IDEFICS),
    "idefics3": Wrapper("llama", tie=False, **_IDEFICS),
    "idefics2": Wrapper("mistral", tie=False, **_IDEFICS),
    # Aya Vision, Command A Vision: Cohere 2, without Cohere2ForCausalLM's logit_scale
    "aya_vision": Wrapper("cohere2", tie=True),
    "cohere2_vision": Wrapper("cohere2", tie=True),
    # InternVL 3/3.5 (-hf): Qwen2, Qwen3 or Llama language models
    "internvl": Wrapper("qwen2", tie=True),
    # FastVLM (its tower a timm model) and LightOnOCR (its encoder Pixtral's)
    "fast_vlm": Wrapper("qwen2", tie=False, either_ties=True),
    "lighton_ocr": Wrapper("qwen3", tie=True, towers=("vision_encoder.",
                                                       "vision_projection.")),
    # PerceptionLM: its tower a timm model; tied as text_config says where it says nothing
    "perception_lm": Wrapper("llama", tie=None),
    # Mistral3ForConditionalGeneration: Ministral 3 3B/8B/14B (text_config "ministral3") and
    # Mistral Small 3.1/3.2 ("mistral", its config class's default)
    # and Mistral Small 4 ("mistral4": latent.py)
    "mistral3": Wrapper("mistral", tie=True),
    # GOT-OCR 2.0 and PP-Chart2Table (GotOcr2ForConditionalGeneration)
    "got_ocr2": Wrapper("qwen2", tie=True),
    "pp_chart2table": Wrapper("qwen2", tie=True),
    # DeepSeek-VL 1.3B/7B (the -hf conversions)
    "deepseek_vl": Wrapper("llama", tie=True, towers=("vision_model.", "aligner.")),
    # VideoLLaMA 3: its Qwen2 beside a vision model and projector
    "video_llama_3": Wrapper("qwen2", tie=False, either_ties=True,
                             towers=("vision_model.", "projector.")),
    # Janus / Janus-Pro: its Llama beside the understanding tower and the image generator
    "janus": Wrapper("llama", tie=True, towers=(
        "vision_model.", "aligner.", "vqmodel.", "generation_embeddings.",
        "generation_aligner.", "generation_head.")),
    # MiniCPM-V 4.6/4.7 and MiniCPM-OCR: a Qwen3.5 language model (text positions: plain
    # 1-D ones, which Qwen3.5's text model makes of them)
    **{name: Wrapper("qwen3_5_text", tie=tie, towers=("vision_tower.", "merger."))
       for name, tie in (("minicpm_ocr", True), ("minicpmv4_6", False),
                         ("minicpmv4_7", False))},
    # Ovis2: its Qwen2 beside a visual tokenizer and its embedding table
    "ovis2": Wrapper("qwen2", tie=True, towers=("vision_tower.", "visual_embeddings_table.")),
    # Qianfan-OCR: InternVL's layout (the Hub's vision_model. and mlp1. beside
    # language_model.model. and language_model.lm_head.) around a Qwen3. transformers 5.24
    # loads it renaming the tower's `encoder.layers.` to `layers.` wherever they occur, so
    # its saves hold the language model's layers as `language_model.model.encoder.layers.`.
    "qianfan_ocr": Wrapper("qwen3", tie=False, towers=(
        "vision_tower.", "multi_modal_projector.", "vision_model.", "mlp1."),
        renames=(("language_model.model.encoder.layers.", "model.layers."),)),
    # transformers 5.24's newer image-text checkpoints (stop 43, first half)
    # Apertus 1.5: its text model beside an image and an audio tokenizer (their codes are
    # vocabulary ids); a head pruned to the text rows is refused (apertus1p5_text's)
    "apertus1p5": Wrapper("apertus1p5_text", tie=False, text_types=("apertus1p5_text",),
                          towers=("vision_tokenizer.", "audio_tokenizer.")),
    # DeepSeek-VL hybrid 7B: DeepSeek-VL's Llama beside a SigLIP and a SAM tower
    "deepseek_vl_hybrid": Wrapper("llama", tie=True, towers=(
        "vision_model.", "aligner.", "high_res_vision_")),
    # EXAONE 4.5: its EXAONE 4 (text positions 1-D; its 2-D rotary is the tower's)
    # (its first configs' text_config said "exaone4_5_text")
    "exaone4_5": Wrapper("exaone4", tie=False, text_types=("exaone4",),
                         aliases=(("exaone4_5_text", "exaone4"),), towers=("visual.",)),
    # HyperCLOVA X SEED Vision (V2): HyperCLOVA X, whose logits it too multiplies by
    # logits_scaling; its head stored inside the language model (the Hub's layout, and
    # transformers 5.24's save), the projector `vision_projector.` on the Hub
    "hyperclovax_vision_v2": Wrapper(
        "hyperclovax", tie=True, head=True, text_types=("hyperclovax",),
        renames=(("model.language_model.lm_head.", "lm_head."),
                 ("model.language_model.model.", "model.")),
        towers=("vision_model.", "projector.", "vision_projector.")),
    # Kimi K2.5: its DeepSeek-V3 (Kimi K2; the Hub's text_config says "kimi_k2")
    "kimi_k25": Wrapper("deepseek_v3", tie=True, text_types=("deepseek_v3",),
                        aliases=(("kimi_k2", "deepseek_v3"),),
                        towers=("vision_tower.", "mm_projector.")),
    # Aria: its mixture-of-experts language model (aria_text) beside an Idefics 3 tower
    "aria": Wrapper("aria_text", tie=False),
    # Fuyu-8B: Persimmon under a linear patch embedding (its images enter as embeddings);
    # its Hub config.json is flat, its text keys at the top level
    "fuyu": Wrapper("persimmon", tie=False, towers=("vision_embed_tokens.",),
                    flat_text=FUYU_TEXT_KEYS),
    # dots.3 Note: dots3_note_text (families/dots3.py) beside its vision and audio towers
    # (transformers 5's model.vision_tower. and model.audio_tower.; the released
    # checkpoints' vision_encoder., audio_encoder. and audio_adapter., their language model
    # already under model.); the released config.json is flat, its text keys at the top
    "dots3_note": Wrapper("dots3_note_text", tie=False, text_types=("dots3_note_text",),
                          towers=("vision_tower.", "audio_tower.", "vision_encoder.",
                                  "audio_encoder.", "audio_adapter."),
                          flat_text=DOTS3_TEXT_KEYS),
    # MiniMax-M3 (MiniMaxM3SparseForConditionalGeneration): its language model
    # (minimax_m3_vl_text) beside a vision tower and projector, its head the causal LM's;
    # MiniMaxM3VLConfig ties where either config says so
    "minimax_m3_vl": Wrapper("minimax_m3_vl_text", tie=False, either_ties=True,
                             text_types=("minimax_m3_vl_text",), towers=(
                                 "vision_tower.", "multi_modal_projector.",
                                 "patch_merge_mlp.")),
    # MOSS Transcribe-Diarize: Qwen3 beside a Whisper-like audio encoder and its projector
    # (speech enters as embeddings; a text prompt is the Qwen3's alone)
    "moss_transcribe_diarize": Wrapper("qwen3", tie=True,
                                       towers=("audio_tower.", "multi_modal_projector.")),
    # Step 3.7: its Step 3.5 language model (step3p5) stored as a causal LM's (`model.`,
    # `lm_head.`) beside the Hub's vision_model and vit_large_projector; tied only where
    # the outer config says so
    "step3p7": Wrapper("step3p5", tie=False, text_types=("step3p5",), any_text_type=True,
                       towers=("vision_model.", "vit_large_projector.",
                               "multi_modal_projector.")),
}
