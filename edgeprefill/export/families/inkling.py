"""Inkling's language model (`inkling_text`), read as transformers 5.24's
InklingForCausalLM computes it (export/inkling.py emits its layers): a normed embedding,
attention without rotary whose q and k are RMS-normed per head (scale 1 / head_dim), its
keys and values each through a residual short convolution, a learned relative bias per
backward distance from each query's state added to the scores, sliding layers of their own
head shapes (their bias as wide as the window), residual short convolutions of each
sublayer's output, dense MLPs times a learned scalar or experts chosen by sigmoid + bias and
weighed in one softmax of log-sigmoids with the shared experts', and the last hidden state
divided by the muP width multiplier before the LM head. Its image-text checkpoints
(`inkling_mm_model`) hold the same language model under their stored names and layouts,
read as transformers' conversion mapping reads them (INKLING_MM)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.export.experts import MoeNames, MoeSpec
from edgeprefill.export.families.dense import IMAGE_TEXT_QUIRK
from edgeprefill.export.families.spec import FamilySpec, TensorNames

SLIDING, FULL = "hybrid_sliding", "hybrid"  # InklingTextConfig's layer_types


def layer_kinds(raw: dict[str, Any]) -> list[str]:
    """InklingTextConfig.__post_init__'s layer_types: local_layer_ids' layers slide, by
    default every layer but each sixth."""
    count = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is not None:
        return [str(t) for t in types]
    local = raw.get("local_layer_ids")
    ids = set(local) if local is not None else {i for i in range(count) if (i + 1) % 6}
    return [SLIDING if i in ids else FULL for i in range(count)]


def mlp_kinds(raw: dict[str, Any]) -> list[str]:
    """Its mlp_layer_types: every layer "sparse" (experts) unless listed (a checkpoint's
    dense_mlp_idx: the layers before it dense)."""
    kinds = raw.get("mlp_layer_types")
    if kinds is not None:
        return [str(k) for k in kinds]
    first = int(raw.get("dense_mlp_idx") or 0)
    return ["dense" if i < first else "sparse" for i in range(int(raw["num_hidden_layers"]))]


def _sparse_layers(raw: dict[str, Any]) -> tuple[int, ...]:
    return tuple(i for i, kind in enumerate(mlp_kinds(raw)) if kind == "sparse")


def _inkling_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The keys export reads, from InklingTextConfig's: layer_types as full and sliding
    attention, the window, no rotary, the scores' 1 / head_dim, the logits' divisor, and
    a checkpoint's dense_intermediate_size (then intermediate_size is the experts')."""
    raw = dict(raw)
    kinds = layer_kinds(raw)
    raw["inkling_layer_types"] = kinds
    raw["layer_types"] = ["sliding_attention" if k == SLIDING else "full_attention"
                          for k in kinds]
    # InklingTextConfig's attribute_map aliases: where config.json gives one, it wins
    for alias, key in (("sliding_window", "sliding_window_size"),
                       ("num_local_experts", "n_routed_experts"),
                       ("sconv_kernel_size", "conv_kernel_size"),
                       ("model_max_length", "max_position_embeddings"),
                       ("embedding_multiplier", "logits_mup_width_multiplier")):
        if raw.get(alias) is not None:
            raw[key] = raw[alias]
    raw["sliding_window"] = raw["sliding_window_size"]
    raw["no_rope_layers"] = [0] * int(raw["num_hidden_layers"])
    raw["attention_multiplier"] = 1.0 / int(raw["head_dim"])
    raw["logits_scaling"] = float(raw["logits_mup_width_multiplier"])
    # The embedding and the unembedding hold vocab_size rows; the logits are the first
    # unpadded_vocab_size (where below it): the bundle's vocabulary, the rest padding.
    unpadded, padded = raw.get("unpadded_vocab_size"), int(raw["vocab_size"])
    rows = padded - int(unpadded) if unpadded is not None and int(unpadded) < padded else 0
    raw["vocab_size"], raw["inkling_padded_rows"] = padded - rows, rows
    if raw.get("dense_intermediate_size") is not None:
        raw["moe_intermediate_size"] = raw["intermediate_size"]
        raw["intermediate_size"] = raw["dense_intermediate_size"]
    return raw


def _inkling_refuse(raw: dict[str, Any]) -> str | None:
    count = int(raw["num_hidden_layers"])
    kinds, mlps = raw["inkling_layer_types"], mlp_kinds(raw)  # (as _inkling_config read them)
    if len(kinds) != count or set(kinds) - {SLIDING, FULL}:
        return f"layer_types must list {count} of {FULL!r} and {SLIDING!r}, got {kinds!r}"
    if len(mlps) != count or set(mlps) - {"dense", "sparse"}:
        return f"mlp_layer_types must list {count} of 'dense' and 'sparse', got {mlps!r}"
    if raw.get("unpadded_vocab_size") is not None and int(raw["unpadded_vocab_size"]) < 1:
        return f"unpadded_vocab_size must be positive, got {raw['unpadded_vocab_size']}"
    if raw.get("log_scaling_n_floor") is not None:
        return ("log_scaling_n_floor (the full layers' logarithmic scaling of queries and "
                "bias by position) is not supported")
    if "sparse" in mlps and int(raw.get("n_shared_experts") or 0) < 1:
        return "n_shared_experts below 1 is not supported (transformers' router needs one)"
    if raw.get("shared_expert_sink") is False:
        # transformers' router always weighs the shared experts in its softmax
        return "shared_expert_sink=false is not supported (transformers ignores it)"
    if int(raw.get("conv_kernel_size") or 0) < 2:
        return f"conv_kernel_size must be at least 2, got {raw.get('conv_kernel_size')}"
    return None


