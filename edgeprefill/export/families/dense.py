"""Dense decoder families: Llama and the families that differ from it in norms, blocks,
biases, rotary, tensor names or config keys; and the conventions of the image-text Qwen
checkpoints (QWEN_VL) the other kinds share.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edgeprefill.export.config_checks import check_sizes
from edgeprefill.export.config_values import given
from edgeprefill.export.families.spec import LLAMA_NAMES, FamilySpec, TensorNames
from edgeprefill.export.rope import rope_params


def after_max_window_layers(i: int, raw: dict[str, Any]) -> bool:
    return i >= int(raw.get("max_window_layers", 28))


def _nope_layers(i: int, raw: dict[str, Any]) -> bool:
    """SmolLM3: the layers without rotary slide (its `no_rope_layers`, 1 = rope)."""
    flags = raw.get("no_rope_layers")
    if flags is None:
        interval = int(raw.get("no_rope_layer_interval", 4))
        return (i + 1) % interval == 0
    return i < len(flags) and not flags[i]


def every_nth_global(i: int, raw: dict[str, Any]) -> bool:
    return bool((i + 1) % int(raw.get("sliding_window_pattern", 6)))


def _phi3_longrope(raw: dict[str, Any]) -> dict[str, Any]:
    # Phi3Config: the rope types "su" and "yarn" of earlier versions are longrope.
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) in (
                "su", "yarn"):
            raw = {**raw, key: {**params, "rope_type": "longrope", "type": "longrope"}}
    return raw


def _neox_rotary_base(raw: dict[str, Any]) -> dict[str, Any]:
    # GPTNeoXConfig: `rotary_emb_base` is the older name of rope_theta.
    params = rope_params(raw)
    if raw.get("rope_theta") is None and "rope_theta" not in params:
        raw = {**raw, "rope_theta": raw.get("rotary_emb_base", 10000.0)}
    return raw


def _olmo3_ropes(raw: dict[str, Any]) -> dict[str, Any]:
    # Olmo3Config: a rope per layer type. A legacy `rope_scaling` and `rope_theta` go to
    # the global layers only; the local ones keep a default rope on the default base
    # (the class pops rope_theta for the global entry, so the local entry never sees it).
    params = raw.get("rope_parameters") or {}
    full = {"rope_type": "default", **(params.get("full_attention") or {}),
            **(raw.get("rope_scaling") or {})}
    full.setdefault("rope_theta", raw.get("rope_theta", OLMO3_THETA))
    sliding = {"rope_type": "default", "rope_theta": OLMO3_THETA,
               **(params.get("sliding_attention") or {})}
    rest = {k: v for k, v in raw.items() if k != "rope_scaling"}  # merged: read no more
    return {**rest, "rope_parameters": {"full_attention": full, "sliding_attention": sliding}}


def hunyuan_ntk_alpha(raw: dict[str, Any]) -> dict[str, Any]:
    # HunYuanDenseV1RotaryEmbedding: the checkpoints' "dynamic" rope with an `alpha` is a
    # fixed NTK stretch of the base, not transformers' length-dependent dynamic rope.
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if isinstance(params, dict) and params.get("alpha") and \
                params.get("rope_type", params.get("type")) == "dynamic":
            raw = {**raw, key: {**params, "rope_type": "ntk_alpha", "type": "ntk_alpha"}}
    return raw


def _exaone_aliases(raw: dict[str, Any]) -> dict[str, Any]:
    # ExaoneConfig's attribute_map: the Hub's config.json names these keys its own way, and
    # the alias wins where both are given.
    for alias, key in EXAONE_ALIASES.items():
        if alias in raw:
            raw = {**{k: v for k, v in raw.items() if k != alias}, key: raw[alias]}
    return raw


def _rope_unless_given(rope: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A config class that, without rope_parameters (absent or null) nor a legacy
    rope_scaling, takes `rope` whatever a top-level rope_theta says (Ministral3Config's
    yarn rope with Llama 4's query scale, ApertusConfig's and CwmConfig's llama3 rope)."""
    def read(raw: dict[str, Any]) -> dict[str, Any]:
        if raw.get("rope_parameters") is None and not raw.get("rope_scaling"):
            raw = {**raw, "rope_parameters": dict(rope)}
        return raw

    return read


def _parallel_if_configured(raw: dict[str, Any]) -> str:
    return "shared" if raw.get("use_parallel_residual") else "pre"


def _gpt2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """GPT2Config and GPTBigCodeConfig: their own key names, of which hidden_size,
    num_hidden_layers, num_attention_heads and max_position_embeddings are aliases that
    win (attribute_map); an MLP n_inner wide (4 x n_embd when null); no layer rotates
    (positions are the learned `wpe` table); scale_attn_weights false leaves q.k unscaled;
    GPTBigCode's multi_query keeps one KV head."""
    raw = dict(raw)
    for key, alias in GPT2_ALIASES.items():
        raw[alias] = raw.get(alias, raw[key])
    check_sizes(raw)  # n_layer as num_hidden_layers, before its layers are listed
    hidden = int(raw["hidden_size"])
    raw["intermediate_size"] = raw["n_inner"] if raw["n_inner"] is not None else 4 * hidden
    raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    if not raw["scale_attn_weights"]:
        raw["attention_multiplier"] = 1.0
    if raw.get("model_type") == "gpt_bigcode" and raw["multi_query"]:
        raw["num_key_value_heads"] = 1
    return raw


def _gpt2_unsupported(raw: dict[str, Any]) -> str | None:
    if raw.get("model_type") == "gpt_bigcode" and not raw["multi_query"]:
        return "multi_query=false (a q/k/v projection interleaved per head) is not supported"
    return None


def _internlm3_aliases(raw: dict[str, Any]) -> dict[str, Any]:
    # InternLM3Config's attribute_map: the Hub's qkv_bias and bias win where both are given
    for alias, key in (("qkv_bias", "attention_bias"), ("bias", "mlp_bias")):
        if alias in raw:
            raw = {**{k: v for k, v in raw.items() if k != alias}, key: raw[alias]}
    return raw


