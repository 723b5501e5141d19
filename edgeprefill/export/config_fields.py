"""`ModelConfig`'s fields, group by group, read from a config.json: each group's function
names the keys it reads. `config_reader._read` calls them, in the order its fields had been
read when they were one call (so a config with several faults reports the same first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeprefill.errors import ExportError
from edgeprefill.export.alibi import slopes as alibi_slopes
from edgeprefill.export.altup import read_altup
from edgeprefill.export.cca import read_cca
from edgeprefill.export.config_values import (
    bfloat16,
    first_present,
    first_token_id,
    given,
    optional_float,
    token_ids,
)
from edgeprefill.export.families import FamilySpec
from edgeprefill.export.inkling import read_inkling
from edgeprefill.export.latent_attention import latent_scale
from edgeprefill.export.layer_attention import read_attn_scale
from edgeprefill.export.mixer_shapes import (
    read_conv,
    read_delta,
    read_hybrid_scales,
    read_lightning,
    read_lru,
    read_mamba,
    read_mlstm,
    read_rwkv,
)
from edgeprefill.export.modality_experts import other_modalities
from edgeprefill.export.query_scale import (
    ScalableSoftmax,
    read_query_scale,
    read_temperature_tuning,
)
from edgeprefill.export.rope import rope_params

if TYPE_CHECKING:
    from edgeprefill.export.experts import MoeConfig
    from edgeprefill.export.latent_attention import LatentShape
    from edgeprefill.export.layer_groups import LayerGroups
    from edgeprefill.export.rope import RopeConfig
    from edgeprefill.export.shared_block import SharedBlockShape
    from edgeprefill.export.skipped_layers import SkippedLayers

# hidden_act names -> the activation the builder emits (gelu_new and gelu_pytorch_tanh are
# the same tanh approximation).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu2": "relu2",
               "xielu": "xielu", "relu": "relu"}
# Where a family's norms take their epsilon unless FamilySpec.eps_key names the key.
EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")


def sizes(raw: dict[str, Any], heads: int, hidden: int, head_dim: int,
          latent: LatentShape | None) -> dict[str, Any]:
    """Widths and counts: `hidden_size`, `intermediate_size`, `num_hidden_layers`,
    `num_attention_heads`, `num_key_value_heads` (absent: one per head; one latent head
    under MLA), `vocab_size` and `max_position_embeddings`."""
    return {
        "hidden_size": hidden,
        "intermediate_size": int(raw["intermediate_size"]),
        "num_layers": int(raw["num_hidden_layers"]),
        "num_heads": heads,
        "num_kv_heads": 1 if latent else int(given(raw.get("num_key_value_heads"), heads)),
        "head_dim": head_dim,
        "vocab_size": int(raw["vocab_size"]),
        # Llama's default; families whose config class has another set it in their defaults
        "max_positions": int(raw.get("max_position_embeddings", 2048)),
    }


def norms_and_activations(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """The norms' epsilon (`rms_norm_eps`, `layer_norm_eps`, `layer_norm_epsilon` or the
    family's eps_key; the post-sublayer norms' own where the family's post_norm_eps_key
    names one), the MLP's and the head's activation (`hidden_act` or the family's
    act_key and head_act_key), and the family's config switches of the block's norm
    layout (block, norm kind, final norm, q/k norms)."""
    eps = float(first_present(raw, EPS_KEYS if spec.eps_key is None else (spec.eps_key,),
                              1e-6))
    fixed = spec.layer_norm_eps
    return {
        "norm_eps": eps if fixed is None else fixed,
        "final_norm_eps": None if fixed is None else eps,
        "activation": _activation(raw, spec),
        "head_activation": _activation(raw, spec, spec.head_act_key) if spec.head_act_key
        else None,
        "block": spec.block_from_config(raw) if spec.block_from_config else spec.block,
        "norm_picked": spec.norm_from_config(raw) if spec.norm_from_config else None,
        "final_norm": spec.final_norm_from_config(raw) if spec.final_norm_from_config
        else True,
        "qk_norm_off": spec.qk_norm_key is not None and not raw.get(spec.qk_norm_key),
        "qk_norm_picked": spec.qk_norm_from_config(raw) if spec.qk_norm_from_config else None,
        "post_norm_eps": float(raw[spec.post_norm_eps_key])
        if spec.post_norm_eps_key and raw.get(spec.post_norm_eps_key) is not None else None,
        "residual_gate_temperature": float(raw[spec.residual_gate_key])
        if spec.residual_gate_key else None,
    }


def attention_scores(raw: dict[str, Any], spec: FamilySpec, head_dim: int,
                     latent: LatentShape | None) -> dict[str, Any]:
    """The attention scores' scale, `attention_multiplier` or `query_pre_attn_scalar`
    (without: 1/sqrt(head_dim); under MLA with yarn's mscale), and their
    `attn_logit_softcapping` where the family reads it."""
    return {
        "attn_scale": latent_scale(latent, rope_params(raw)) if latent else
        read_attn_scale(raw, head_dim),
        "attn_softcap": optional_float(raw.get("attn_logit_softcapping"))
        if "attn" in spec.softcaps else None,
    }


def scales(raw: dict[str, Any], spec: FamilySpec, hidden: int) -> dict[str, Any]:
    """The residual stream's and the logits' scales: `final_logit_softcapping` where the
    family reads it, the embedding's scale (the family's: sqrt(hidden_size), or Granite's
    `embedding_multiplier`), Granite's `residual_multiplier` and `logits_scaling`, and
    Cohere's `logit_scale`."""
    return {
        "final_softcap": optional_float(raw.get("final_logit_softcapping"))
        if "final" in spec.softcaps else None,
        "embed_scale": _embed_scale(raw, spec, hidden),
        "residual_scale": float(raw.get("residual_multiplier", 1.0)),
        "logits_divisor": float(raw.get("logits_scaling", 1.0)),
        "logits_multiplier": float(raw.get("logit_scale", 1.0)),
    }


