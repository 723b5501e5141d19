"""Image-text checkpoints whose language model is another kind's family, read from its
nested config and stored prefix (vision tower left out).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import (
    MoeNames,
    MoeSpec,
    sparse_layers,
)
from edgeprefill.export.families.dense import (
    ATTENTION_BIAS,
    COHERE_COMPASS,
    IMAGE_TEXT_QUIRK,
    MROPE_QUIRKS,
    QWEN_VL,
    after_max_window_layers,
)
from edgeprefill.export.families.dense import FAMILIES as DENSE_FAMILIES
from edgeprefill.export.families.gemma import FAMILIES as GEMMA_FAMILIES
from edgeprefill.export.families.moe import (
    EXPERT_ALIASES,
    GLM4_MOE,
    LLAMA4_TEXT,
    shared_experts,
)
from edgeprefill.export.families.recurrent import LFM2, LFM3
from edgeprefill.export.families.spec import FamilySpec
from edgeprefill.export.families.wrapped import Wrapper


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


def _glm4v_text(raw: dict[str, Any]) -> dict[str, Any]:
    """Glm4vConfig: its text_config, tied where either level says so (pre-v5 saves kept
    tie_word_embeddings inside text_config; Glm4vTextConfig has no default of its own)."""
    inner = raw["text_config"]  # a KeyError names the missing key
    if not isinstance(inner, dict) or inner.get("model_type", "glm4v_text") != "glm4v_text":
        raise ValueError("text_config must be an object of model_type glm4v_text")
    tie = bool(raw.get("tie_word_embeddings") or inner.get("tie_word_embeddings"))
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
        renames=(("model.language_model.", "model."), ("language_model.model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                  "multi_modal_projector."),
        quirks=(*LFM2.quirks, IMAGE_TEXT_QUIRK),
    ),
    # Lfm3VlForConditionalGeneration (LFM3-VL): its LFM3 language model, stored as LFM2-VL's;
    # the vision tower and projector left out.
    "lfm3_vl": replace(
        LFM3, nested="text_config", unnest=_lfm3_vl_text,
        renames=(("model.language_model.", "model."), ("language_model.model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
                  "multi_modal_projector."),
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
        left_out=("vision_model.", "multi_modal_projector.", "model.vision_model.",
                  "model.multi_modal_projector."),
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
    # Emu3ForConditionalGeneration (Emu3-Chat/Gen): a Llama language model (rope base 1e6 by
    # default) stored under text_model. (model.text_model. as transformers 5 names it), its
    # VQ-VAE image tokenizer left out; the outer config decides the tying.
    "emu3": FamilySpec(
        **ATTENTION_BIAS, unsupported=("mlp_bias",), nested="text_config",
        outer={"tie_word_embeddings": False},
        renames=(("text_model.model.", "model."), ("text_model.lm_head.", "lm_head."),
                 ("model.text_model.", "model.")),
        left_out=("vqmodel.", "model.vqmodel."),
        defaults={"rope_theta": 1_000_000.0, "max_position_embeddings": 9216,
                  "rms_norm_eps": 1e-5},
        quirks=(IMAGE_TEXT_QUIRK.replace("vision tower", "VQ-VAE image tokenizer"),),
    ),
    # MllamaForConditionalGeneration (Llama 3.2 11B/90B Vision): its Llama language model as
    # text runs it. Its cross-attention layers (cross_attention_layers) attend to an image
    # only, and transformers runs past them without one: left out, the others read in order.
    # The embedding holds 8 image-token rows more than the head, which transformers never
    # ties to it whatever tie_word_embeddings says.
    "mllama": FamilySpec(
        nested="text_config", text_types=("mllama_text_model",),
        renames=(("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head.")),
        left_out=("vision_model.", "multi_modal_projector.", "model.vision_model.",
                  "model.multi_modal_projector."),
        skipped_layers_key="cross_attention_layers", embed_extra_rows=8,
        ignores=("tie_word_embeddings",),
        defaults={"rope_theta": 500_000.0, "max_position_embeddings": 131072,
                  "rms_norm_eps": 1e-5, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]},
        quirks=("cross-attention layers left out (text skips them)",
                "embedding 8 rows taller than the LM head", IMAGE_TEXT_QUIRK),
    ),
}

# The checkpoints whose language model is whichever text family of ours text_config names
# (families/wrapped.py), as transformers 5.24's config classes default and tie them. Their
# FAMILIES entry is their default language model's (__init__.py).
# The keys FuyuConfig moves from a config.json without text_config into the one it makes
FUYU_TEXT_KEYS = ("vocab_size", "max_position_embeddings", "hidden_size", "intermediate_size",
                  "num_hidden_layers", "num_attention_heads", "hidden_act", "initializer_range",
                  "layer_norm_eps", "use_cache", "qk_layernorm", "hidden_dropout",
                  "attention_dropout", "eos_token_id", "rope_scaling", "rope_theta")
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
    "mistral3": Wrapper("mistral", tie=True),
    # GOT-OCR 2.0 and PP-Chart2Table (GotOcr2ForConditionalGeneration)
    "got_ocr2": Wrapper("qwen2", tie=True),
    "pp_chart2table": Wrapper("qwen2", tie=True),
    # DeepSeek-VL 1.3B/7B (the -hf conversions)
    "deepseek_vl": Wrapper("llama", tie=True, towers=("vision_model.", "aligner.")),
    # VideoLLaMA 3: its Qwen2 beside a vision model and projector
    "video_llama_3": Wrapper("qwen2", tie=False, either_ties=True,
                             towers=("vision_model.", "projector.")),
    # Fuyu-8B: Persimmon under a linear patch embedding (its images enter as embeddings);
    # its Hub config.json is flat, its text keys at the top level
    "fuyu": Wrapper("persimmon", tie=False, towers=("vision_embed_tokens.",),
                    flat_text=FUYU_TEXT_KEYS),
    # MOSS Transcribe-Diarize: Qwen3 beside a Whisper-like audio encoder and its projector
    # (speech enters as embeddings; a text prompt is the Qwen3's alone)
    "moss_transcribe_diarize": Wrapper("qwen3", tie=True,
                                       towers=("audio_tower.", "multi_modal_projector.")),
}
