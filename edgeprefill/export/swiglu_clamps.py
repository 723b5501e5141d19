"""Clamped SwiGLUs, in two orders (FamilySpec.swiglu_clamps):

- "after", Step 3.7's (Step3p7MLP, Step3p7Experts._apply_gate): on the layers that list a
  bound L, min(act(gate), L) * clamp(up, -L, L), the clamp after the activation (not
  gpt-oss's, which clamps the gate before it and adds 1 to up). The routed experts' bounds
  are `swiglu_limits`, the shared expert's and the dense MLP's `swiglu_limits_shared`, one
  entry per layer; an entry of 0 or null, or no list, clamps nothing (transformers reads
  them as infinity). The Hub's lists carry the multi-token-prediction layers' entries
  after the last layer's, which the family's legacy hook cuts off as its config class does.
- "before", Hy4's (HYV4Experts._apply_gate): act(min(gate, L)) * clamp(up, -L, L), the
  clamp before the activation, on the routed experts only, L their one `swiglu_limit`
  (at or below 0: no clamp); the shared experts and dense MLPs clamp nothing. ONNX
  Runtime's MoE op computes it (its swiglu_limit, alpha 1, beta 0: export/moe_op.py).
- "oai", MiniMax-M3's shared expert and dense MLPs (MiniMaxM3VLDenseMLP): gpt-oss's clamped
  SwiGLU, (clamp(up, -L, L) + 1) * g * sigmoid(alpha g) with g = min(gate, L), L its
  swiglu_limit and alpha its swiglu_alpha, whatever their sign (its routed experts' is the
  same, MoeSpec.clamped_swiglu's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.graph import GraphBuilder

Bound = float | None  # None: no clamp


@dataclass(frozen=True)
class SwigluClamps:
    """Each layer's bound: of its routed experts, and of its shared expert or dense MLP;
    whether the gate is clamped before its activation (Hy4) rather than after (Step 3.7)."""

    routed: tuple[Bound, ...]
    shared: tuple[Bound, ...]
    gate_first: bool = False
    alpha: float | None = None  # "oai": gpt-oss's activation at this alpha


@dataclass(frozen=True)
class Clamp:
    """One MLP's clamp: its bound, and whether the gate is clamped before its activation."""

    limit: float
    gate_first: bool
    alpha: float | None = None  # gpt-oss's (up + 1) * g * sigmoid(alpha g), g the gate


def read_swiglu_clamps(raw: dict[str, Any], order: str) -> SwigluClamps | None:
    """The bounds config.json lists (None where it lists none), in `order` ("after",
    "before": the module's docstring)."""
    count = int(raw["num_hidden_layers"])
    if order == "oai":
        limit, alpha = float(raw["swiglu_limit"]), float(raw["swiglu_alpha"])
        return SwigluClamps((None,) * count, (limit,) * count, alpha=alpha)
    if order == "before":
        limit = raw.get("swiglu_limit")
        if isinstance(limit, bool) or not isinstance(limit, int | float | None):
            raise ExportError(f"config.json: swiglu_limit must be a number, got {limit!r}")
        if limit is None or limit <= 0:
            return None
        return SwigluClamps((float(limit),) * count, (None,) * count, gate_first=True)
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


def clamped_glu(g: GraphBuilder, gate: str, act: Callable[[str], str], up: str,
                clamp: Clamp | None, dtype: np.dtype) -> str:
    """act(gate) * up, the gate and up clamped as `clamp` says (None: not at all); with the
    clamp's alpha gpt-oss's activation in place of act."""
    if clamp is None:
        return g.op("Mul", [act(gate), up])
    high, low = g.const(clamp.limit, dtype), g.const(-clamp.limit, dtype)
    if clamp.alpha is not None:
        gate = g.op("Min", [gate, high])
        glu = g.op("Mul", [gate, g.op("Sigmoid", [g.op("Mul", [gate, g.const(clamp.alpha,
                                                                             dtype)])])])
        up = g.op("Add", [g.op("Clip", [up, low, high]), g.const(1.0, dtype)])
        return g.op("Mul", [glu, up])
    gated = act(g.op("Min", [gate, high])) if clamp.gate_first else \
        g.op("Min", [act(gate), high])
    return g.op("Mul", [gated, g.op("Clip", [up, low, high])])


def bounds_by_prefix(clamps: SwigluClamps | None, layer: str
                     ) -> dict[str, tuple[Clamp | None, Clamp | None]]:
    """Layer prefix (`layer`, a template with `{i}`) -> the clamps of its (routed, shared
    or dense) MLPs; empty without clamps."""
    if clamps is None:
        return {}

    def clamp(bound: Bound) -> Clamp | None:
        return None if bound is None else Clamp(bound, clamps.gate_first, clamps.alpha)

    return {layer.format(i=i): (clamp(routed), clamp(shared))
            for i, (routed, shared) in enumerate(zip(clamps.routed, clamps.shared,
                                                     strict=True))}
