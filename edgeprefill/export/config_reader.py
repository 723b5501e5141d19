"""`ModelConfig` read from a Hugging Face config.json: the one normalizing place.

Published checkpoints were written by many transformers versions: `rope_theta` at the top
level or inside `rope_parameters` (per layer type for Gemma 3), `rope_scaling` with `type`
or `rope_type`, `head_dim` absent or null, `num_key_value_heads` absent, `rotary_pct` or
`partial_rotary_factor`, `layer_types` or a family's implicit sliding pattern. Everything
downstream reads the fields of `ModelConfig` and never looks at the raw dict.

`ModelConfig.from_hf` and `from_dir` call this module, so it takes the class as an
argument instead of importing it (an import cycle otherwise).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeprefill.errors import ExportError
from edgeprefill.export.alibi import slopes as alibi_slopes
from edgeprefill.export.altup import read_altup
from edgeprefill.export.bitlinear import read_bitnet_scheme
from edgeprefill.export.config_checks import check_objects, check_sizes, config_value
from edgeprefill.export.config_refusals import refuse_other_familys_rope, refuse_unsupported
from edgeprefill.export.config_values import (
    bfloat16,
    first_present,
    first_token_id,
    given,
    optional_float,
    token_ids,
)
from edgeprefill.export.experts import read_moe
from edgeprefill.export.families import (
    FAMILIES,
    REFUSED_TYPES,
    FamilySpec,
    family_spec,
    refusal,
    wrapped_text_type,
)
from edgeprefill.export.fp8 import read_fp8_scheme
from edgeprefill.export.latent_attention import latent_scale, read_latent
from edgeprefill.export.layer_attention import (
    GLOBAL,
    read_attn_scale,
    read_layers,
    read_ropes,
    read_rotary_dim,
)
from edgeprefill.export.layer_groups import group_blocks
from edgeprefill.export.layer_heads import gemma4_fields, rope_widths
from edgeprefill.export.mixer_shapes import (
    read_conv,
    read_delta,
    read_hybrid_scales,
    read_lru,
    read_mamba,
)
from edgeprefill.export.modality_experts import other_modalities
from edgeprefill.export.prequantized import read_int4_scheme
from edgeprefill.export.query_scale import (
    ScalableSoftmax,
    read_query_scale,
    read_temperature_tuning,
)
from edgeprefill.export.rope import rope_params
from edgeprefill.export.shared_block import read_shared_block
from edgeprefill.export.skipped_layers import skip_layers
from edgeprefill.json_file import load_json_object

if TYPE_CHECKING:
    from edgeprefill.export.model_config import ModelConfig

# hidden_act names -> the activation the builder emits (gelu_new and gelu_pytorch_tanh are
# the same tanh approximation).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu2": "relu2",
               "xielu": "xielu", "relu": "relu"}
# Where a family's norms take their epsilon unless FamilySpec.eps_key names the key.
EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")


def read_config(config_type: type[ModelConfig], raw: dict[str, Any]) -> ModelConfig:
    """`raw`, a config.json's object, as a `config_type` (ModelConfig.from_hf)."""
    family = config_value(raw, "model_type", str)
    if family in REFUSED_TYPES or family not in FAMILIES:
        raise ExportError(refusal(family, raw))
    check_objects(raw)  # before the family's hooks read them
    try:
        text_type = wrapped_text_type(family, raw)
    except KeyError as missing:
        raise ExportError(f"config.json lacks the required key {missing}") from None
    except ValueError as bad:
        raise ExportError(str(bad)) from None
    spec = family_spec(family, text_type)
    mxfp4 = spec.moe is not None and spec.moe.names.mxfp4
    int4 = read_int4_scheme(family, raw)
    # any other quantization is refused here
    fp8 = None if int4 is not None else read_fp8_scheme(family, raw, mxfp4, spec.bitnet)
    bitnet = read_bitnet_scheme(family, raw) if spec.bitnet else None
    try:
        return replace(_read(config_type, family, spec, spec.read(raw), text_type), fp8=fp8,
                       int4=int4, bitnet=bitnet)
    except KeyError as missing:
        raise ExportError(f"config.json lacks the required key {missing}") from None
    except (TypeError, ValueError, ZeroDivisionError) as bad:
        raise ExportError(f"config.json has a malformed value: {bad}") from None


def read_config_dir(config_type: type[ModelConfig], hf_dir: Path) -> ModelConfig:
    """The config.json of a Hugging Face model folder (ModelConfig.from_dir)."""
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ExportError(f"{path} not found: is {hf_dir} a Hugging Face model folder?")
    return read_config(config_type, load_json_object(path, ExportError))


