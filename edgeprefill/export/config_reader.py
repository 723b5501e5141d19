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
from edgeprefill.export.bitlinear import read_bitnet_scheme
from edgeprefill.export.block_index import read_block_index
from edgeprefill.export.bnb import read_bnb_scheme
from edgeprefill.export.config_checks import (
    check_given,
    check_objects,
    check_sizes,
    config_value,
)
from edgeprefill.export.config_fields import (
    altup_fields,
    attention_scores,
    head_and_tokens,
    layer_layout,
    mixers,
    norms_and_activations,
    positions,
    projections,
    scales,
    sizes,
)
from edgeprefill.export.config_refusals import refuse_other_familys_rope, refuse_unsupported
from edgeprefill.export.experts import read_moe
from edgeprefill.export.families import (
    FAMILIES,
    REFUSED_TYPES,
    FamilySpec,
    family_spec,
    refusal,
    wrapped_text_type,
)
from edgeprefill.export.families.not_causal import SEQUENCE_CLASSIFIER, task_head
from edgeprefill.export.fp8 import read_fp8_scheme
from edgeprefill.export.hyper_connections import read_hyper
from edgeprefill.export.latent_attention import read_latent
from edgeprefill.export.layer_attention import (
    GLOBAL,
    read_layers,
    read_ropes,
    read_rotary_dim,
    rotary_dim_per_type,
)
from edgeprefill.export.layer_groups import group_blocks
from edgeprefill.export.layer_heads import gemma4_fields, rope_widths
from edgeprefill.export.layer_latents import dots_latent, latent_layers
from edgeprefill.export.nas_blocks import read_blocks
from edgeprefill.export.prequantized import read_int4_scheme
from edgeprefill.export.remote_model_type import with_model_type
from edgeprefill.export.shared_block import read_shared_block
from edgeprefill.export.skipped_layers import skip_layers
from edgeprefill.export.sparse_index import read_index
from edgeprefill.export.swiglu_clamps import read_swiglu_clamps
from edgeprefill.export.unscaled_rope import unscaled_layers
from edgeprefill.json_file import load_json_object

if TYPE_CHECKING:
    from edgeprefill.export.latent_attention import LatentShape
    from edgeprefill.export.layer_attention import LayerAttention
    from edgeprefill.export.layer_groups import LayerGroups
    from edgeprefill.export.model_config import ModelConfig
    from edgeprefill.export.rope import RopeConfig
    from edgeprefill.export.skipped_layers import SkippedLayers


def read_config(config_type: type[ModelConfig], raw: dict[str, Any],
                classifier: bool = False) -> ModelConfig:
    """`raw`, a config.json's object, as a `config_type` (ModelConfig.from_hf). With
    `classifier` (export --task score) a supported family's sequence classifier is read as
    its decoder, whose score head export/score_head.py takes."""
    raw = with_model_type(raw)  # DeciLM-6B's config.json names none
    family = config_value(raw, "model_type", str)
    if family in REFUSED_TYPES or family not in FAMILIES:
        raise ExportError(refusal(family, raw))
    head = task_head(raw)  # a supported family's classifier: no LM head to export
    scores = all(str(name).endswith(SEQUENCE_CLASSIFIER) for name in raw["architectures"]) \
        if head is not None else False
    if head is not None and not (classifier and scores):
        said = "; `export --task score` exports it as a score bundle (Engine.score, " \
            "/v1/rerank)" if scores else ""
        raise ExportError(f"model_type {family!r} is {head}{said}")
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
    bnb = read_bnb_scheme(family, raw)
    # any other quantization is refused here
    fp8 = None if int4 is not None or bnb is not None else \
        read_fp8_scheme(family, raw, mxfp4, spec.bitnet)
    bitnet = read_bitnet_scheme(family, raw) if spec.bitnet else None
    try:
        return replace(_read(config_type, family, spec, spec.read(raw), text_type), fp8=fp8,
                       int4=int4, bitnet=bitnet, bnb=bnb)
    except KeyError as missing:
        raise ExportError(f"config.json lacks the required key {missing}") from None
    except (TypeError, ValueError, ZeroDivisionError) as bad:
        raise ExportError(f"config.json has a malformed value: {bad}") from None


def read_config_dir(config_type: type[ModelConfig], hf_dir: Path,
                    classifier: bool = False) -> ModelConfig:
    """The config.json of a Hugging Face model folder (ModelConfig.from_dir)."""
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ExportError(f"{path} not found: is {hf_dir} a Hugging Face model folder?")
    return read_config(config_type, load_json_object(path, ExportError), classifier)


