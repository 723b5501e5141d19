"""Step 3.7's clamped SwiGLU (Step3p7MLP, Step3p7Experts._apply_gate): on the layers that
list a bound L, min(act(gate), L) * clamp(up, -L, L), the clamp after the activation (not
gpt-oss's, which clamps the gate before it and adds 1 to up). The routed experts' bounds
are `swiglu_limits`, the shared expert's and the dense MLP's `swiglu_limits_shared`, one
entry per layer; an entry of 0 or null, or no list, clamps nothing (transformers reads
them as infinity). The Hub's lists carry the multi-token-prediction layers' entries after
the last layer's, which the family's legacy hook cuts off as its config class does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.graph import GraphBuilder

Bound = float | None  # None: no clamp


@dataclass(frozen=True)
class SwigluClamps:
    """Each layer's bound: of its routed experts, and of its shared expert or dense MLP."""

    routed: tuple[Bound, ...]
    shared: tuple[Bound, ...]

    @property
    def routed_any(self) -> bool:
        """Whether some layer clamps its routed experts (ONNX Runtime's MoE op cannot)."""
        return any(bound is not None for bound in self.routed)


def read_swiglu_clamps(raw: dict[str, Any]) -> SwigluClamps | None:
    """The bounds config.json lists (None where it lists none)."""
    count = int(raw["num_hidden_layers"])
    routed = _bounds(raw, "swiglu_limits", count)
    shared = _bounds(raw, "swiglu_limits_shared", count)
    if not any(bound is not None for bound in (*routed, *shared)):
        return None
    return SwigluClamps(routed, shared)


def _bounds(raw: dict[str, Any], key: str, count: int) -> tuple[Bound, ...]:
    listed = raw.get(key)
    if listed is None:
        return (None,) * count
    if not isinstance(listed, list) or len(listed) != count or any(
            isinstance(v, bool) or not isinstance(v, int | float | None)
            or (v is not None and not v >= 0) for v in listed):
        raise ExportError(f"config.json: {key} must list a bound of 0 or more (or null) for "
                          f"each of the {count} layers, got {listed!r}")
    return tuple(float(v) if v else None for v in listed)


def clamped_glu(g: GraphBuilder, activated: str, up: str, bound: Bound,
                dtype: np.dtype) -> str:
    """activated * up (activated = act(gate)), each clamped to the layer's bound."""
    if bound is None:
        return g.op("Mul", [activated, up])
    high, low = g.const(bound, dtype), g.const(-bound, dtype)
    return g.op("Mul", [g.op("Min", [activated, high]), g.op("Clip", [up, low, high])])


def bounds_by_prefix(clamps: SwigluClamps | None, layer: str
                     ) -> dict[str, tuple[Bound, Bound]]:
    """Layer prefix (`layer`, a template with `{i}`) -> its (routed, shared or dense)
    bounds; empty without clamps."""
    if clamps is None:
        return {}
    return {layer.format(i=i): bounds
            for i, bounds in enumerate(zip(clamps.routed, clamps.shared, strict=True))}