def _read(config_type: type[ModelConfig], family: str, spec: FamilySpec,
          raw: dict[str, Any], text_type: str | None = None) -> ModelConfig:
    refuse_unsupported(family, spec, raw)
    check_sizes(raw)
    groups = group_blocks(raw["layer_types"]) if spec.blocks else None
    if groups is not None:
        raw = {**raw, "layer_types": groups.layer_types,
               "num_hidden_layers": len(groups.layer_types)}
    skipped = skip_layers(raw, spec.skipped_layers_key, tuple(
        (stored, read) for stored, read in spec.renames if read == "model.")) \
        if spec.skipped_layers_key else None
    if skipped is not None:
        raw = {**raw, "num_hidden_layers": len(skipped.kept)}
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    latent = read_latent(raw) if spec.latent else None
    moe = read_moe(raw, spec.moe) if spec.moe is not None else None
    head_dim = latent.cache_dim if latent else \
        int(raw.get("head_dim") or hidden // max(heads, 1))  # 0 heads: refused
    qkv_bias, o_bias, mlp_bias = _biases(raw, spec)
    ropes = read_ropes(raw, latent.rope_dim if latent else read_rotary_dim(raw, spec, head_dim))
    refuse_other_familys_rope(family, spec, ropes)
    layers = read_layers(raw, spec)
    ropes = rope_widths(ropes, layers)
    shared = read_shared_block(raw) if spec.shared_block else None
    falcon_alibi = bool(spec.alibi_key and raw.get(spec.alibi_key))
    return config_type(
        family=family,
        text_type=text_type,
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=1 if latent else int(given(raw.get("num_key_value_heads"), heads)),
        head_dim=head_dim,
        vocab_size=int(raw["vocab_size"]),
        norm_eps=float(first_present(raw, EPS_KEYS if spec.eps_key is None
                                      else (spec.eps_key,), 1e-6)),
        # Llama's default; families whose config class has another set it in their defaults
        max_positions=int(raw.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", spec.tie_default)),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        activation=_activation(raw, spec),
        block=spec.block_from_config(raw) if spec.block_from_config else spec.block,
        ropes=ropes,
        layers=layers,
        attn_scale=latent_scale(latent, rope_params(raw)) if latent else
        read_attn_scale(raw, head_dim),
        attn_softcap=optional_float(raw.get("attn_logit_softcapping"))
        if "attn" in spec.softcaps else None,
        final_softcap=optional_float(raw.get("final_logit_softcapping"))
        if "final" in spec.softcaps else None,
        embed_scale=_embed_scale(raw, spec, hidden),
        residual_scale=float(raw.get("residual_multiplier", 1.0)),
        logits_divisor=float(raw.get("logits_scaling", 1.0)),
        logits_multiplier=float(raw.get("logit_scale", 1.0)),
        query_scale=read_query_scale(family, raw, ropes[GLOBAL]) if spec.query_scale else
        read_temperature_tuning(raw) if spec.temperature_tuning else
        ScalableSoftmax() if spec.scalable_softmax else None,
        context_cap=spec.context_cap(raw) if spec.context_cap is not None else None,
        lm_head_bias=spec.lm_head_bias or bool(spec.lm_head_bias_key
                                                 and raw.get(spec.lm_head_bias_key)),
        bos_token_id=first_token_id(raw.get("bos_token_id")),
        eos_token_ids=token_ids(raw.get("eos_token_id")),
        **read_conv(raw, spec),
        **read_delta(raw, spec),
        **read_mamba(raw, spec),
        **read_lru(raw, spec),
        scales=read_hybrid_scales(raw) if spec.block == "hybrid" else None,
        mlp_less=groups.mlp_less if groups is not None else
        tuple(range(int(raw["num_hidden_layers"]))) if shared else (),
        renames=groups.renames if groups is not None else shared.renames if shared else
        skipped.renames if skipped is not None else (),
        shared_block=shared,
        left_out=(skipped.left_out if skipped is not None else ()) + (other_modalities(
            moe, spec.moe.names, _language_model_bases(spec)) if moe and spec.moe else ()),
        attn_gate=spec.attn_gate,
        clip_qkv=optional_float(raw.get("clip_qkv")) if spec.clip_qkv else None,
        head_gate=spec.channel_gate or bool(spec.head_gate_key and raw.get(spec.head_gate_key)),
        v_head_dim=_v_head_dim(raw, spec, head_dim),
        value_scale=_value_scale(raw, spec),
        norm_picked=spec.norm_from_config(raw) if spec.norm_from_config else None,
        **gemma4_fields(raw) if spec.per_layer_heads or spec.altup else {},
        moe=moe,
        latent=latent,
        mtp_layers=int(raw.get("num_nextn_predict_layers") or 0),
        **_altup(raw, spec),
        qk_norm_off=spec.qk_norm_key is not None and not raw.get(spec.qk_norm_key),
        alibi=alibi_slopes(heads) if spec.alibi or falcon_alibi else None,
        alibi_bfloat16=falcon_alibi,
        final_norm=spec.final_norm_from_config(raw) if spec.final_norm_from_config else True,
        embed_width=_embed_width(raw, spec, hidden),
        qkv_layout=spec.qkv_layout_from_config(raw) if spec.qkv_layout_from_config else None,
        pad_token_id=first_token_id(raw.get("pad_token_id"))
        if spec.sinusoidal_positions == "xglm" else None,
        head_activation=_activation(raw, spec, spec.head_act_key) if spec.head_act_key
        else None,
    )


def _embed_width(raw: dict[str, Any], spec: FamilySpec, hidden: int) -> int | None:
    """The embedding's own width where the family's key makes it differ from hidden."""
    width = raw.get(spec.embed_width_key) if spec.embed_width_key else None
    return None if width is None or int(width) == hidden else int(width)


def _altup(raw: dict[str, Any], spec: FamilySpec) -> dict[str, Any]:
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


def _biases(raw: dict[str, Any], spec: FamilySpec) -> tuple[bool, bool, bool]:
    """(q/k/v, o, MLP) biases: each the family's fixed choice, or a config switch
    (`bias_key`, `o_bias_key`); None in the spec follows the q/k/v biases."""
    qkv = bool(raw.get(spec.bias_key, spec.qkv_bias)) if spec.bias_key else spec.qkv_bias
    if spec.o_bias_key is not None:
        o = bool(raw.get(spec.o_bias_key))
    else:
        o = qkv if spec.o_bias is None else spec.o_bias
    if spec.mlp_bias_key is not None:
        return qkv, o, bool(raw.get(spec.mlp_bias_key))
    return qkv, o, qkv if spec.mlp_bias is None else spec.mlp_bias


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