def _internlm3_unsupported(raw: dict[str, Any]) -> str | None:
    if bool(raw["attention_bias"]) != bool(raw["mlp_bias"]):  # InternLM3Config refuses it
        return ("qkv_bias (attention_bias) and bias (mlp_bias) must be equal (its config "
                "class refuses them otherwise)")
    if raw["mlp_bias"]:
        return "bias=true (biases on the gated MLP) is not supported"
    return None


def _modernbert_decoder_config(raw: dict[str, Any]) -> dict[str, Any]:
    """ModernBertDecoderConfig: every global_attn_every_n_layers-th layer (from the first)
    global, the others sliding over sliding_window tokens (local_attention // 2 unless
    config.json has the key, as saved configs do); a rope per layer type, a
    legacy rope_scaling merged into both, thetas from global_rope_theta and
    local_rope_theta (160000 and 10000 by default)."""
    raw = dict(raw)
    count = int(raw["num_hidden_layers"])
    if raw.get("layer_types") is None:
        every = int(raw.get("global_attn_every_n_layers", 3))
        raw["layer_types"] = ["sliding_attention" if i % every else "full_attention"
                              for i in range(count)]
    if "sliding_window" not in raw:  # a key of its own wins, null included
        local = raw["local_attention"]
        raw["sliding_window"] = int(local) // 2 if local else -1
    params = raw.get("rope_parameters") or {}
    scaling = raw.pop("rope_scaling", None) or {}
    ropes = {}
    for kind, theta in (("full_attention", raw.get("global_rope_theta", 160_000.0)),
                        ("sliding_attention", raw.get("local_rope_theta", 10_000.0))):
        ropes[kind] = {"rope_type": "default", **(params.get(kind) or {}), **scaling}
        ropes[kind].setdefault("rope_theta", theta)
    raw["rope_parameters"] = ropes
    return raw


def _modernbert_decoder_unsupported(raw: dict[str, Any]) -> str | None:
    for key, value, what in MODERNBERT_SWITCHES:
        if bool(raw[key]) != value:
            return f"{key}={str(not value).lower()} ({what}) is not supported"
    window = raw["sliding_window"]
    if window is None or int(window) < 1:
        return ("sliding layers without a window (sliding_window null, or local_attention "
                "null) are not supported")
    return None


# ModernBERT decoder's switches export supports one way only: key, that value, what the
# other asks for.
MODERNBERT_SWITCHES = (
    ("norm_bias", False, "LayerNorms with bias"),
    ("mlp_bias", False, "biases on the gated MLP"),
    ("classifier_bias", False, "a bias on the prediction head's dense layer"),
    ("decoder_bias", True, "an LM head without bias"),
)
MODERNBERT_NAMES = TensorNames(
    embed=("model.embeddings.tok_embeddings.weight",), embed_norm="model.embeddings.norm",
    final_norm="model.final_norm", lm_head=("decoder",), q="attn.q_proj", k="attn.k_proj",
    v="attn.v_proj", o="attn.Wo", gate_up="mlp.Wi", down="mlp.Wo", input_norm="attn_norm",
    post_attn_norm="mlp_norm",
)
OLMO3_THETA = 500000.0
EXAONE_ALIASES = {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
                  "activation_function": "hidden_act"}
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0,
                   "original_max_position_embeddings": 16384, "beta_fast": 32.0,
                   "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "llama_4_scaling_beta": 0.1}
# Llama's convention: `attention_bias` switches the q/k/v and o biases on together.
ATTENTION_BIAS: dict[str, Any] = {"bias_key": "attention_bias", "o_bias": None}
INTERNLM2_NAMES = replace(
    LLAMA_NAMES, embed=("model.tok_embeddings.weight",), lm_head=("output",),
    qkv="attention.wqkv", o="attention.wo", gate="feed_forward.w1", up="feed_forward.w3",
    down="feed_forward.w2", input_norm="attention_norm", post_attn_norm="ffn_norm",
)
GRANITE = FamilySpec(
    **ATTENTION_BIAS, embed_scale="multiplier", unsupported=("mlp_bias",),
    defaults={"attention_multiplier": 1.0},
    quirks=("embedding, attention and residual multipliers", "logits scaling"),
)
NEOX_NAMES = TensorNames(
    embed=("gpt_neox.embed_in.weight",), final_norm="gpt_neox.final_layer_norm",
    lm_head=("embed_out", "lm_head"), layer="gpt_neox.layers.{i}.",
    qkv="attention.query_key_value", o="attention.dense",
    gate="", up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h",
)
OLMO2 = FamilySpec(
    **ATTENTION_BIAS, block="post", qk_norm="full", defaults={"rms_norm_eps": 1e-5},
    quirks=("norms after attention and MLP", "q/k RMSNorm over the whole projection"),
)
# Image-text Qwen (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the language model is stored under
# `model.language_model.` (transformers 5, Qwen3-VL on the Hub) or `model.` (Qwen2-VL and
# Qwen2.5-VL on the Hub, as transformers 5 still saves them), the vision tower and its
# merger under `model.visual.` or `visual.`.
QWEN_VL: dict[str, Any] = {
    "nested": "text_config", "renames": (("model.language_model.", "model."),),
    "left_out": ("visual.", "model.visual."),
}
MROPE_QUIRKS = ("M-RoPE (text positions: plain rotary)",
                "language model of an image-text checkpoint (vision tower left out)")
