"""Gemma 3n's AltUp (alternating updates): the residual stream is N streams of the hidden
size, and a layer runs on one of them (the active one) while the others follow it.

Before the first layer the streams are the scaled embedding and N-1 projections of it,
each rescaled to the embedding's RMS. Each layer first *predicts* every stream as a mix
of all of them (coefficients per token from a router: tanh of a projection of the normed
active stream), runs its attention and MLP on the predicted active stream, then
*corrects* every stream by the layer's change to the active one (another set of
coefficients from the router on the layer's output). After the last layer the other
streams are projected back ("unembedded"), rescaled to the active one's RMS, and the N
averaged into the stream the final norm reads.

The streams are one tensor [.., N, hidden] in the token layout of the stream ([B,C,..],
packed [1,T,..], or [B,..] once cut to each row's last token), so a prediction is one
MatMul of the [.., N, N] coefficients and the streams, and nothing is transposed.
The router's and the coefficients' small matrices ([N, hidden], [N*N, N], [N, N]) stay
float in every bundle: they are a few numbers per token that every stream's mix hangs on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.weights import GraphWeights

PROJECTIONS = "model.altup_projections.{j}.weight"
UNEMBED = "model.altup_unembed_projections.{j}.weight"
MIN_SQUARE = 1e-5  # the projections' mean square is clamped here before its root

Norm = Callable[[str, str], str]  # (x, module name) -> the family's norm of x


@dataclass(frozen=True)
class AltUpConfig:
    """The altup_* keys of Gemma3nTextConfig."""

    streams: int  # altup_num_inputs
    active: int  # altup_active_idx: the stream the layers run on
    correct_scale: bool  # altup_correct_scale: the active stream times correct_output_scale
    #   before it feeds the per-layer input


def read_altup(raw: dict[str, Any]) -> AltUpConfig:
    streams, active = int(raw["altup_num_inputs"]), int(raw["altup_active_idx"])
    if streams < 2 or not 0 <= active < streams:
        raise ValueError(f"altup_num_inputs must be at least 2 and altup_active_idx one of "
                         f"its streams, got {streams} and {active}")
    return AltUpConfig(streams, active, bool(raw["altup_correct_scale"]))


class AltUp:
    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: AltUpConfig, hidden: int,
                 norm: Norm) -> None:
        self.g, self.w, self.cfg, self.hidden, self.norm = g, w, cfg, hidden, norm

    def expand(self, x: str) -> str:
        """The streams [.., N, H] before the first layer, from the scaled embedding [.., H]."""
        g, n = self.g, self.cfg.streams
        names = [PROJECTIONS.format(j=j) for j in range(n - 1)]
        projected = self.w.linear(x, names, None)  # [.., (N-1)*H], one MatMul
        shape = g.op("Concat", [g.op("Shape", [x], end=-1), g.const([n - 1, self.hidden])],
                     axis=0)
        projected = g.op("Reshape", [projected, shape])
        target = g.op("Unsqueeze", [self._rms(x), g.const([-1])])  # [.., 1, 1]
        rescaled = self._rescaled(projected, target)
        return g.op("Concat", [g.op("Unsqueeze", [x, g.const([-2])]), rescaled], axis=-2)

    def collapse(self, streams: str) -> str:
        """The stream [.., H] the final norm reads: the mean of the active stream and the
        others unembedded, each rescaled to the active stream's RMS."""
        g, n = self.g, self.cfg.streams
        first = self.stream(streams, 0)
        target = self._rms(first)  # [.., 1]
        parts = [g.op("Unsqueeze", [first, g.const([-2])])]
        for j in range(1, n):
            unembedded = self.w.linear(self.stream(streams, j), [UNEMBED.format(j=j - 1)], None)
            parts.append(g.op("Unsqueeze", [self._rescaled(unembedded, target), g.const([-2])]))
        return g.op("ReduceMean", [g.op("Concat", parts, axis=-2), g.const([-2])], keepdims=0)

    def predict(self, p: str, streams: str) -> str:
        """Every stream as its layer's coefficients mix them, plus itself: [.., N, H]."""
        g, n = self.g, self.cfg.streams
        modalities = self._router(p, self.active(streams))
        coefs = self._small(modalities, p + "altup.prediction_coefs.weight")  # [.., N*N]
        shape = g.op("Concat", [g.op("Shape", [coefs], end=-1), g.const([n, n])], axis=0)
        mixed = g.op("MatMul", [g.op("Reshape", [coefs, shape]), streams])  # row i: out i
        return g.op("Add", [mixed, streams])

    def correct(self, p: str, predictions: str, activated: str) -> str:
        """The predictions moved by the layer's change to the active stream (`activated`,
        the layer's output [.., H]), each stream by its own coefficient: [.., N, H]."""
        g = self.g
        innovation = g.op("Sub", [activated, self.active(predictions)])
        coefs = self._small(self._router(p, activated), p + "altup.correction_coefs.weight")
        coefs = g.op("Add", [coefs, g.const(1.0, self.w.dtype)])  # [.., N]
        moved = g.op("Mul", [g.op("Unsqueeze", [innovation, g.const([-2])]),
                             g.op("Unsqueeze", [coefs, g.const([-1])])])
        return g.op("Add", [moved, predictions])

    def scaled_active(self, p: str, corrected: str) -> str:
        """The corrected active stream [.., H] as the per-layer input's gate reads it."""
        active = self.active(corrected)
        if not self.cfg.correct_scale:
            return active
        return self.g.op("Mul", [active, self.w.tensor(p + "altup.correct_output_scale")])

    def add_to_others(self, streams: str, y: str) -> str:
        """`y` [.., H] added to every stream but the first (transformers' `[1:] +=`)."""
        g, n = self.g, self.cfg.streams
        first, rest = g.op("Split", [streams, g.const([1, n - 1])], 2, axis=-2)
        rest = g.op("Add", [rest, g.op("Unsqueeze", [y, g.const([-2])])])
        return g.op("Concat", [first, rest], axis=-2)

    def active(self, streams: str) -> str:
        return self.stream(streams, self.cfg.active)

    def stream(self, streams: str, j: int) -> str:
        return self.g.op("Gather", [streams, self.g.const(j)], axis=-2)

    def _router(self, p: str, x: str) -> str:
        """tanh(modality_router(router_norm(x) / hidden)): [.., N]."""
        g = self.g
        normed = self.norm(x, p + "altup.router_norm")
        scaled = g.op("Mul", [normed, g.const(self.hidden ** -1.0, self.w.dtype)])
        return g.op("Tanh", [self._small(scaled, p + "altup.modality_router.weight")])

    def _small(self, x: str, name: str) -> str:
        """x @ W^T for one of the small matrices, float in every bundle."""
        out_dim, in_dim = self.w.shape(name)
        dtype = self.w.dtype

        def produce() -> np.ndarray:
            return np.ascontiguousarray(self.w.ckpt.get(name, np.float32).T.astype(dtype))

        return self.g.op("MatMul", [x, self.g.weight(name, (in_dim, out_dim), dtype, produce)])

    def _rms(self, x: str) -> str:
        """sqrt(mean(x^2)) over the last axis, kept: [.., 1]."""
        g = self.g
        return g.op("Sqrt", [g.op("ReduceMean", [g.op("Mul", [x, x]), g.const([-1])],
                                  keepdims=1)])

    def _rescaled(self, x: str, target: str) -> str:
        """x * target / rms(x), the root's square clamped at MIN_SQUARE (as transformers)."""
        g = self.g
        square = g.op("ReduceMean", [g.op("Mul", [x, x]), g.const([-1])], keepdims=1)
        rms = g.op("Sqrt", [g.op("Max", [square, g.const(MIN_SQUARE, self.w.dtype)])])
        return g.op("Div", [g.op("Mul", [x, target]), rms])