def positions(family: str, raw: dict[str, Any], spec: FamilySpec, heads: int,
              global_rope: RopeConfig) -> dict[str, Any]:
    """What positions do besides the ropes: the queries' scale by position (the family's
    query scale from the rope's keys, Llama 4's `attn_temperature_tuning`, or scalable
    softmax), the family's context cap (Llama 4's `attention_chunk_size`, PhiMoE's
    longrope window), and ALiBi (the family's, the one its config picks, as Baichuan 13B's,
    or Falcon's `alibi` switch, its slopes rounded to bfloat16)."""
    falcon_alibi = bool(spec.alibi_key and raw.get(spec.alibi_key))
    picked = bool(spec.alibi_from_config and spec.alibi_from_config(raw))
    return {
        "query_scale": read_query_scale(family, raw, global_rope) if spec.query_scale else
        read_temperature_tuning(raw) if spec.temperature_tuning else
        ScalableSoftmax() if spec.scalable_softmax else None,
        "context_cap": spec.context_cap(raw) if spec.context_cap is not None else None,
        "alibi": alibi_slopes(heads) if spec.alibi or falcon_alibi or picked else None,
        "alibi_bfloat16": falcon_alibi,
    }


def head_and_tokens(raw: dict[str, Any], spec: FamilySpec, hidden: int) -> dict[str, Any]:
    """The embedding's own width (OPT's `word_embed_proj_dim`) and rows beyond the
    vocabulary (Mllama's, Molmo 2's `additional_vocab_size`), the LM head
    (`tie_word_embeddings`, its bias, rows normalized where its family's config says:
    Baichuan 2's NormHead), the logits the family masks (Chameleon's image tokens, from
    `vocabulary_map`) and the special token ids (`bos_token_id`, `eos_token_id`; XGLM's
    `pad_token_id`, which its sinusoidal positions count from)."""
    return {
        "tie_embeddings": bool(raw.get("tie_word_embeddings", spec.tie_default)),
        "lm_head_bias": spec.lm_head_bias or bool(spec.lm_head_bias_key
                                                  and raw.get(spec.lm_head_bias_key)),
        "lm_head_normalized": bool(spec.head_normalized and spec.head_normalized(raw)),
        "masked_tokens": spec.masked_logits(raw) if spec.masked_logits else (),
        "bos_token_id": first_token_id(raw.get("bos_token_id")),
        "eos_token_ids": token_ids(raw.get("eos_token_id")),
        "embed_width": _embed_width(raw, spec, hidden),
        "embed_extra_rows": int(raw[spec.embed_extra_rows_key] or 0)
        if spec.embed_extra_rows_key else spec.embed_extra_rows,
        "head_extra_rows": int(raw[spec.head_extra_rows_key] or 0)
        if spec.head_extra_rows_key else 0,
        "pad_token_id": first_token_id(raw.get("pad_token_id"))
        if spec.sinusoidal_positions == "xglm" else None,
    }