# GLM and GLM-4: fused gate_up, rotary on interleaved pairs of the first half of each head
# (partial_rotary_factor 0.5 unless the config says otherwise), q/k/v biases without an o
# bias, and the config classes' own defaults (head_dim 128, eps 1.5625e-7).
GLM_NAMES = replace(LLAMA_NAMES, gate_up="mlp.gate_up_proj")
GLM = FamilySpec(
    names=GLM_NAMES, bias_key="attention_bias", qkv_bias=True, rope_interleaved=True,
    partial_rotary=True,
    defaults={"head_dim": 128, "rms_norm_eps": 1.5625e-07, "max_position_embeddings": 131072,
              "partial_rotary_factor": 0.5},
    quirks=("fused gate_up weights", "interleaved rotary"),
)
# Mistral with Llama 4's query scale and a yarn rope by default; a window on every layer
# where the config has one (MistralModel's mask; a `layer_types` key only draws a warning).
MINISTRAL3 = FamilySpec(
    window="always", query_scale=True, legacy=_rope_unless_given(MINISTRAL3_ROPE),
    ignores=("layer_types",),
    defaults={"head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5},
    quirks=("query x (1 + beta log(1 + floor(position / original window))), Llama 4's",),
)
APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0}
# Apertus: Llama with per-head q/k RMSNorm and an ungated MLP, down(xielu(up(x))), whose
# xIELU has learned alphas in every layer (export/xielu.py); its norms named for the
# sublayer they precede.
APERTUS = FamilySpec(
    **ATTENTION_BIAS, names=replace(LLAMA_NAMES, gate="", input_norm="attention_layernorm",
                                    post_attn_norm="feedforward_layernorm"),
    qk_norm="head", gated_mlp=False, act_default="xielu", legacy=_rope_unless_given(APERTUS_ROPE),
    defaults={"max_position_embeddings": 65536, "rms_norm_eps": 1e-5},
    quirks=("per-head q/k RMSNorm", "xIELU MLP without a gate (learned alphas per layer)"),
)


def _pruned_head(raw: dict[str, Any]) -> str | None:
    # Apertus1p5TextConfig: an LM head of output_vocab_size rows (the multimodal tokens'
    # rows pruned); the bundle's logits are as wide as the vocabulary.
    rows = raw.get("output_vocab_size")
    if rows is not None and rows != raw.get("vocab_size"):
        return (f"output_vocab_size {rows} (an LM head pruned below vocab_size "
                f"{raw.get('vocab_size')}) is not supported")
    return None