def _read(config_type: type[ModelConfig], family: str, spec: FamilySpec,
          raw: dict[str, Any], text_type: str | None = None) -> ModelConfig:
    """The fields of ModelConfig, group by group, after what several groups derive from
    (the layers as export lays them out, heads, widths, ropes, latent attention, experts)."""
    refuse_unsupported(family, spec, raw)
    check_sizes(raw)
    groups, skipped, raw = _laid_out(raw, spec)
    check_given(raw)
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    latent = (dots_latent(raw) if spec.latent_layers
              else read_latent(raw, spec.latent_norms_at_eps)) if spec.latent else None
    moe = read_moe(raw, spec.moe) if spec.moe is not None else None
    head_dim = _head_dim(raw, heads, hidden, latent)
    ropes, layers = _ropes_and_layers(family, spec, raw, head_dim, latent)
    shared = read_shared_block(raw) if spec.shared_block else None
    # the order the fields were read in as one call: a config.json with several faults
    # still reports the same one first
    return config_type(
        family=family, text_type=text_type, ropes=ropes, layers=layers, moe=moe,
        latent=latent, shared_block=shared,
        sparse_index=read_index(raw, spec.sparse_index, latent.rope_dim,
                                plain=_plain_layers(spec, layers))
        if spec.sparse_index and latent else None,
        block_index=read_block_index(raw, int(raw["num_key_value_heads"]), head_dim,
                                     ropes[GLOBAL].rotary_dim) if spec.block_index else None,
        **sizes(raw, heads, hidden, head_dim, latent),
        **norms_and_activations(raw, spec),
        **attention_scores(raw, spec, head_dim, latent),
        **scales(raw, spec, hidden),
        **positions(family, raw, spec, heads, ropes[GLOBAL]),
        **head_and_tokens(raw, spec, hidden),
        **projections(raw, spec, head_dim),
        **mixers(raw, spec),
        **layer_layout(raw, spec, groups, skipped, shared, moe),
        **gemma4_fields(raw) if spec.per_layer_heads or spec.altup else {},
        **altup_fields(raw, spec),
        nas=read_blocks(raw) if spec.nas_blocks else None,
        swiglu_clamps=read_swiglu_clamps(raw, spec.swiglu_clamps)
        if spec.swiglu_clamps else None,
        hyper=read_hyper(raw) if spec.block == "hyper" else None,
    )


def _plain_layers(spec: FamilySpec, layers: tuple[LayerAttention, ...]) -> tuple[int, ...]:
    """The layers without DSA's indexer: dots.3's sliding ones (their own latent sizes)."""
    return tuple(i for i, layer in enumerate(layers) if layer.latent is not None) \
        if spec.latent_layers else ()


def _laid_out(raw: dict[str, Any], spec: FamilySpec
              ) -> tuple[LayerGroups | None, SkippedLayers | None, dict[str, Any]]:
    """Nemotron-H's `layer_types` blocks grouped into layers, and the layers the family's
    key (Llama 3.2 Vision's `cross_attention_layers`) leaves out; `raw` with
    `num_hidden_layers` (and `layer_types`) as export lays the layers out."""
    groups = group_blocks(raw["layer_types"]) if spec.blocks else None
    if groups is not None:
        raw = {**raw, "layer_types": groups.layer_types,
               "num_hidden_layers": len(groups.layer_types)}
    # the language model's stored prefixes; a model saved alone (mllama_text_model) has
    # its own, model.
    bases = tuple((stored, read) for stored, read in spec.renames if read == "model.") \
        or (("model.", "model."),)
    skipped = skip_layers(raw, spec.skipped_layers_key, bases) \
        if spec.skipped_layers_key else None
    if skipped is not None:
        raw = {**raw, "num_hidden_layers": len(skipped.kept)}
    return groups, skipped, raw


def _head_dim(raw: dict[str, Any], heads: int, hidden: int, latent: LatentShape | None) -> int:
    """`head_dim`; absent or null, `hidden_size` / `num_attention_heads`; under multi-head
    latent attention the cached head (latent and rope parts)."""
    return latent.cache_dim if latent else \
        int(raw.get("head_dim") or hidden // max(heads, 1))  # 0 heads: refused


def _ropes_and_layers(family: str, spec: FamilySpec, raw: dict[str, Any], head_dim: int,
                      latent: LatentShape | None
                      ) -> tuple[dict[str, RopeConfig], tuple[LayerAttention, ...]]:
    """The ropes (`rope_theta`, `rope_scaling`, `rope_parameters`, `rotary_pct`,
    `partial_rotary_factor`, ...: layer_attention.read_ropes) and each layer's attention
    (`layer_types`, `sliding_window` or the family's pattern: read_layers), each rope as
    wide as the heads of the layers that use it."""
    ropes = read_ropes(raw, latent.rope_dim if latent else read_rotary_dim(raw, spec, head_dim))
    if spec.rotary_per_type:  # Laguna: each layer type's own share of the head
        ropes = rotary_dim_per_type(raw, ropes, head_dim)
    refuse_other_familys_rope(family, spec, ropes)
    layers = read_layers(raw, spec)
    if spec.latent_layers:  # dots.3: sliding layers of their own latent sizes
        layers = latent_layers(raw, layers)
    if spec.rope_scaling_layers_key:  # Molmo 2: the unlisted layers' rope unscaled
        ropes, layers = unscaled_layers(raw, spec.rope_scaling_layers_key, ropes, layers)
    return rope_widths(ropes, layers), layers
