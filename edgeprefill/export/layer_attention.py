"""What each layer's attention is, as config.json says: its sliding window, whether it
rotates and by which rope table (GLOBAL or LOCAL), its own scale; and those rope tables,
the rotary width and the scores' scale they share."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from edgeprefill.errors import ExportError
from edgeprefill.export.config_checks import config_value, positive_number
from edgeprefill.export.families import FamilySpec
from edgeprefill.export.inkling import inkling_heads
from edgeprefill.export.latent_attention import LatentShape
from edgeprefill.export.layer_heads import layer_heads, listed_heads
from edgeprefill.export.rope import RopeConfig, rope_from_params, rope_params

GLOBAL, LOCAL = "global", "local"  # the rope tables a layer can use


@dataclass(frozen=True)
class LayerAttention:
    """What differs between the attention of one layer and another's."""

    window: int | None  # sliding window: a query sees the last `window` positions, itself incl.
    rope: str | None  # GLOBAL or LOCAL (a key of ModelConfig.ropes); None: no rotary (NoPE)
    scale: float = 1.0  # times ModelConfig.attn_scale in this layer (GPT-2's 1 / (layer + 1))
    # This layer's own head size and KV heads (Gemma 4's full-attention layers); None: the
    # model's head_dim and num_kv_heads.
    head_dim: int | None = None
    kv_heads: int | None = None
    # This layer's own query heads (OpenELM's layer-wise scaling); None: num_heads.
    heads: int | None = None
    # This layer's own latent attention sizes (dots.3's sliding layers: layer_latents.py);
    # None: the model's (ModelConfig.latent).
    latent: LatentShape | None = None


def read_layers(raw: dict[str, Any], spec: FamilySpec) -> tuple[LayerAttention, ...]:
    count = int(raw["num_hidden_layers"])
    window = _sliding_window(raw, spec.window)
    types = raw.get("layer_types")
    if types is None:
        slides = [window is not None and spec.sliding(i, raw) for i in range(count)]
    else:
        if len(types) != count:
            raise ExportError(f"layer_types lists {len(types)} layers; there are {count}")
        kinds = {"full_attention", "sliding_attention", *(("conv",) if spec.conv else ()),
                 *(("linear_attention",) if spec.delta_net or spec.lightning else ()),
                 *(("mamba",) if spec.mamba else ()), *(("rg_lru",) if spec.rg_lru else ()),
                 *(("rwkv",) if spec.rwkv else ()), *(("mlstm",) if spec.mlstm else ()),
                 *(("chunked_attention",) if spec.chunked_attention else ())}
        unknown = {str(kind) for kind in types} - kinds
        if unknown:
            raise ExportError(f"layer_types holds unsupported kinds: {', '.join(sorted(unknown))}"
                              f" (supported: {', '.join(sorted(kinds))})")
        slides = [window is not None and kind == "sliding_attention" for kind in types]
    ropes = _rope_layers(raw, count)
    if spec.nope_types and types is not None:  # Cohere Compass: a null entry is NoPE
        params = rope_params(raw)
        ropes = [rope and params.get(kind) is not None for rope, kind in zip(ropes, types,
                                                                             strict=True)]
    if spec.global_nope and window is not None:
        ropes = [rope and slide for rope, slide in zip(ropes, slides, strict=True)]
    # Sliding layers use the LOCAL rope, which equals GLOBAL unless the config gives local
    # layers their own (Gemma 3); flavours emit one table per distinct rope.
    inverse = spec.inverse_layer_scale_key is not None and raw.get(spec.inverse_layer_scale_key)
    # MiMo-V2-Flash's sliding layers: sliding_kv_factor times the KV heads
    sliding_kv = int(raw["num_key_value_heads"]) * spec.sliding_kv_factor \
        if spec.sliding_kv_factor != 1 else None
    layers = tuple(
        LayerAttention(window if slide else None, (LOCAL if slide else GLOBAL) if rope else None,
                       1.0 / (i + 1) if inverse else 1.0, kv_heads=sliding_kv if slide else None)
        for i, (slide, rope) in enumerate(zip(slides, ropes, strict=True))
    )
    if spec.heads_per_layer is not None:  # OpenELM: lists of each layer's head counts
        layers = listed_heads(raw, spec.heads_per_layer, layers)
    if spec.inkling:  # its sliding layers' own heads
        layers = inkling_heads(raw, layers)
    return layer_heads(raw, layers) if spec.per_layer_heads else layers