CWM_ROPE = {"rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0,
            "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192}


def _iquestcoder_unsupported(raw: dict[str, Any]) -> str | None:
    # IQuestCoderConfig refuses these (the original code's options no release enables).
    for key in ("clip_qkv", "use_sliding_window"):
        if raw.get(key):
            return f"{key} is not supported (IQuestCoderConfig refuses it too)"
    return None


MINICPM_SCALES = ("scale_emb", "scale_depth", "dim_model_base")


def _minicpm_multipliers(raw: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM's muP scalings as Granite's multipliers: the embedding times `scale_emb`,
    each sublayer's output times `scale_depth / sqrt(num_hidden_layers)` before its
    residual add, the final hidden state (so the logits) divided by `hidden_size /
    dim_model_base`; attention at the usual 1 / sqrt(head_dim) (`kv_channels` where given,
    MiniCPM4's head width). Where a key is missing _minicpm_unsupported refuses."""
    if any(raw.get(key) is None for key in MINICPM_SCALES):
        return raw
    heads = raw.get("num_attention_heads") or 1
    head_dim = raw.get("head_dim") or raw.get("kv_channels") or raw["hidden_size"] // heads
    return {**raw, "head_dim": head_dim,
            "embedding_multiplier": float(raw["scale_emb"]),
            "residual_multiplier": float(raw["scale_depth"]) / math.sqrt(raw["num_hidden_layers"]),
            "logits_scaling": raw["hidden_size"] / float(raw["dim_model_base"]),
            "attention_multiplier": 1.0 / math.sqrt(head_dim)}


def _minicpm_unsupported(raw: dict[str, Any]) -> str | None:
    missing = [key for key in MINICPM_SCALES if raw.get(key) is None]
    if missing:  # the remote code's defaults (1) are no released model's
        return f"config.json lacks {', '.join(missing)} (MiniCPM's muP scalings)"
    if raw.get("use_mup") is False:
        return "use_mup false (MiniCPM without its muP scalings) is not supported"
    if raw.get("sparse_config"):
        return ("MiniCPM4's sparse attention (sparse_config: InfLLM v2 blocks past "
                "dense_len) is not supported")
    if raw.get("num_experts"):
        return "MiniCPM-MoE's experts are not supported"
    return None


def granite_swa_layers(raw: dict[str, Any]) -> dict[str, Any]:
    """GraniteSWAConfig (and GraniteMoeSWAConfig): without layer_types every fourth layer
    from the first attends globally and the others slide; `layer_rope_theta` gives each
    layer its rope's base over the rope's other parameters, 0 for no rotary. Read as one
    rope per layer type (layer_rope_thetas_unsupported refuses what is not) and
    no_rope_layers."""
    count = int(raw["num_hidden_layers"])
    types = list(raw.get("layer_types") or ["full_attention" if i % 4 == 0 else
                                            "sliding_attention" for i in range(count)])
    raw = {**raw, "layer_types": types}
    thetas = raw.get("layer_rope_theta")
    if thetas is None:
        return raw
    base = {"rope_type": "default", "rope_theta": raw.get("rope_theta", 10000.0),
            **rope_params(raw)}
    pairs = list(zip(thetas, types, strict=False))  # lengths: layer_rope_thetas_unsupported
    ropes = {kind: {**base, "rope_theta": next((float(t) for t, k in pairs if k == kind and t),
                                               base["rope_theta"])}
             for kind in ("full_attention", "sliding_attention")}
    rest = {k: v for k, v in raw.items() if k != "rope_scaling"}
    return {**rest, "rope_parameters": ropes, "no_rope_layers": [int(bool(t)) for t in thetas]}


def layer_rope_thetas_unsupported(raw: dict[str, Any]) -> str | None:
    thetas = raw.get("layer_rope_theta")
    if thetas is None:
        return None
    if len(thetas) != len(raw["layer_types"]):
        return f"layer_rope_theta lists {len(thetas)} layers; there are {len(raw['layer_types'])}"
    for kind in ("full_attention", "sliding_attention"):
        bases = {float(t) for t, k in zip(thetas, raw["layer_types"], strict=True)
                 if k == kind and t}
        if len(bases) > 1:
            return (f"layer_rope_theta gives the {kind} layers {len(bases)} rope bases; "
                    "export takes one per layer type")
    if raw.get("sliding_window") is None and len(set(thetas) - {0}) > 1:
        return "layer_rope_theta gives layers their own rope bases but sliding_window is null"
    return None


def _logits_times_scaling(raw: dict[str, Any]) -> dict[str, Any]:
    # HyperCLOVAXForCausalLM multiplies the logits by logits_scaling, where Granite divides.
    rest = {k: v for k, v in raw.items() if k != "logits_scaling"}
    return {**rest, "logit_scale": raw.get("logits_scaling", 1.0)}


def _compass_rope_unsupported(raw: dict[str, Any]) -> str | None:
    """Cohere Compass's model reads a rope dict for each of its layer types (null: NoPE);
    it fails on a config without one."""
    params = raw.get("rope_parameters")
    types = set(raw.get("layer_types") or ["full_attention"])
    if not isinstance(params, dict) or not types <= params.keys():
        return ("config.json needs rope_parameters per layer type ("
                f"{', '.join(sorted(types))}; null for no rotary), as its model reads them")
    return None


# Cohere 2's layers (LayerNorm without bias, attention and MLP on one norm, a logit scale
# where given) with Qwen's rotary of half-split pairs (not interleaved) and a rope per
# layer type, null for NoPE; every layer full unless layer_types says otherwise. On text
# its M-RoPE is plain rotary (a token's three positions are equal).
COHERE_COMPASS = FamilySpec(
    **ATTENTION_BIAS, norm="layer_no_bias", block="shared", tie_default=True,
    window="always", sliding=lambda i, raw: False, nope_types=True,
    required=("sliding_window",), refuse=_compass_rope_unsupported,
    legacy=lambda raw: {**raw, "logit_scale": given(raw.get("logit_scale"), 1.0)},
    defaults={"layer_norm_eps": 1e-5, "sliding_window": 4096, "max_position_embeddings": 8192},
    quirks=("LayerNorm without bias", "rope per layer type (null: no rotary)", "logit scale",
            MROPE_QUIRKS[0]),
)


def _neox_japanese_config(raw: dict[str, Any]) -> dict[str, Any]:
    """GPTNeoXJapaneseConfig: the MLP is `intermediate_multiple_size` times hidden wide, and
    the rope base may be GPT-NeoX's older `rotary_emb_base`."""
    width = int(int(raw["hidden_size"]) * float(raw["intermediate_multiple_size"]))
    return _neox_rotary_base({**raw, "intermediate_size": width})


# GPT-NeoX Japanese: GPT-NeoX's fused q/k/v interleaved per head and LayerNorms, as
# pre-norm layers (attention, then the MLP) without biases but for the one its last
# layer adds after the attention's output projection.
GPT_NEOX_JAPANESE = FamilySpec(
    names=replace(NEOX_NAMES, embed=("gpt_neox_japanese.embed_in.weight",),
                  final_norm="gpt_neox_japanese.final_layer_norm", lm_head=("embed_out",),
                  layer="gpt_neox_japanese.layers.{i}.", o_extra_bias="attention.dense_bias"),
    norm="layer", gated_mlp=False, qkv_interleaved=True, act_default="gelu",
    partial_rotary=True, tie_default=True, legacy=_neox_japanese_config,
    ignores=("num_key_value_heads", "intermediate_size"),  # its fused qkv is 3 x hidden
    defaults={"layer_norm_eps": 1e-5, "intermediate_multiple_size": 4,
              "max_position_embeddings": 2048},
    quirks=("LayerNorm with bias", "gelu MLP", "fused q/k/v interleaved per head",
            "an output bias on the last layer's attention"),
)


IMAGE_TEXT_QUIRK = "language model of an image-text checkpoint (vision tower left out)"
# transformers 5 loads EXAONE 3.0/3.5 as Llama, renaming the Hub's tensors.
EXAONE_NAMES = TensorNames(
    embed=("transformer.wte.weight",), final_norm="transformer.ln_f",
    layer="transformer.h.{i}.", q="attn.attention.q_proj", k="attn.attention.k_proj",
    v="attn.attention.v_proj", o="attn.attention.out_proj", gate="mlp.c_fc_0",
    up="mlp.c_fc_1", down="mlp.c_proj", input_norm="ln_1", post_attn_norm="ln_2",
)
# GPT-2's config keys -> the names the reader reads (which win where both are given).
GPT2_ALIASES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers",
                "n_head": "num_attention_heads", "n_positions": "max_position_embeddings"}
GPT2_NAMES = TensorNames(
    embed=("transformer.wte.weight",), position_embed="transformer.wpe.weight",
    final_norm="transformer.ln_f", layer="transformer.h.{i}.", qkv="attn.c_attn",
    o="attn.c_proj", gate="", up="mlp.c_fc", down="mlp.c_proj", input_norm="ln_1",
    post_attn_norm="ln_2",
)
# GPT-2 and GPTBigCode: LayerNorm with bias, biases on every projection, an ungated gelu
# MLP, learned absolute positions and no rotary. The Hub's GPT-2 checkpoints store the
# base model's tensors without the `transformer.` prefix (h.0.attn.c_attn.weight), later
# saves with it; transformers reads both.
GPT2 = FamilySpec(
    names=GPT2_NAMES, norm="layer", gated_mlp=False, qkv_bias=True, o_bias=True,
    mlp_bias=True, tie_default=True, act_default="gelu_new", act_key="activation_function",
    eps_key="layer_norm_epsilon", legacy=_gpt2_config, refuse=_gpt2_unsupported,
    inverse_layer_scale_key="scale_attn_by_inverse_layer_idx",
    renames=tuple((p, "transformer." + p) for p in ("h.", "wte.", "wpe.", "ln_f.")),
    # keys other families read that GPT2Config has no use for (its own names win)
    ignores=("intermediate_size", "num_key_value_heads", "head_dim", "no_rope_layers",
             "no_rope_layer_interval", "layer_types", "attention_multiplier",
             "query_pre_attn_scalar", "rope_parameters", "rope_scaling"),
    defaults={"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": None,
              "layer_norm_epsilon": 1e-5, "scale_attn_weights": True},
    transposed=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
    quirks=("learned absolute position embeddings", "LayerNorm with bias", "gelu MLP",
            "Conv1D weights stored [in, out]"),
)


def _openai_gpt_config(raw: dict[str, Any]) -> dict[str, Any]:
    """OpenAIGPTConfig: GPT-2's key names (its `n_inner`-less MLP 4 x n_embd wide, q.k
    scaled); its `afn` "gelu" is transformers' gelu_new (tanh), "swish" SiLU."""
    raw = _gpt2_config({**raw, "n_inner": None, "scale_attn_weights": True})
    afn = raw["afn"]
    return {**raw, "afn": {"gelu": "gelu_new", "swish": "silu"}.get(afn, afn)}


def _no_final_norm(raw: dict[str, Any]) -> bool:
    return False


# GPT-1 (openai-gpt): GPT-2's Conv1D projections and learned positions, wired as the
# original Transformer (OPT-350m's post-norm block: each residual sum normalized, no final
# norm), no KV cache in transformers (its logits are those of the whole prefix each step).
OPENAI_GPT = replace(
    GPT2, names=replace(GPT2_NAMES, embed=("transformer.tokens_embed.weight",),
                        position_embed="transformer.positions_embed.weight"),
    block="postln", final_norm_from_config=_no_final_norm, act_key="afn",
    legacy=_openai_gpt_config, refuse=None, inverse_layer_scale_key=None,
    renames=tuple((p, "transformer." + p) for p in ("h.", "tokens_embed.", "positions_embed.")),
    defaults={"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 512,
              "layer_norm_epsilon": 1e-5, "afn": "gelu"},
    quirks=("learned absolute position embeddings", "LayerNorm after each residual add",
            "no final norm", "gelu MLP", "Conv1D weights stored [in, out]"),
)


def _ctrl_config(raw: dict[str, Any]) -> dict[str, Any]:
    """CTRLConfig: GPT-2's key names (attribute_map), an MLP `dff` wide, no rotary (its
    positions are the sinusoidal table)."""
    raw = dict(raw)
    for key, alias in GPT2_ALIASES.items():
        raw[alias] = raw.get(alias, raw[key])
    raw["intermediate_size"] = raw["dff"]
    check_sizes(raw)  # n_layer as num_hidden_layers, before its layers are listed
    raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    return raw


def _ctrl_unsupported(raw: dict[str, Any]) -> str | None:
    # The layers' LayerNorms have a fixed epsilon of 1e-6; only the final one reads the key.
    if float(raw["layer_norm_epsilon"]) != 1e-6:
        return "layer_norm_epsilon other than its layers' fixed 1e-6 is not supported"
    return None


# CTRL: pre-norm layers (LayerNorm with bias) of biased q/k/v/o projections and a ReLU MLP,
# the embedding times sqrt(hidden) plus a fixed sinusoidal position table, a biased LM head.
CTRL = FamilySpec(
    names=TensorNames(
        embed=("transformer.w.weight",), final_norm="transformer.layernorm",
        layer="transformer.h.{i}.",
        q="multi_head_attention.Wq", k="multi_head_attention.Wk",
        v="multi_head_attention.Wv", o="multi_head_attention.dense", gate="", up="ffn.0",
        down="ffn.2", input_norm="layernorm1", post_attn_norm="layernorm2"),
    norm="layer", gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True,
    lm_head_bias=True, tie_default=True, act_default="relu", act_key=None,
    eps_key="layer_norm_epsilon", embed_scale="sqrt_hidden", sinusoidal_positions="ctrl",
    legacy=_ctrl_config, refuse=_ctrl_unsupported,
    ignores=GPT2.ignores,
    defaults={"n_embd": 1280, "n_layer": 48, "n_head": 16, "n_positions": 256, "dff": 8192,
              "layer_norm_epsilon": 1e-6},
    quirks=("fixed sinusoidal position embeddings", "embedding times sqrt(hidden)",
            "LayerNorm with bias", "ReLU MLP", "LM head with bias"),
)
PHI_NAMES = TensorNames(final_norm="model.final_layernorm", o="self_attn.dense",
                        gate="", up="mlp.fc1", down="mlp.fc2")

HUNYUAN_V1_DENSE = FamilySpec(
    **ATTENTION_BIAS, qk_norm="head_rotated", legacy=hunyuan_ntk_alpha,
    names=replace(LLAMA_NAMES, q_norm="self_attn.query_layernorm",
                  k_norm="self_attn.key_layernorm"),
    required=("head_dim",), defaults={"rms_norm_eps": 1e-5}, rope_types=("ntk_alpha",),
    quirks=("per-head q/k RMSNorm after rotary",),
)
FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(**ATTENTION_BIAS, unsupported=("mlp_bias",)),
    "mistral": FamilySpec(window="always", defaults={"max_position_embeddings": 131072,
                                                     "sliding_window": 4096}),
    "qwen2": FamilySpec(qkv_bias=True, window="opt_in", sliding=after_max_window_layers,
                        defaults={"max_position_embeddings": 32768, "sliding_window": 4096},
                        quirks=("q/k/v biases",)),
    "qwen3": FamilySpec(**ATTENTION_BIAS, qk_norm="head", window="opt_in",
                        sliding=after_max_window_layers,
                        defaults={"head_dim": 128, "max_position_embeddings": 32768,
                                  "sliding_window": 4096},
                        quirks=("per-head q/k RMSNorm",)),
    "phi3": FamilySpec(
        names=replace(LLAMA_NAMES, qkv="self_attn.qkv_proj", gate_up="mlp.gate_up_proj"),
        window="always", partial_rotary=True, legacy=_phi3_longrope,
        # Phi3Config always has a top-level original_max_position_embeddings (4096 unless
        # given), and it wins over the rope dict's (see rope_from_params).
        defaults={"rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
                  "original_max_position_embeddings": 4096},
        quirks=("fused qkv and gate_up weights",),
    ),
    "smollm3": FamilySpec(**ATTENTION_BIAS, tie_default=True, window="opt_in",
                          sliding=_nope_layers, unsupported=("mlp_bias",),
                          defaults={"rope_theta": 2_000_000.0, "max_position_embeddings": 32768}),
    "granite": GRANITE,
    # Granite SWA (granite-swash): Granite with sliding layers but every fourth, a sink logit
    # per head, and a rope base per layer (0: no rotary).
    "granite_swa": replace(
        GRANITE, sinks=True, window="always", tie_default=True, legacy=granite_swa_layers,
        refuse=layer_rope_thetas_unsupported,
        defaults={"attention_multiplier": 1.0, "sliding_window": 128, "rms_norm_eps": 1e-5,
                  "max_position_embeddings": 8192, "num_key_value_heads": 4},
        quirks=(*GRANITE.quirks, "attention sinks (a learned logit per head)"),
    ),
    # MiniCPM 1, 2 and 4 (OpenBMB's remote code, MiniCPMForCausalLM; no transformers class):
    # Llama with muP's scalings, which are Granite's multipliers under other names
    # (_minicpm_multipliers); the embedding tied to the head unless config.json says not.
    "minicpm": replace(
        GRANITE, tie_default=True, legacy=_minicpm_multipliers, refuse=_minicpm_unsupported,
        defaults={"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"},
        quirks=("muP scalings (scale_emb, scale_depth, dim_model_base) as Granite's "
                "multipliers", "remote-code family: no transformers class"),
    ),
    # HyperCLOVA X: Granite's multipliers, its logits times logits_scaling (not divided), and
    # with use_post_norm (the default) a norm after attention and MLP too, before the
    # residual multiplier; attention_multiplier null is 1 / sqrt(head_dim).
    "hyperclovax": FamilySpec(
        **ATTENTION_BIAS, embed_scale="multiplier", unsupported=("mlp_bias",),
        names=replace(LLAMA_NAMES, post_attn_norm="post_norm1",
                      pre_mlp_norm="post_attention_layernorm", post_mlp_norm="post_norm2"),
        block_from_config=lambda raw: "sandwich" if raw["use_post_norm"] else "pre",
        block_names={"pre": LLAMA_NAMES}, legacy=_logits_times_scaling,
        defaults={"use_post_norm": True},
        quirks=("embedding, attention and residual multipliers", "logits scaling"),
    ),
    # nanochat: RMSNorms without weight (the embedding normed too), per-head q/k norms after a
    # rotary turning the other way, an ungated ReLU-squared MLP, the final soft-cap.
    "nanochat": FamilySpec(
        **ATTENTION_BIAS, names=replace(LLAMA_NAMES, gate="", up="mlp.fc1", down="mlp.fc2"),
        norm="rms_no_weight", gated_mlp=False, qk_norm="head_rotated", embed_norm=True,
        rotary_reflected=True, act_default="relu2", softcaps=("final",),
        defaults={"final_logit_softcapping": 15.0, "rms_norm_eps": 1e-6},
        quirks=("RMSNorm without weight, of the embedding too",
                "per-head q/k norms after rotary", "ReLU-squared MLP without a gate",
                "final-logit soft-capping"),
    ),
    # IQuest-Coder: Llama under its own config class (head_dim 128 unless given).
    "iquestcoder": FamilySpec(
        **ATTENTION_BIAS, unsupported=("mlp_bias",), refuse=_iquestcoder_unsupported,
        defaults={"head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                  "num_key_value_heads": 8}),
    # CWM: Llama whose layers slide but every fourth (layer_types), a llama3 rope by default.
    "cwm": FamilySpec(
        window="always", sliding=lambda i, raw: i % 4 != 0, unsupported=("mlp_bias",),
        legacy=_rope_unless_given(CWM_ROPE),
        defaults={"head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                  "num_key_value_heads": 8, "sliding_window": 8192}),
    # Jais 2: LayerNorm with bias, an ungated ReLU-squared MLP, biases on every projection
    # (attention_bias and mlp_bias, both true by default).
    "jais2": FamilySpec(
        names=replace(LLAMA_NAMES, gate=""), norm="layer", gated_mlp=False,
        bias_key="attention_bias", qkv_bias=True, o_bias=None, mlp_bias_key="mlp_bias",
        act_default="relu2", eps_key="layer_norm_eps",
        defaults={"layer_norm_eps": 1e-5, "max_position_embeddings": 8192,
                  "attention_bias": True, "mlp_bias": True},
        quirks=("LayerNorm with bias", "ReLU-squared MLP without a gate"),
    ),
    # OLMo 1: LayerNorm without weight or bias (eps 1e-5 whatever the config says), q/k/v
    # clamped where clip_qkv is set.
    "olmo": FamilySpec(
        **ATTENTION_BIAS, norm="layer_no_affine", clip_qkv=True, eps_key="layer_norm_eps",
        legacy=lambda raw: {**raw, "layer_norm_eps": 1e-5},  # OlmoLayerNorm's, fixed
        quirks=("LayerNorm without weight or bias",),
    ),
    "olmo2": OLMO2,
    # OLMo 2 with sliding windows on three of every four layers, each layer type its rope.
    "olmo3": replace(OLMO2, window="always", sliding=lambda i, raw: (i + 1) % 4 != 0,
                     legacy=_olmo3_ropes,
                     defaults={"rms_norm_eps": 1e-5, "sliding_window": 4096}),
    # Llama with rotary on interleaved pairs; `use_bias` would bias every projection.
    "ernie4_5": FamilySpec(
        rope_interleaved=True, tie_default=True, unsupported=("use_bias",),
        defaults={"head_dim": 128, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                  "max_position_embeddings": 131072},
        quirks=("interleaved rotary",),
    ),
    # Norms after the sublayers (as OLMo 2) and per-head q/k norms (as Qwen3); with a
    # window, 3 local layers per global one, and the global layers have no rotary.
    "exaone4": FamilySpec(
        block="post", qk_norm="head", window="always", sliding=every_nth_global,
        global_nope=True,
        defaults={"rms_norm_eps": 1e-5, "sliding_window": 4096, "sliding_window_pattern": 4},
        quirks=("norms after attention and MLP", "per-head q/k RMSNorm"),
    ),
    # Llama with a plain (ungated) MLP: down(relu(up(x))^2).
    "arcee": FamilySpec(
        **ATTENTION_BIAS, names=replace(LLAMA_NAMES, gate=""), gated_mlp=False,
        act_default="relu2", unsupported=("mlp_bias",),
        defaults={"rms_norm_eps": 1e-5, "max_position_embeddings": 4096},
        quirks=("ReLU-squared MLP without a gate",),
    ),
    # BitNet b1.58: Llama with a gated ReLU-squared MLP and sub-norms before o_proj and
    # down_proj; with a BitNet quantization_config its projections are BitLinear layers
    # (ternary weights, int8 fake-quantized activations: export/bitlinear.py).
    "bitnet": FamilySpec(
        **ATTENTION_BIAS, names=replace(LLAMA_NAMES, attn_sub_norm="self_attn.attn_sub_norm",
                                        mlp_sub_norm="mlp.ffn_sub_norm"),
        act_default="relu2", bitnet=True,
        defaults={"rope_theta": 500000.0, "rms_norm_eps": 1e-5, "num_key_value_heads": 5},
        quirks=("RMSNorm of the attention output and of the MLP's gated product",
                "ReLU-squared gated MLP"),
    ),
    # Llama with per-head q/k RMSNorm of the rotated q and k, and a fixed-alpha NTK rope.
    # Its attention reads head_dim, null in the config class, with no fallback.
    "apertus": APERTUS,
    # Apertus 1.5's language model: Apertus with a larger vocabulary, its LM head maybe
    # pruned to the text tokens (output_vocab_size, refused).
    "apertus1p5_text": replace(APERTUS, refuse=_pruned_head,
                               defaults={**APERTUS.defaults, "vocab_size": 266752}),
    "hunyuan_v1_dense": HUNYUAN_V1_DENSE,
    "glm": GLM,
    # GLM with norms after attention and MLP too (GLM-4-0414): input_layernorm,
    # post_self_attn_layernorm, post_attention_layernorm (before the MLP), post_mlp_layernorm.
    "glm4": replace(
        GLM, block="sandwich",
        names=replace(GLM_NAMES, post_attn_norm="post_self_attn_layernorm",
                      pre_mlp_norm="post_attention_layernorm",
                      post_mlp_norm="post_mlp_layernorm"),
        quirks=(*GLM.quirks, "norms before and after attention and MLP"),
    ),
    # Llama with interleaved rotary and no o bias; its o_proj is hidden x hidden.
    "helium": FamilySpec(
        bias_key="attention_bias", rope_interleaved=True, unsupported=("mlp_bias",),
        defaults={"head_dim": 128, "rms_norm_eps": 1e-8, "rope_theta": 100000.0,
                  "max_position_embeddings": 4096, "num_key_value_heads": 20},
        quirks=("interleaved rotary",),
    ),
    # Mistral whose layers slide or not as `layer_types` says (all slide without it). Its
    # attention reads head_dim, null in the config class, with no fallback.
    "ministral": FamilySpec(window="always", required=("head_dim",),
                            defaults={"max_position_embeddings": 131072,
                                      "sliding_window": 4096}),
    "ministral3": MINISTRAL3,
    # Llama under the Hub's own tensor and config key names (EXAONE 3.0 and 3.5).
    "exaone": FamilySpec(
        **ATTENTION_BIAS, names=EXAONE_NAMES, legacy=_exaone_aliases, unsupported=("mlp_bias",),
        defaults={"rope_theta": 500_000.0, "max_position_embeddings": 4096,
                  "num_key_value_heads": 8, "rms_norm_eps": 1e-5},
    ),
    # Llama with q/k/v biases on by default and the o bias on its own key.
    "seed_oss": FamilySpec(
        bias_key="attention_bias", qkv_bias=True, o_bias_key="attention_out_bias",
        unsupported=("mlp_bias",),
        defaults={"head_dim": 128, "max_position_embeddings": 524288},
    ),
    # LayerNorm with bias, biases on every projection (`use_bias`), an ungated gelu MLP,
    # and a window on every layer where the config has one.
    "starcoder2": FamilySpec(
        names=replace(LLAMA_NAMES, gate="", up="mlp.c_fc", down="mlp.c_proj"),
        norm="layer", gated_mlp=False, bias_key="use_bias", qkv_bias=True, o_bias=None,
        mlp_bias=None, tie_default=True, act_default="gelu_pytorch_tanh",
        eps_key="norm_epsilon", window="always",
        defaults={"norm_epsilon": 1e-5, "max_position_embeddings": 4096},
        quirks=("LayerNorm with bias", "gelu MLP"),
    ),
    "phi": FamilySpec(
        names=PHI_NAMES, norm="layer", block="shared", gated_mlp=False, qkv_bias=True,
        o_bias=True, mlp_bias=True, lm_head_bias=True, act_default="gelu_new", partial_rotary=True,
        unsupported=("qk_layernorm",),
        defaults={"layer_norm_eps": 1e-5, "partial_rotary_factor": 0.5},
        quirks=("LayerNorm with bias", "gelu MLP",
                "LM head bias"),
    ),
    "stablelm": FamilySpec(
        norm="layer", bias_key="use_qkv_bias", block_from_config=_parallel_if_configured,
        partial_rotary=True, unsupported=("qk_layernorm",),
        defaults={"layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25,
                  "max_position_embeddings": 4096},
        quirks=("LayerNorm with bias",),
    ),
    "cohere": FamilySpec(
        **ATTENTION_BIAS, norm="layer_no_bias", block="shared", tie_default=True,
        rope_interleaved=True, unsupported=("use_qk_norm",),
        defaults={"layer_norm_eps": 1e-5, "logit_scale": 0.0625, "rope_theta": 500000.0,
                  "max_position_embeddings": 8192},
        quirks=("LayerNorm without bias",
                "interleaved rotary", "logit scale"),
    ),
    # LayerNorm1P (1+w, with bias) everywhere, an ungated ReLU-squared MLP, rotary on half
    # of each head unless partial_rotary_factor says otherwise.
    "nemotron": FamilySpec(
        **ATTENTION_BIAS, names=replace(LLAMA_NAMES, gate=""), norm="layer_plus_one",
        gated_mlp=False, act_default="relu2", eps_key="norm_eps", partial_rotary=True,
        unsupported=("mlp_bias",),
        defaults={"norm_eps": 1e-5, "partial_rotary_factor": 0.5,
                  "max_position_embeddings": 4096},
        quirks=("LayerNorm with bias scaling by (1+w)", "ReLU-squared MLP without a gate"),
    ),
    # Cohere with sliding layers (3 of 4 unless layer_types says otherwise); only they
    # rotate, the global layers go without rope. Its model fails without a window (the
    # sliding mask is built whatever the layers).
    "cohere2": FamilySpec(
        **ATTENTION_BIAS, norm="layer_no_bias", block="shared", tie_default=True,
        rope_interleaved=True, window="always", sliding=every_nth_global, global_nope=True,
        required=("sliding_window",),
        defaults={"layer_norm_eps": 1e-5, "logit_scale": 0.0625, "sliding_window": 4096,
                  "sliding_window_pattern": 4, "max_position_embeddings": 8192},
        quirks=("LayerNorm without bias", "interleaved rotary", "logit scale"),
    ),
    "cohere_compass_text": COHERE_COMPASS,
    "gpt_neox": FamilySpec(
        names=NEOX_NAMES, norm="layer", block="parallel", gated_mlp=False,
        qkv_interleaved=True, bias_key="attention_bias", qkv_bias=True, o_bias=None,
        mlp_bias=True, act_default="gelu", partial_rotary=True, legacy=_neox_rotary_base,
        ignores=("num_key_value_heads",),  # its fused qkv is always 3 x hidden
        defaults={"layer_norm_eps": 1e-5, "rotary_pct": 0.25},
        block_from_config=lambda raw: "parallel" if raw.get("use_parallel_residual", True)
        else "pre",
        quirks=("LayerNorm with bias", "gelu MLP",
                "fused q/k/v interleaved per head"),
    ),
    "gpt2": GPT2,
    "gpt-sw3": GPT2,  # AI Sweden's GPT-SW3: GPT2Config and GPT2LMHeadModel, as transformers maps it
    "openai-gpt": OPENAI_GPT,
    "ctrl": CTRL,
    "gpt_neox_japanese": GPT_NEOX_JAPANESE,
    # GPT-2 with nn.Linear weights, a tanh gelu by default and multi-query attention (one
    # KV head: c_attn is [q (n_embd), k (head_dim), v (head_dim)]).
    "gpt_bigcode": replace(
        GPT2, act_default="gelu_pytorch_tanh", transposed=(), inverse_layer_scale_key=None,
        defaults={**GPT2.defaults, "multi_query": True},
        quirks=("learned absolute position embeddings", "LayerNorm with bias", "gelu MLP",
                "multi-query attention"),
    ),
    # ModernBERT decoder (Ettin): the embedding LayerNormed, layer 0's attention on it
    # without a norm of its own, LayerNorms without bias, Wi's first half activated times its
    # second, global and sliding layers with a rope each, and a prediction head (dense,
    # activation, norm) before the biased, tied LM head.
    "modernbert-decoder": FamilySpec(
        **ATTENTION_BIAS, names=MODERNBERT_NAMES, norm="layer_no_bias",
        first_layer_unnormed=True, act_default="gelu", act_key="hidden_activation",
        head_act_key="classifier_activation", lm_head_bias=True, tie_default=True,
        eps_key="norm_eps", window="always", legacy=_modernbert_decoder_config,
        refuse=_modernbert_decoder_unsupported,
        ignores=("rope_theta", "num_key_value_heads", "head_dim", "partial_rotary_factor"),
        defaults={"hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
                  "num_attention_heads": 12, "max_position_embeddings": 8192,
                  "norm_eps": 1e-5, "norm_bias": False, "mlp_bias": False,
                  "classifier_bias": False, "decoder_bias": True,
                  "classifier_activation": "gelu", "local_attention": 128},
        quirks=("the embedding LayerNormed", "LayerNorm without bias",
                "a prediction head before the LM head", "LM head bias"),
    ),
    # InternLM3: Llama under its own config class, whose qkv_bias and bias are aliases of
    # attention_bias and mlp_bias (and win), head_dim 128 and 2 KV heads by default.
    # InternLM2 / 2.5 (InternLM's remote code, InternLM2ForCausalLM; transformers has no
    # class for it): Llama under other names, q/k/v fused in one projection whose rows go
    # by KV head, each head's queries then its key then its value (the "groups" layout,
    # as Falcon's new decoder), biases on it and on wo where `bias` (its config's default).
    "internlm2": FamilySpec(
        names=INTERNLM2_NAMES, bias_key="bias", qkv_bias=True, o_bias=None,
        qkv_layout_from_config=lambda raw: "groups",
        defaults={"bias": True, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                  "hidden_act": "silu", "max_position_embeddings": 2048},
        quirks=("q/k/v fused, rows by KV head (wqkv)",
                "remote-code family: no transformers class"),
    ),
    "internlm3": FamilySpec(
        **ATTENTION_BIAS, legacy=_internlm3_aliases, refuse=_internlm3_unsupported,
        defaults={"hidden_size": 4096, "intermediate_size": 10240, "num_hidden_layers": 48,
                  "num_attention_heads": 32, "vocab_size": 128512, "head_dim": 128,
                  "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
                  "max_position_embeddings": 32768, "attention_bias": False,
                  "mlp_bias": False},
    ),
}
