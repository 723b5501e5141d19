"""Per-layer rope scaling (Molmo 2's `rope_scaling_layers`): the layers it lists rotate on
the scaled rope of `rope_parameters`, the others on the default rope of the same theta.

transformers' Molmo2TextModel builds both tables and picks one per layer; a bundle gives
the unscaled layers the LOCAL table (which no sliding layer uses in these models) as that
default rope, so the flavours emit one table per distinct rope as they do for Gemma 3's
local layers. A null list scales every layer (Molmo2TextConfig's default).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import GLOBAL, LOCAL, LayerAttention
from edgeprefill.export.rope import RopeConfig


def unscaled_layers(raw: dict[str, Any], key: str, ropes: dict[str, RopeConfig],
                    layers: tuple[LayerAttention, ...]
                    ) -> tuple[dict[str, RopeConfig], tuple[LayerAttention, ...]]:
    """`ropes` and `layers` with the layers `raw[key]` leaves out on the default rope."""
    listed = raw.get(key)
    if listed is None:
        return ropes, layers
    if not isinstance(listed, list) or not all(isinstance(i, int) for i in listed):
        raise ExportError(f"config.json: {key} must be a list of layer indices, got {listed!r}")
    scaled = set(listed)
    if any(layer.window is not None for layer in layers):  # LOCAL would be theirs
        raise ExportError(f"{key} beside sliding-window layers is not supported")
    scaled_rope = ropes[GLOBAL]
    default = RopeConfig(theta=scaled_rope.theta, rotary_dim=scaled_rope.rotary_dim,
                         max_positions=scaled_rope.max_positions)
    out = tuple(layer if i in scaled or layer.rope is None else replace(layer, rope=LOCAL)
                for i, layer in enumerate(layers))
    return {**ropes, LOCAL: default}, out
