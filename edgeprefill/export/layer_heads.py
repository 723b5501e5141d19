"""What Gemma 4's config adds to the reader (`ModelConfig.from_hf` where the family's
`FamilySpec.per_layer_heads` is set): layers with a head size or KV head count of their
own, the KV-shared layers, k = v and the per-layer inputs, read as Gemma4TextConfig
reads them. And the head counts a config lists per layer (`FamilySpec.heads_per_layer`:
OpenELM's layer-wise scaling)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgeprefill.errors import ExportError
from edgeprefill.export.rope import RopeConfig

if TYPE_CHECKING:
    from edgeprefill.export.layer_attention import LayerAttention


def gemma4_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4's fields of ModelConfig (KV sharing, k = v, per-layer inputs)."""
    return {"shared_kv": _shared_kv(raw), "k_eq_v": bool(raw.get("attention_k_eq_v")),
            "per_layer_input": int(raw.get("hidden_size_per_layer_input") or 0),
            "per_layer_vocab": int(raw.get("vocab_size_per_layer_input") or 0)}


def _shared_kv(raw: dict[str, Any]) -> dict[int, int]:
    """Gemma4TextConfig.kv_sharing_modes: the last num_kv_shared_layers layers each read
    the KV of the last earlier layer of their kind."""
    types, shared = raw["layer_types"], int(raw.get("num_kv_shared_layers") or 0)
    first = len(types) - shared
    if shared and first < 1:
        raise ExportError(f"num_kv_shared_layers ({shared}) leaves no layer to hold KV")
    producers = {kind: i for i, kind in enumerate(types[:first])}  # the last of each kind
    out = {}
    for i in range(first, len(types)):
        if types[i] not in producers:
            raise ExportError(f"layer {i} ({types[i]}) shares KV, but no earlier layer of its "
                              "kind holds any (num_kv_shared_layers)")
        out[i] = producers[types[i]]
    return out


def layer_heads(raw: dict[str, Any], layers: tuple[LayerAttention, ...]
                ) -> tuple[LayerAttention, ...]:
    """Layers with a head size or KV head count of their own (`per_layer_config`, as
    transformers 5 writes Gemma 4's configs: layer -> {head_dim, num_key_value_heads})."""
    table = raw.get("per_layer_config") or {}
    if not isinstance(table, dict):
        raise ValueError("per_layer_config must be an object of layer -> overrides")
    out = list(layers)
    for key, overrides in table.items():
        unknown = set(overrides) - {"head_dim", "num_key_value_heads"}
        if unknown:
            raise ExportError(f"per_layer_config overrides {', '.join(sorted(unknown))}; only "
                              "head_dim and num_key_value_heads are supported")
        i = int(key)
        if not 0 <= i < len(out):
            raise ExportError(f"per_layer_config names layer {i}; there are {len(out)}")
        heads = overrides.get("num_key_value_heads")
        out[i] = replace(out[i], head_dim=int(overrides.get("head_dim") or raw["head_dim"]),
                         kv_heads=None if heads is None else int(heads))
    return tuple(out)


def listed_heads(raw: dict[str, Any], keys: tuple[str, str],
                 layers: tuple[LayerAttention, ...]) -> tuple[LayerAttention, ...]:
    """Each layer's query and KV heads from the lists under `keys` (query heads' key, KV
    heads' key), one entry per layer, or one count for every layer (DeciLM's query heads,
    num_attention_heads; Laguna's KV heads, num_key_value_heads); a layer's queries a
    multiple of its KV heads."""
    lists = [_per_layer(raw[key], len(layers)) for key in keys]
    for key, counts in zip(keys, lists, strict=True):
        if not isinstance(counts, list) or len(counts) != len(layers) or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
            raise ExportError(f"config.json: {key} must list a positive head count for each "
                              f"of the {len(layers)} layers, got {raw[key]!r}")
    out = []
    for i, (layer, heads, kv) in enumerate(zip(layers, *lists, strict=True)):
        if heads % kv:
            raise ExportError(f"config.json: layer {i} has {heads} query heads ({keys[0]}), "
                              f"not a multiple of its {kv} KV heads ({keys[1]})")
        out.append(replace(layer, heads=heads, kv_heads=kv))
    return tuple(out)


def _per_layer(counts: Any, layers: int) -> Any:
    """A count for every layer as the list of it; anything else as it is (checked there)."""
    if isinstance(counts, int) and not isinstance(counts, bool):
        return [counts] * layers
    return counts


def rope_widths(ropes: dict[str, RopeConfig], layers: tuple[LayerAttention, ...]
                ) -> dict[str, RopeConfig]:
    """A rope used by layers with a head size of their own (Gemma 4's global layers)
    rotates that head: its proportional frequencies span the whole head; one used by
    layers of their own latent sizes (dots.3's sliding layers) rotates their key part."""
    ropes = dict(ropes)
    for name in ropes:
        dims = {layer.latent.rope_dim if layer.latent else layer.head_dim for layer in layers
                if layer.rope == name and layer.head_dim}
        if len(dims) > 1:
            raise ExportError(f"layers of one rope have head sizes {sorted(dims)}; export "
                              "supports one per layer kind")
        if dims:
            ropes[name] = replace(ropes[name], rotary_dim=dims.pop())
    return ropes