INKLING_NAMES = TensorNames(embed_norm="model.embed_tokens.embed_norm")
INKLING_MOE = MoeSpec(
    names=MoeNames(router=("mlp.gate.weight",),
                   expert_bias=("mlp.gate.e_score_correction_bias",)),
    routing="inkling", experts_keys=("n_routed_experts",),
    layers=_sparse_layers, norm_key=None, bias_key=None, scaling_key=None,
)
# InklingTextConfig's defaults where the reader's generic ones differ
INKLING_DEFAULTS = {
    "vocab_size": 201024, "hidden_size": 6144, "num_hidden_layers": 66,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "swa_num_attention_heads": 64, "swa_num_key_value_heads": 16, "swa_head_dim": 128,
    "sliding_window_size": 512, "d_rel": 16, "rel_extent": 1024,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "conv_kernel_size": 4,
    "intermediate_size": 24576, "moe_intermediate_size": 3072, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "n_shared_experts": 2, "route_scale": 8.0,
    "logits_mup_width_multiplier": 24.0, "tie_word_embeddings": False,
}
INKLING = FamilySpec(
    names=INKLING_NAMES, block="inkling", window="always", moe=INKLING_MOE,
    legacy=_inkling_config, refuse=_inkling_refuse,
    defaults=INKLING_DEFAULTS, inkling=True,
    embed_extra_rows_key="inkling_padded_rows", head_extra_rows_key="inkling_padded_rows",
    # transformers' causal LM drops the multi-token-prediction layers
    left_out=("model.mtp.",),
    quirks=("relative attention bias per distance from each query's state",
            "residual short convolutions of keys, values and sublayer outputs",
            "normed embedding", "no rotary"),
)


def _mm_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Inkling's reading, untied whatever the configs say (InklingForConditionalGeneration
    ties nothing)."""
    return {**_inkling_config(raw), "tie_word_embeddings": False}


# The image-text checkpoints' language model under its stored names, read as transformers
# 5.24's conversion mapping ("inkling_mm_model") renames them on load: prefixes, then the
# segments inside a name in this order.
MM_RENAMES = (("model.llm.unembed.", "lm_head."),
              ("model.llm.embed_norm.", "model.embed_tokens.embed_norm."),
              ("model.llm.embed.", "model.embed_tokens."), ("model.llm.", "model."))
MM_SEGMENTS = (
    (".mlp.experts.w13_weight", ".mlp.experts.gate_up_proj"),  # (MoeNames.interleaved)
    (".mlp.experts.w2_weight", ".mlp.experts.down_proj"),
    (".shared_experts.shared_w2_weight", ".shared_experts.down_proj"),
    (".mlp.w2_md.", ".mlp.down_proj."), (".mlp.gate.bias", ".mlp.gate.e_score_correction_bias"),
    (".attn.wq_du.", ".self_attn.q_proj."), (".attn.wk_dv.", ".self_attn.k_proj."),
    (".attn.wv_dv.", ".self_attn.v_proj."), (".attn.wr_du.", ".self_attn.r_proj."),
    (".attn.wo_ud.", ".self_attn.o_proj."), (".attn.k_sconv.", ".self_attn.k_sconv.conv1d."),
    (".attn.v_sconv.", ".self_attn.v_sconv.conv1d."), (".attn.", ".self_attn."),
    (".attn_sconv.", ".attn_sconv.conv1d."), (".mlp_sconv.", ".mlp_sconv.conv1d."),
    (".mlp_norm.", ".post_attention_layernorm."), (".attn_norm.", ".input_layernorm."),
)
# Its dense MLPs' and shared experts' gate and up rows, stored interleaved in one tensor,
# which transformers de-interleaves and cuts in two (export/interleaved_halves.py)
MM_HALVES = (("mlp.w13_dn.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), 0),
             ("mlp.shared_experts.shared_w13_weight",
              ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"), 1))
INKLING_MM = replace(
    INKLING, nested="text_config", text_types=("inkling_text",), legacy=_mm_config,
    renames=MM_RENAMES, segment_renames=MM_SEGMENTS, halves=MM_HALVES,
    # the routed experts' w13: gate and up rows interleaved, de-interleaved on load
    moe=replace(INKLING_MOE, names=replace(INKLING_MOE.names, interleaved=True)),
    # the towers (transformers' model.audio_tower. and model.vision_tower.), and the
    # multi-token-prediction layers the causal LM drops (inkling_text's model.mtp.)
    left_out=("model.audio.", "model.visual", "model.llm.mtp."),
    quirks=(*INKLING.quirks, IMAGE_TEXT_QUIRK),
)

FAMILIES: dict[str, FamilySpec] = {"inkling_text": INKLING, "inkling_mm_model": INKLING_MM}