def projections(raw: dict[str, Any], spec: FamilySpec, head_dim: int) -> dict[str, Any]:
    """The attention's and MLP's projections: their biases (_biases), OLMo's and DBRX's
    `clip_qkv`, the output gates (the family's, or its head_gate_key switch), MiMo-V2-Flash's
    value heads (v_head_dim_key, value_scale_key) and Falcon's fused q/k/v layout."""
    return {
        **_biases(raw, spec),
        "attn_gate": spec.attn_gate,
        "clip_qkv": optional_float(raw.get("clip_qkv")) if spec.clip_qkv else None,
        "head_gate": spec.channel_gate or spec.softplus_gate or spec.sigmoid_gate or bool(
            spec.head_gate_key and raw.get(spec.head_gate_key)),
        "gate_per_channel": spec.channel_gate or ((spec.softplus_gate or spec.sigmoid_gate)
                                                  and not _gate_per_head(raw)),
        "v_head_dim": _v_head_dim(raw, spec, head_dim),
        "value_scale": _value_scale(raw, spec),
        "keep_window": _keep_window(raw) if spec.dynamic_mask else None,
        "qkv_layout": spec.qkv_layout_from_config(raw) if spec.qkv_layout_from_config
        else None,
    }


def _gate_per_head(raw: dict[str, Any]) -> bool:
    """LagunaAttention's and Step3p7Attention's `gate_per_head`: `gating` true (their
    default) or "per-head"; any other value (false and "per-element" included) gates each
    channel."""
    gating = raw.get("gating", True)
    return gating is True or gating == "per-head"


