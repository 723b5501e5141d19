"""Hy4's hyper-connections (HYV4HyperConnection, HYV4HyperHead): the residual stream is
M streams of the hidden size, and each sublayer reads a mix of them and writes its output
back into every one of them by its own weight.

Before the first layer every stream is the token's embedding. Before each sublayer (the
attention, then the MLP), from the M streams flattened to one vector f [M * hidden]:

    mixes = (f @ fn^T) * rsqrt(mean(f^2) + rms_norm_eps)        [2M]
    pre   = sigmoid(mixes[:M] * scale[0] + base[:M]) + hc_eps   [M]
    post  = hc_magnitude * sigmoid(mixes[M:] * scale[1] + base[M:]) + hc_eps
    input = sum_m pre[m] * stream[m]                            [hidden] (then the norm)
    stream[m] += post[m] * output                               (the sublayer's output)

After the last layer a head mixes the streams into the one the final norm reads, as `pre`
above from its own hc_fn [M, M * hidden], hc_scale [1] and hc_base [M]. transformers
computes all of it in float32 whatever the model's dtype, and so does the bundle, its
weights float32 in every bundle (a few numbers per token that every stream hangs on).

The streams are one tensor [.., M * hidden] in the token layout of the stream ([B,C,..],
packed [1,T,..], or [B,..] once cut to each row's last token): flattened as the mixes
read them, so that every token gather works on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx.helper import np_dtype_to_tensor_dtype

from edgeprefill.errors import ExportError
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.weights import GraphWeights

# transformers' names of a layer's two connections (after its conversion mapping's renames
# of the Hub's hc_pre.hc_attn_layer.hc_fn, ...: families/hy_v4.py) and of the head's
ATTENTION, MLP = "attn_hc.", "ffn_hc."
HEAD = "model.hc_head."


@dataclass(frozen=True)
class HyperConfig:
    """HYV4Config's hc_* keys, and the epsilon of the streams' RMS (rms_norm_eps)."""

    streams: int  # hc_mult
    magnitude: float  # hc_magnitude: the post weights' sigmoid times this
    eps: float  # hc_eps: added to each pre and post weight
    norm_eps: float  # rms_norm_eps


def read_hyper(raw: dict[str, Any]) -> HyperConfig:
    cfg = HyperConfig(streams=int(raw["hc_mult"]), magnitude=float(raw["hc_magnitude"]),
                      eps=float(raw["hc_eps"]), norm_eps=float(raw["rms_norm_eps"]))
    if cfg.streams < 1:
        raise ExportError(f"config.json: hc_mult must be at least 1, got {cfg.streams}")
    return cfg


class HyperConnections:
    """Emits the streams' expansion, each sublayer's mix and write-back, and the head.
    `dtype` is the graph's: the streams are stored in it, computed on in float32."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, cfg: HyperConfig, hidden: int,
                 dtype: np.dtype) -> None:
        self.g, self.w, self.ckpt = g, w, w.ckpt
        self.cfg, self.hidden, self.dtype = cfg, hidden, dtype
        m = cfg.streams  # a checkpoint of other streams fails here, before any graph
        self._check([(HEAD + "hc_fn", (m, m * hidden)), (HEAD + "hc_scale", (1,)),
                     (HEAD + "hc_base", (m,))])

    def expand(self, x: str) -> str:
        """The embedding [.., hidden] as the first layer's streams [.., M * hidden]."""
        return self.g.op("Concat", [x] * self.cfg.streams, axis=-1)

    def mix(self, p: str, streams: str) -> tuple[str, str]:
        """(post [.., M] float32, the sublayer's input [.., hidden]) of connection `p`
        (a layer's prefix + ATTENTION or MLP)."""
        g, m = self.g, self.cfg.streams
        fn, scale, base = p + "fn", p + "scale", p + "base"
        self._check([(fn, (2 * m, m * self.hidden)), (scale, (2,)), (base, (2 * m,))])

        def factors() -> np.ndarray:  # each mix's scale, then what its sigmoid is times
            s = self.ckpt.get(scale, np.float32)
            return np.stack([np.repeat(s, m), np.repeat([1.0, self.cfg.magnitude], m)]
                            ).astype(np.float32)

        both = g.weight(p + "factors", (2, 2 * m), np.float32, factors)
        scales, magnitudes = g.op("Split", [both], 2, axis=0, num_outputs=2)
        logits = g.op("Add", [g.op("Mul", [self._mixes(streams, fn, 2 * m), scales]),
                              self._float(base)])
        weights = g.op("Add", [g.op("Mul", [g.op("Sigmoid", [logits]), magnitudes]),
                               g.const(self.cfg.eps, np.float32)])
        pre, post = g.op("Split", [weights], 2, axis=-1, num_outputs=2)
        return post, self._weighted_sum(pre, streams)

    def write_back(self, post: str, output: str, streams: str) -> str:
        """streams [.., M * hidden] plus post[m] [.., M] times the sublayer's output
        [.., hidden] in each stream m, in float32."""
        g = self.g
        spread = g.op("Mul", [g.op("Unsqueeze", [post, g.const([-1])]),
                              g.op("Unsqueeze", [self._to32(output), g.const([-2])])])
        flat = g.op("Reshape", [spread, self._shape_of(streams)])
        return self._back(g.op("Add", [flat, self._to32(streams)]))

    def head(self, streams: str) -> str:
        """The streams [.., M * hidden] mixed into the one the final norm reads."""
        g, m = self.g, self.cfg.streams
        fn, scale, base = HEAD + "hc_fn", HEAD + "hc_scale", HEAD + "hc_base"
        logits = g.op("Add", [g.op("Mul", [self._mixes(streams, fn, m), self._float(scale)]),
                              self._float(base)])
        pre = g.op("Add", [g.op("Sigmoid", [logits]), g.const(self.cfg.eps, np.float32)])
        return self._weighted_sum(pre, streams)

    def _mixes(self, streams: str, fn: str, width: int) -> str:
        """(streams @ fn^T) [.., width] times the streams' rsqrt(mean square + eps)."""
        g = self.g
        flat = self._to32(streams)
        weight = g.weight(fn + ".t", (self.cfg.streams * self.hidden, width), np.float32,
                          lambda: np.ascontiguousarray(self.ckpt.get(fn, np.float32).T))
        square = g.op("ReduceMean", [g.op("Mul", [flat, flat]), g.const([-1])], keepdims=1)
        inverse = g.op("Reciprocal", [g.op("Sqrt", [
            g.op("Add", [square, g.const(self.cfg.norm_eps, np.float32)])])])
        return g.op("Mul", [g.op("MatMul", [flat, weight]), inverse])

    def _weighted_sum(self, weights: str, streams: str) -> str:
        """sum_m weights[m] [.., M] times stream m -> [.., hidden], in the graph's dtype."""
        g, m = self.g, self.cfg.streams
        per_stream = g.op("Reshape", [self._to32(streams), self._shape_of(
            streams, [m, self.hidden])])
        total = g.op("ReduceSum", [g.op("Mul", [g.op("Unsqueeze", [weights, g.const([-1])]),
                                                per_stream]), g.const([-2])], keepdims=0)
        return self._back(total)

    def _shape_of(self, x: str, last: list[int] | None = None) -> str:
        """x's shape with its last axis replaced by `last` (kept where None)."""
        g = self.g
        if last is None:
            return g.op("Shape", [x])
        return g.op("Concat", [g.op("Shape", [x], end=-1), g.const(last)], axis=0)

    def _float(self, name: str) -> str:
        return self.g.weight(name, self.ckpt.shape(name), np.float32,
                             lambda: self.ckpt.get(name, np.float32))

    def _check(self, expected: list[tuple[str, tuple[int, ...]]]) -> None:
        """A checkpoint that disagrees with its config.json fails here, in one line."""
        self.w.check_shapes(expected, f"hc_mult {self.cfg.streams}, hidden {self.hidden}")

    def _to32(self, x: str) -> str:
        return x if self.dtype == np.float32 else self.g.op("Cast", [x], to=1)

    def _back(self, x: str) -> str:
        """A float32 result in the graph's dtype."""
        if self.dtype == np.float32:
            return x
        return self.g.op("Cast", [x], to=int(np_dtype_to_tensor_dtype(self.dtype)))

