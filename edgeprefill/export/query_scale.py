"""Llama 4's attention temperature, as Ministral 3 applies it: each query times

    1 + beta * log(1 + floor(position / window))

with `beta` the rope dict's `llama_4_scaling_beta` and `window` its
`original_max_position_embeddings` (transformers' get_llama_4_attn_scale). transformers
multiplies the rotated query; the factor is one number per position, and rotary turns each
pair of dims at that position linearly, so scaling q before the rotation is the same: the
graph scales q before attention, whose rotary (GroupQueryAttention's own, the native
kernel's, or the standard flavour's) follows.

Llama 4's own (attn_temperature_tuning) is the same factor of position + 1, with `beta`
its attn_scale and `window` its floor_scale, on its NoPE layers only.

Beam's NoPE layers take a factor of their own (ScalableSoftmax).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.rope import RopeConfig, rope_params

# The rope types whose original window transformers fills in from the config
# (standardize_rope_params); for the others the rope dict must hold it.
WINDOWED_ROPES = ("llama3", "yarn", "longrope")


@dataclass(frozen=True)
class QueryScale:
    beta: float
    window: int  # positions per step of the factor (the original context)
    offset: int = 0  # added to the position first (Llama 4: 1)
    nope_only: bool = False  # only the layers without rotary scale q (Llama 4)

    def emit(self, g: GraphBuilder, positions: str, dtype: np.dtype) -> str:
        """[B, C] int64 positions -> [B, C, 1] factors in `dtype`, computed in float32
        in transformers' order ((position + offset) / window, floor, log, beta)."""
        pos = g.op("Cast", [positions], to=1)
        if self.offset:
            pos = g.op("Add", [pos, g.const(float(self.offset), np.float32)])
        steps = g.op("Floor", [g.op("Div", [pos, g.const(self.window, np.float32)])])
        one = g.const(1.0, np.float32)
        log = g.op("Log", [g.op("Add", [steps, one])])
        scale = g.op("Add", [g.op("Mul", [log, g.const(self.beta, np.float32)]), one])
        scale = g.op("Unsqueeze", [scale, g.const([2])])
        return scale if np.dtype(dtype) == np.float32 else g.op("Cast", [scale], to=10)


@dataclass(frozen=True)
class ScalableSoftmax:
    """Beam's factor of its NoPE layers' queries (after their q norm), (1 + (position + 1)
    / window) ** power, which its model (compute_attention_scaling) hard-codes."""

    power: float = 0.1
    window: int = 2048
    nope_only: bool = True

    def emit(self, g: GraphBuilder, positions: str, dtype: np.dtype) -> str:
        """[B, C] int64 positions -> [B, C, 1] factors in `dtype`: float32
        exp(power * log(1 + (position + 1) / window)) for transformers' exp(power *
        log1p(...)): at (position + 1) / window >= 1 / window the two differ below float32's
        rounding of the factor (tests/test_beam.py)."""
        pos = g.op("Add", [g.op("Cast", [positions], to=1), g.const(1.0, np.float32)])
        ratio = g.op("Div", [pos, g.const(float(self.window), np.float32)])
        log = g.op("Log", [g.op("Add", [ratio, g.const(1.0, np.float32)])])
        scale = g.op("Exp", [g.op("Mul", [log, g.const(self.power, np.float32)])])
        scale = g.op("Unsqueeze", [scale, g.const([2])])
        return scale if np.dtype(dtype) == np.float32 else g.op("Cast", [scale], to=10)


def read_query_scale(family: str, raw: dict[str, Any], rope: RopeConfig) -> QueryScale | None:
    """The factor of a family whose model applies it (None: beta 0, the factor is 1).
    transformers fails without beta or the window: refused in one line."""
    params = rope_params(raw)
    beta = params.get("llama_4_scaling_beta")
    window = rope.original_max_positions if rope.kind in WINDOWED_ROPES else \
        params.get("original_max_position_embeddings")
    for key, value in (("llama_4_scaling_beta", beta), ("original_max_position_embeddings",
                                                        window)):
        if value is None:
            raise ExportError(f"{family}: the rope parameters need {key}; the family's model "
                              "has no default for it")
    if int(window) < 1:
        raise ExportError(f"{family}: original_max_position_embeddings must be at least 1, "
                          f"got {window}")
    return QueryScale(float(beta), int(window)) if float(beta) else None


def read_temperature_tuning(raw: dict[str, Any]) -> QueryScale | None:
    """Llama 4's factor of its NoPE layers' queries, where attn_temperature_tuning is on:
    1 + attn_scale * log(1 + floor((position + 1) / floor_scale))."""
    if not raw.get("attn_temperature_tuning"):
        return None
    window = int(raw["floor_scale"])
    if window < 1:
        raise ExportError(f"floor_scale must be at least 1, got {window}")
    return QueryScale(float(raw["attn_scale"]), window, offset=1, nope_only=True)