def mixers(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """The layers other than attention (short convolutions, Gated DeltaNet, Mamba, RG-LRU,
    RWKV, mLSTM) and a hybrid's scales: mixer_shapes' readers, each of its family's keys."""
    return {**read_conv(raw, spec), **read_delta(raw, spec), **read_mamba(raw, spec),
            **read_lru(raw, spec), **read_rwkv(raw, spec), **read_lightning(raw, spec),
            **read_mlstm(raw, spec),
            "scales": read_hybrid_scales(raw) if spec.block == "hybrid" else None,
            # ZAYA: CCA's convolution widths (cca_time0, cca_time1), router_hidden_size
            "cca": read_cca(raw) if spec.cca else None,
            "router_hidden": int(raw["router_hidden_size"]) if spec.cca else 0,
            "inkling": read_inkling(raw) if spec.inkling else None}


def layer_layout(raw: dict[str, Any], spec: FamilySpec, groups: LayerGroups | None,
                 skipped: SkippedLayers | None, shared: SharedBlockShape | None,
                 moe: MoeConfig | None) -> dict[str, Any]:
    """Which stored layers export reads, and as what: the layers without an MLP, the
    prefixes read as another's, those left out (skipped layers, other modalities'
    experts), and `num_nextn_predict_layers` (DeepSeek-V3's MTP layers, left out)."""
    return {
        "mlp_less": groups.mlp_less if groups is not None else
        tuple(range(int(raw["num_hidden_layers"]))) if shared else (),
        "renames": groups.renames if groups is not None else shared.renames if shared else
        skipped.renames if skipped is not None else (),
        "left_out": (skipped.left_out if skipped is not None else ()) + (other_modalities(
            moe, spec.moe.names, _language_model_bases(spec)) if moe and spec.moe else ()),
        "mtp_layers": int(raw.get("num_nextn_predict_layers") or 0),
    }


def altup_fields(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """Gemma 3n's AltUp and activation sparsity fields of ModelConfig; none elsewhere."""
    if not spec.altup:
        return {}
    sparsity = tuple(float(s) for s in raw["activation_sparsity_pattern"])
    if len(sparsity) != int(raw["num_hidden_layers"]):
        raise ExportError(f"activation_sparsity_pattern lists {len(sparsity)} layers; there "
                          f"are {raw['num_hidden_layers']}")
    if not all(0.0 <= s < 1.0 for s in sparsity):
        raise ExportError("activation_sparsity_pattern values must lie in [0, 1)")
    return {"altup": read_altup(raw), "sparsity": sparsity}


def _embed_width(raw: dict[str, Any], spec: FamilySpec, hidden: int) -> int | None:
    """The embedding's own width where the family's key makes it differ from hidden."""
    width = raw.get(spec.embed_width_key) if spec.embed_width_key else None
    return None if width is None or int(width) == hidden else int(width)


def _biases(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
    """The q/k/v, o and MLP biases: each the family's fixed choice, or a config switch
    (`attention_bias`, `mlp_bias` or another the family's bias_key, o_bias_key and
    mlp_bias_key name); None in the spec follows the q/k/v biases."""
    qkv = bool(raw.get(spec.bias_key, spec.qkv_bias)) if spec.bias_key else spec.qkv_bias
    if spec.o_bias_key is not None:
        o = bool(raw.get(spec.o_bias_key))
    else:
        o = qkv if spec.o_bias is None else spec.o_bias
    if spec.mlp_bias_key is not None:
        mlp = bool(raw.get(spec.mlp_bias_key))
    else:
        mlp = qkv if spec.mlp_bias is None else spec.mlp_bias
    return {"qkv_bias": qkv, "o_bias": o, "mlp_bias": mlp}


def _activation(raw: dict[str, Any], spec: FamilySpec, key: str | None = None) -> str:
    """The activation config.json names under `key` (the MLP's: spec.act_key)."""
    key = key or spec.act_key
    name = (raw.get(key) if key else None) or spec.act_default
    if name not in ACTIVATIONS:
        raise ExportError(
            f"activation {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}"
        )
    return ACTIVATIONS[name]


def _v_head_dim(raw: dict[str, Any], spec: FamilySpec, head_dim: int) -> int | None:
    """MiMo-V2-Flash's value head size where it differs from head_dim (None: the same)."""
    if spec.v_head_dim_key is None or raw.get(spec.v_head_dim_key) is None:
        return None
    v_dim = int(raw[spec.v_head_dim_key])
    if not 0 < v_dim <= head_dim:
        raise ExportError(f"{spec.v_head_dim_key} ({v_dim}) must be 1 to head_dim ({head_dim})")
    return None if v_dim == head_dim else v_dim


def _keep_window(raw: dict[str, Any]) -> int:
    """Doge's keep_window_size (its config class's 2048 where absent or null)."""
    keep = raw.get("keep_window_size")
    keep = 2048 if keep is None else keep
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ExportError(f"keep_window_size must be a positive integer, got {keep!r}")
    return keep


def _value_scale(raw: dict[str, Any], spec: FamilySpec) -> float:
    if spec.value_scale_key is None or raw.get(spec.value_scale_key) is None:
        return 1.0
    return float(raw[spec.value_scale_key])


def _embed_scale(raw: dict[str, Any], spec: FamilySpec, hidden: int) -> float | None:
    if spec.embed_scale_key is not None and not raw.get(spec.embed_scale_key):
        return None
    if spec.embed_scale == "sqrt_hidden":
        return hidden**0.5
    if spec.embed_scale == "sqrt_hidden_bf16":  # a bfloat16 buffer in RecurrentGemma
        return bfloat16(hidden**0.5)
    if spec.embed_scale == "multiplier":
        return float(raw.get("embedding_multiplier", 1.0))
    return None


def _language_model_bases(spec: FamilySpec) -> tuple[str, ...]:
    """The stored prefixes a language model's `layers.{i}.` may follow: `model.` and those
    the family renames to it (an image-text checkpoint's `model.language_model.`)."""
    return ("model.", *(stored for stored, read in spec.renames if read == "model."))