def _rope_layers(raw: dict[str, Any], count: int) -> list[bool]:
    """Which layers apply rotary (SmolLM3's `no_rope_layers`: 1 = rope, 0 = NoPE)."""
    flags = raw.get("no_rope_layers")
    if flags is None and raw.get("no_rope_layer_interval"):
        interval = int(raw["no_rope_layer_interval"])
        flags = [int((i + 1) % interval != 0) for i in range(count)]
    if flags is None:
        return [True] * count
    if len(flags) != count:
        raise ExportError(f"no_rope_layers lists {len(flags)} layers; there are {count}")
    return [bool(f) for f in flags]


def _sliding_window(raw: dict[str, Any], rule: str) -> int | None:
    """The window the family's transformers model applies (FamilySpec.window): Llama,
    Gemma 1 and the rest ignore a `sliding_window` key; Qwen2/3 and SmolLM3 use it only
    with `use_sliding_window: true`."""
    if rule == "never" or (rule == "opt_in" and raw.get("use_sliding_window") is not True):
        return None
    window = raw.get("sliding_window")
    if window is None:
        return None
    if int(window) < 1:
        raise ExportError(f"sliding_window must be at least 1, got {window}")
    return int(window)


def read_rotary_dim(raw: dict[str, Any], spec: FamilySpec, head_dim: int) -> int:
    factor = 1.0
    # Elsewhere the factor is a key the model ignores (its default rope uses head_dim; the
    # other rope types' init would read it and then fail to fit the head in transformers).
    if spec.partial_rotary:
        params = rope_params(raw)
        factor = params.get("partial_rotary_factor", raw.get("partial_rotary_factor",
                                                             raw.get("rotary_pct", 1.0)))
    rotary_dim = int(head_dim * float(factor))
    if rotary_dim % 2:
        what = "head_dim" if rotary_dim == head_dim else "head_dim x partial_rotary_factor"
        raise ExportError(f"{what} must be even for rotary embeddings, got {rotary_dim}")
    return rotary_dim


def rotary_dim_per_type(raw: dict[str, Any], ropes: dict[str, RopeConfig],
                        head_dim: int) -> dict[str, RopeConfig]:
    """`ropes` each rotating its own layer type's partial_rotary_factor of head_dim
    (FamilySpec.rotary_per_type: Laguna's rotary computes each type's inverse frequencies
    over int(head_dim x that type's factor), 1 where the entry has none)."""
    params = rope_params(raw)
    out = dict(ropes)
    for name, kind in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        entry = config_value(params, kind, dict) or {}
        rotary_dim = int(head_dim * float(entry.get("partial_rotary_factor", 1.0)))
        if rotary_dim % 2 or rotary_dim < 2:
            raise ExportError(f"rope_parameters.{kind}: head_dim x partial_rotary_factor "
                              f"must be even and positive for rotary embeddings, got "
                              f"{rotary_dim}")
        out[name] = replace(ropes[name], rotary_dim=rotary_dim)
    return out


def read_ropes(raw: dict[str, Any], rotary_dim: int) -> dict[str, RopeConfig]:
    # transformers >= 5 writes `rope_parameters` (theta inside), per layer type where local
    # layers have their own base (Gemma 3); older versions write `rope_theta` plus an
    # optional `rope_scaling` (for the global layers) and `rope_local_base_freq`. Where a
    # config has both, the family's config class decides (rope_params; Gemma 3 and OLMo 3
    # merge them in their `legacy`).
    params = rope_params(raw)
    if "full_attention" in params or "sliding_attention" in params:
        global_params = config_value(params, "full_attention", dict) or {}
        local_params = config_value(params, "sliding_attention", dict) or {}
    else:
        global_params, local_params = params, {}
    # Where the config gives local layers a base of their own (Gemma 3), they never take
    # the global rope: as Gemma3TextConfig fills them in, a missing sliding_attention entry
    # is a default rope on rope_local_base_freq, and an entry without rope_theta has it.
    local_base = raw.get("rope_local_base_freq")
    if local_base is not None:
        local_params = {"rope_theta": local_base, **local_params}
    elif not local_params:
        local_params = global_params
    return {GLOBAL: rope_from_params(global_params, raw, rotary_dim),
            LOCAL: rope_from_params(local_params, raw, rotary_dim)}


def read_attn_scale(raw: dict[str, Any], head_dim: int) -> float:
    if raw.get("attention_multiplier") is not None:  # Granite
        return float(raw["attention_multiplier"])
    if raw.get("query_pre_attn_scalar") is not None:  # Gemma 2/3
        return positive_number(raw, "query_pre_attn_scalar") ** -0.5
    return head_dim**-0.5
