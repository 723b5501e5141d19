"""The older causal LMs that people still bring: OPT, GPT-J, CodeGen, GPT-Neo, Falcon,
Persimmon, XGLM and BioGPT. LayerNorm with bias, ungated MLPs, their own config key names,
and positions that are a learned table (OPT and BioGPT with an offset of 2, GPT-Neo), a
fixed sinusoidal one (XGLM), GPT-J's rotary on interleaved pairs of the first `rotary_dim`
dims of each head, or plain rotary.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.config_checks import check_sizes
from edgeprefill.export.families.dense import GPT2_ALIASES
from edgeprefill.export.families.spec import FamilySpec, TensorNames

# Keys other families read that these config classes have no use for: their own keys
# decide (dropped before reading).
FOREIGN_KEYS = ("num_key_value_heads", "head_dim", "no_rope_layers", "no_rope_layer_interval",
                "layer_types", "attention_multiplier", "query_pre_attn_scalar",
                "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
                "rotary_pct", "sliding_window", "original_max_position_embeddings")


def _aliased(raw: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """The config class's own key names read as the reader's; the reader's name wins where
    both are given (attribute_map)."""
    raw = dict(raw)
    for key, alias in aliases.items():
        raw[alias] = raw.get(alias, raw[key])
    check_sizes(raw)  # XGLM's num_layers as num_hidden_layers, before its layers are listed
    return raw


def _opt_config(raw: dict[str, Any]) -> dict[str, Any]:
    """OPTConfig: an MLP ffn_dim wide, LayerNorms of torch's default eps (the class has no
    key for it), learned positions only."""
    raw = {**raw, "intermediate_size": raw["ffn_dim"], "layer_norm_eps": 1e-5}
    raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    return raw


def _opt_unsupported(raw: dict[str, Any]) -> str | None:
    if not raw["layer_norm_elementwise_affine"]:
        return "layer_norm_elementwise_affine=false (LayerNorms without weights) is not supported"
    return None


def _opt_block(raw: dict[str, Any]) -> str:
    return "pre" if raw["do_layer_norm_before"] else "postln"


def _opt_final_norm(raw: dict[str, Any]) -> bool:
    # OPTDecoder: no final norm after post-norm layers, nor where an old fine-tune dropped it
    return bool(raw["do_layer_norm_before"]) and not raw["_remove_final_layer_norm"]


def _rotary_config(raw: dict[str, Any]) -> dict[str, Any]:
    """GPTJConfig and CodeGenConfig: GPT-2's key names, an MLP n_inner wide (4 x n_embd
    when null), rotary on the first rotary_dim dims of each head on the base 10000 (their
    create_sinusoidal_positions)."""
    raw = _aliased(raw, GPT2_ALIASES)
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    raw["intermediate_size"] = raw["n_inner"] if raw["n_inner"] is not None else 4 * hidden
    raw["rope_theta"] = 10000.0
    if raw["rotary_dim"] is not None:
        raw["partial_rotary_factor"] = int(raw["rotary_dim"]) / (hidden // max(heads, 1))
    return raw


def _rotary_unsupported(raw: dict[str, Any]) -> str | None:
    if raw["rotary_dim"] is None:
        return "rotary_dim null (a rotary table as wide as hidden_size) is not supported"
    head_dim = int(raw["hidden_size"]) // max(int(raw["num_attention_heads"]), 1)
    if int(raw["rotary_dim"]) > head_dim:  # the model fails on it too
        return f"rotary_dim {raw['rotary_dim']} exceeds the head size {head_dim}"
    return None


def _codegen_unsupported(raw: dict[str, Any]) -> str | None:
    if int(raw["hidden_size"]) % CODEGEN_SHARDS:
        return (f"n_embd {raw['hidden_size']} is not a multiple of the {CODEGEN_SHARDS} shards "
                "of its fused q/k/v projection")
    return _rotary_unsupported(raw)


def _gpt_neo_config(raw: dict[str, Any]) -> dict[str, Any]:
    """GPTNeoConfig: num_heads and num_layers (aliased), an MLP intermediate_size wide
    (4 x hidden when null), learned positions only, q.k not scaled at all, and layers
    global or local (a window of window_size) as attention_types lists them."""
    raw = _aliased(raw, {"num_heads": "num_attention_heads", "num_layers": "num_hidden_layers"})
    hidden = int(raw["hidden_size"])
    if raw["intermediate_size"] is None:
        raw["intermediate_size"] = 4 * hidden
    kinds = [kind for group, repeat in raw["attention_types"] for _ in range(int(repeat))
             for kind in group]
    unknown = set(kinds) - set(NEO_LAYER_TYPES)
    if unknown:
        raise ValueError(f"attention_types holds {sorted(unknown)}; GPT-Neo's layers are "
                         "global or local")
    if len(kinds) != int(raw["num_hidden_layers"]):
        raise ValueError(f"attention_types lists {len(kinds)} layers; num_layers is "
                         f"{raw['num_hidden_layers']}")
    raw["layer_types"] = [NEO_LAYER_TYPES[kind] for kind in kinds]
    raw["sliding_window"] = raw["window_size"]
    raw["no_rope_layers"] = [0] * len(kinds)
    raw["attention_multiplier"] = 1.0  # GPTNeoSelfAttention._attn: q.k as it is
    return raw


def _falcon_config(raw: dict[str, Any]) -> dict[str, Any]:
    """FalconConfig: n_embed (an older name that wins), an MLP ffn_hidden_size wide (4 x
    hidden when null), and KV heads as its attention takes them: num_kv_heads (all heads
    when null) in the new decoder architecture, one with multi_query, else every head."""
    raw = dict(raw)
    if raw.get("n_embed") is not None:
        raw["hidden_size"] = raw["n_embed"]
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    ffn = raw["ffn_hidden_size"]
    raw["intermediate_size"] = ffn if ffn is not None else 4 * hidden
    kv = raw["num_kv_heads"] if raw["num_kv_heads"] is not None else heads
    raw["num_key_value_heads"] = kv if raw["new_decoder_architecture"] else \
        1 if raw["multi_query"] else heads
    if raw["new_decoder_architecture"] and raw["num_ln_in_parallel_attn"] is None:
        raw["num_ln_in_parallel_attn"] = 2  # FalconDecoderLayer's default there
    if raw["alibi"]:  # Falcon-RW: ALiBi in place of rotary on every layer
        raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    return raw


def _falcon_unsupported(raw: dict[str, Any]) -> str | None:
    if raw["new_decoder_architecture"] and not raw["parallel_attn"]:
        return ("new_decoder_architecture with parallel_attn=false (its model fails) is not "
                "supported")
    if not raw["new_decoder_architecture"] and not raw["multi_query"] and \
            raw["num_kv_heads"] not in (None, raw["num_attention_heads"]):
        return "num_kv_heads other than num_attention_heads without multi_query (its model " \
               "fails) is not supported"
    return None


def _falcon_block(raw: dict[str, Any]) -> str:
    if raw["new_decoder_architecture"]:
        # ln_attn and ln_mlp, or one input_layernorm for both
        return "parallel" if raw["num_ln_in_parallel_attn"] == 2 else "shared"
    return "shared" if raw["parallel_attn"] else "pre"


def _falcon_qkv_layout(raw: dict[str, Any]) -> str | None:
    if raw["new_decoder_architecture"]:
        return "groups"
    return None if raw["multi_query"] else "heads"  # multi-query: [q heads, k, v]


def _fairseq_config(raw: dict[str, Any]) -> dict[str, Any]:
    """XGLMConfig and BioGptConfig: the layers' nn.LayerNorm at torch's default eps (a
    layer_norm_eps key notwithstanding), positions only from their table; XGLM's own key
    names (the reader's names win where both are given) and an MLP ffn_dim wide."""
    if raw.get("model_type") == "xglm":
        raw = _aliased(raw, XGLM_ALIASES)
        raw["intermediate_size"] = raw["ffn_dim"]
    raw = {**raw, "layer_norm_eps": 1e-5}
    raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    return raw


NEO_LAYER_TYPES = {"global": "full_attention", "local": "sliding_attention"}
CODEGEN_SHARDS = 4  # CodeGenAttention.mp_num
OPT_NAMES = TensorNames(
    embed=("model.decoder.embed_tokens.weight",),
    position_embed="model.decoder.embed_positions.weight",
    final_norm="model.decoder.final_layer_norm", layer="model.decoder.layers.{i}.",
    o="self_attn.out_proj", gate="", up="fc1", down="fc2",
    input_norm="self_attn_layer_norm", post_attn_norm="final_layer_norm",
)
GPTJ_NAMES = TensorNames(
    embed=("transformer.wte.weight",), final_norm="transformer.ln_f",
    layer="transformer.h.{i}.", q="attn.q_proj", k="attn.k_proj", v="attn.v_proj",
    o="attn.out_proj", gate="", up="mlp.fc_in", down="mlp.fc_out", input_norm="ln_1",
)
GPT_NEO_NAMES = TensorNames(
    embed=("transformer.wte.weight",), position_embed="transformer.wpe.weight",
    final_norm="transformer.ln_f", layer="transformer.h.{i}.",
    q="attn.attention.q_proj", k="attn.attention.k_proj", v="attn.attention.v_proj",
    o="attn.attention.out_proj", gate="", up="mlp.c_fc", down="mlp.c_proj",
    input_norm="ln_1", post_attn_norm="ln_2",
)
FALCON_NAMES = TensorNames(
    embed=("transformer.word_embeddings.weight",), final_norm="transformer.ln_f",
    layer="transformer.h.{i}.", qkv="self_attention.query_key_value",
    o="self_attention.dense", gate="", up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h",
)
PERSIMMON_NAMES = TensorNames(
    final_norm="model.final_layernorm", qkv="self_attn.query_key_value", o="self_attn.dense",
    q_norm="self_attn.q_layernorm", k_norm="self_attn.k_layernorm", gate="",
    up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h",
)
XGLM_ALIASES = {"d_model": "hidden_size", "num_layers": "num_hidden_layers",
                "attention_heads": "num_attention_heads"}
# The fairseq decoders (OPT's layout under `model.`, BioGPT's under `biogpt.`)
XGLM_NAMES = replace(OPT_NAMES, embed=("model.embed_tokens.weight",), position_embed=None,
                     final_norm="model.layer_norm", layer="model.layers.{i}.")
BIOGPT_NAMES = replace(OPT_NAMES, embed=("biogpt.embed_tokens.weight",),
                       position_embed="biogpt.embed_positions.weight",
                       final_norm="biogpt.layer_norm", layer="biogpt.layers.{i}.",
                       lm_head=("output_projection",))
# XGLM and BioGPT: pre-norm layers with biases everywhere, the token embedding times
# sqrt(hidden) (scale_embedding), positions from row 2 of their table; tied.
FAIRSEQ: dict[str, Any] = {
    "norm": "layer", "gated_mlp": False, "qkv_bias": True, "o_bias": True, "mlp_bias": True,
    "tie_default": True, "act_default": "gelu", "eps_key": "layer_norm_eps",
    "embed_scale": "sqrt_hidden", "embed_scale_key": "scale_embedding", "position_offset": 2,
    "legacy": _fairseq_config,
}
GPTJ_DEFAULTS = {"n_embd": 4096, "n_layer": 28, "n_head": 16, "n_positions": 2048,
                 "n_inner": None, "rotary_dim": 64, "layer_norm_epsilon": 1e-5}
# GPT-J's layer: attention and MLP side by side on one LayerNorm, rotary on interleaved
# pairs of each head's first rotary_dim dims, no q/k/v/o biases, an LM head with a bias.
GPTJ = FamilySpec(
    names=GPTJ_NAMES, norm="layer", block="shared", gated_mlp=False, mlp_bias=True,
    lm_head_bias=True, rope_interleaved=True, partial_rotary=True, act_default="gelu_new",
    act_key="activation_function", eps_key="layer_norm_epsilon", legacy=_rotary_config,
    refuse=_rotary_unsupported, ignores=("intermediate_size", *FOREIGN_KEYS),
    defaults=GPTJ_DEFAULTS,
    quirks=("LayerNorm with bias", "gelu MLP", "interleaved rotary", "LM head bias"),
)

FAMILIES: dict[str, FamilySpec] = {
    # OPT: learned positions from row 2 of their table, ReLU MLP, biases everywhere
    # (enable_bias); OPT-350m's layers norm after the residual add, with no final norm, and
    # its embedding is word_embed_proj_dim wide, projected in and out.
    "opt": FamilySpec(
        names=OPT_NAMES, norm="layer", gated_mlp=False, bias_key="enable_bias", qkv_bias=True,
        o_bias=None, mlp_bias=None, tie_default=True, act_default="relu",
        act_key="activation_function", eps_key="layer_norm_eps", position_offset=2,
        legacy=_opt_config, refuse=_opt_unsupported, block_from_config=_opt_block,
        final_norm_from_config=_opt_final_norm, embed_width_key="word_embed_proj_dim",
        renames=(("decoder.", "model.decoder."),),
        ignores=("intermediate_size", "layer_norm_eps", *FOREIGN_KEYS),
        defaults={"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "ffn_dim": 3072, "max_position_embeddings": 2048, "enable_bias": True,
                  "do_layer_norm_before": True, "_remove_final_layer_norm": False,
                  "layer_norm_elementwise_affine": True},
        quirks=("learned absolute position embeddings (offset 2)", "LayerNorm with bias",
                "ReLU MLP"),
    ),
    "gptj": GPTJ,
    # GPT-J's layer with one fused q/k/v projection in CodeGen's model-parallel layout.
    "codegen": replace(
        GPTJ, names=replace(GPTJ_NAMES, qkv="attn.qkv_proj"), qkv_shards=CODEGEN_SHARDS,
        refuse=_codegen_unsupported,
        quirks=(*GPTJ.quirks, "fused q/k/v in 4 model-parallel shards"),
    ),
    # Falcon-7B/40B/180B: rotary, a fused q/k/v in one of three layouts, attention and MLP
    # side by side (on one norm, or ln_attn and ln_mlp in the new decoder architecture).
    # Falcon-RW (alibi: true): ALiBi in place of rotary, its bias rounded to bfloat16.
    "falcon": FamilySpec(
        names=FALCON_NAMES, norm="layer", gated_mlp=False, bias_key="bias", o_bias=None,
        mlp_bias=None, tie_default=True, act_default="gelu", act_key="activation",
        eps_key="layer_norm_epsilon", legacy=_falcon_config, refuse=_falcon_unsupported,
        alibi_key="alibi", block_from_config=_falcon_block,
        qkv_layout_from_config=_falcon_qkv_layout,
        block_names={"parallel": replace(FALCON_NAMES, input_norm="ln_attn",
                                          post_attn_norm="ln_mlp")},
        ignores=("intermediate_size", "num_key_value_heads", "head_dim"),
        defaults={"hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
                  "num_kv_heads": None, "num_ln_in_parallel_attn": None,
                  "layer_norm_epsilon": 1e-5, "alibi": False,
                  "new_decoder_architecture": False, "multi_query": True,
                  "parallel_attn": True, "bias": False, "ffn_hidden_size": None,
                  "max_position_embeddings": 2048},
        quirks=("LayerNorm with bias", "gelu MLP", "fused q/k/v"),
    ),
    # Persimmon-8B (and Fuyu's language model): a per-head fused q/k/v as GPT-NeoX's, each
    # head's q and k LayerNormed (qk_layernorm), rotary on half of each head by default, an
    # ungated ReLU-squared MLP, biases everywhere.
    "persimmon": FamilySpec(
        names=PERSIMMON_NAMES, norm="layer", gated_mlp=False, qkv_bias=True, o_bias=True,
        mlp_bias=True, qkv_interleaved=True, qk_norm="head", qk_norm_key="qk_layernorm",
        act_default="relu2", eps_key="layer_norm_eps", partial_rotary=True,
        ignores=("num_key_value_heads", "head_dim"),  # its fused q/k/v is 3 x hidden
        defaults={"hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 36,
                  "num_attention_heads": 64, "max_position_embeddings": 16384,
                  "layer_norm_eps": 1e-5, "qk_layernorm": True, "partial_rotary_factor": 0.5},
        quirks=("LayerNorm with bias", "per-head LayerNorm on q/k",
                "ReLU-squared MLP without a gate", "fused q/k/v interleaved per head"),
    ),
    # XGLM: fixed sinusoidal positions (the row of pad_token_id zeroed), computed at export
    "xglm": FamilySpec(
        **FAIRSEQ, names=XGLM_NAMES, sinusoidal_positions="xglm", act_key="activation_function",
        ignores=("intermediate_size", "layer_norm_eps", *FOREIGN_KEYS),
        defaults={"d_model": 1024, "num_layers": 24, "attention_heads": 16, "ffn_dim": 4096,
                  "max_position_embeddings": 2048, "scale_embedding": True,
                  "pad_token_id": 1},
        quirks=("sinusoidal absolute positions (offset 2)", "embedding times sqrt(hidden)",
                "LayerNorm with bias", "gelu MLP"),
    ),
    # BioGPT: learned positions
    "biogpt": FamilySpec(
        **FAIRSEQ, names=BIOGPT_NAMES, ignores=("layer_norm_eps", *FOREIGN_KEYS),
        defaults={"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                  "intermediate_size": 4096, "max_position_embeddings": 1024,
                  "scale_embedding": True},
        quirks=("learned absolute position embeddings (offset 2)",
                "embedding times sqrt(hidden)", "LayerNorm with bias", "gelu MLP"),
    ),
    # GPT-Neo: GPT-2's layer with nn.Linear projections (an o bias only), learned
    # positions, q.k unscaled, and local layers attending to the last window_size tokens.
    "gpt_neo": FamilySpec(
        names=GPT_NEO_NAMES, norm="layer", gated_mlp=False, o_bias=True, mlp_bias=True,
        tie_default=True, act_default="gelu_new", act_key="activation_function",
        eps_key="layer_norm_epsilon", window="always", legacy=_gpt_neo_config,
        ignores=FOREIGN_KEYS,
        defaults={"hidden_size": 2048, "num_layers": 24, "num_heads": 16,
                  "intermediate_size": None, "window_size": 256,
                  "max_position_embeddings": 2048, "layer_norm_epsilon": 1e-5,
                  "attention_types": [[["global", "local"], 12]]},
        quirks=("learned absolute position embeddings", "LayerNorm with bias", "gelu MLP",
                "q.k not scaled by 1/sqrt(head_dim)"),
    ),
}
