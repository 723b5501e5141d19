"""ZAYA's compressed convolutional attention (CCA): its q/k/v before attention, as plain
ONNX ops, with the two states it carries across calls.

transformers' ZayaCCAProjection, for a layer's normed input h (per token):

  q, k     q_proj(h) [H*D], k_proj(h) [KV*D]
  residual qr_h = (q_h + k_{g(h)}) / 2 per query head (g(h) its KV head, as repeat_kv);
           kr_j = the mean of qr over KV head j's group
  conv     q|k concatenated ([H*D + KV*D] channels) through two causal convolutions over
           time: a depthwise one of `cca_time0` taps, then one grouped per head (H + KV
           groups of D channels) of `cca_time1` taps, both with biases
  q, k     the convolution's q part + qr, its k part + kr
  v        v_proj_current(h) [KV*D/2] beside v_proj_delayed of the token before [KV*D/2],
           concatenated and read as KV heads of D (the first call's token 0 reads
           v_proj_delayed of zeros: its bias)

Across calls it keeps the raw q|k of the last `cca_time0 + cca_time1 - 2` tokens (the two
convolutions' window, `past_conv.{i}` [B, H*D + KV*D, width]: causal_conv.py's layout and
rules) and the last token's v_proj_delayed (`past_recurrent.{i}` [B, KV*D/2], the model's
dtype). Both read as a fresh sequence's where past_lens is 0, and end at each row's last
valid token, so chunk boundaries and padding change nothing. transformers' ZayaQKNorm
follows (each q and k head scaled to length sqrt(D), k times its KV head's `temp`); the
graph's attention then rotates and attends as any layer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeprefill.contract import BATCH, CONV, RECURRENT, StateNames, state_names
from edgeprefill.errors import ExportError
from edgeprefill.export.causal_conv import CausalConv
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.tokens import PackedTokens, PaddedTokens
from edgeprefill.export.weights import GraphWeights

PREFIX = "self_attn.qkv_proj."  # the projection's modules under a layer's prefix
StateSpec = tuple[StateNames, np.dtype, list]  # names, dtype, shape of one state


@dataclass(frozen=True)
class CcaShape:
    """The two convolutions' widths in tokens (cca_time0, cca_time1)."""

    depthwise: int
    grouped: int

    @property
    def width(self) -> int:
        """The raw q|k tokens a call needs from before it: the convolutions' window."""
        return self.depthwise + self.grouped - 2


def read_cca(raw: dict[str, Any]) -> CcaShape:
    """`cca_time0` and `cca_time1` (ZayaConfig's defaults where absent: the family's)."""
    shape = CcaShape(int(raw["cca_time0"]), int(raw["cca_time1"]))
    # (transformers' projection keeps q|k[-0:], every token, as its state at a width of 0)
    if shape.depthwise < 1 or shape.grouped < 1 or shape.width < 1:
        raise ExportError(f"cca_time0 and cca_time1 must be at least 1 and sum to at least 3, "
                          f"got {shape.depthwise} and {shape.grouped}")
    return shape


class CcaProjection:
    """Emits each layer's q, k and v [B, C, ...] (every row's tokens at their positions)."""

    def __init__(self, g: GraphBuilder, w: GraphWeights, shape: CcaShape, hidden: int,
                 heads: int, kv_heads: int, head_dim: int,
                 tokens: PaddedTokens | PackedTokens, conv: CausalConv) -> None:
        self.g, self.w, self.shape, self.tokens, self.conv = g, w, shape, tokens, conv
        self.hidden, self.heads, self.kv_heads, self.head_dim = hidden, heads, kv_heads, head_dim
        self.channels = (heads + kv_heads) * head_dim
        self.half = kv_heads * head_dim // 2  # each of the two value projections' width

    def states(self, layer: int) -> list[StateSpec]:
        """The layer's state tensors, as the graph declares them."""
        return [(state_names(layer, CONV), self.w.dtype,
                 [BATCH, self.channels, self.shape.width]),
                (state_names(layer, RECURRENT), self.w.dtype, [BATCH, self.half])]

    def qkv(self, p: str, h: str, layer: int, bias: bool) -> tuple[str, str, str]:
        """q [B,C,H*D], k and v [B,C,KV*D] of layer prefix `p` on its normed input `h`;
        reads and writes the layer's states. `bias`: the projections' (attention_bias)."""
        g, w = self.g, self.w
        m = p + PREFIX
        self._check_shapes(m)
        projections = ["q_proj", "k_proj"]
        qk = self.tokens.spread(w.linear(h, [m + n + ".weight" for n in projections],
                                         m + "q_proj.bias.packed" if bias else None))
        q_size = self.heads * self.head_dim
        q, k = g.op("Split", [qk, g.const([q_size, self.channels - q_size])], 2, axis=-1)
        q_res, k_res = self._residuals(q, k)
        conv = state_names(layer, CONV)
        full = self.conv.full(conv.past, qk)
        self.conv.store(full, conv.present, self.shape.width, self.channels)
        mixed = self._grouped(m, self._depthwise(m, full))  # [B, C, channels]
        q_conv, k_conv = g.op("Split", [mixed, g.const([q_size, self.channels - q_size])], 2,
                              axis=-1)
        q = g.op("Add", [q_conv, q_res])
        k = g.op("Add", [k_conv, k_res])
        return q, k, self._values(m, h, layer, bias)

    def _residuals(self, q: str, k: str) -> tuple[str, str]:
        """(q + its KV head's k) / 2 per query head, and its mean over each KV group."""
        g, kv, d = self.g, self.kv_heads, self.head_dim
        groups = self.heads // kv
        per_group = g.op("Reshape", [q, g.const([0, 0, kv, groups, d])])
        keys = g.op("Reshape", [k, g.const([0, 0, kv, 1, d])])
        q_res = g.op("Mul", [g.op("Add", [per_group, keys]), g.const(0.5, self.w.dtype)])
        k_res = g.op("ReduceMean", [q_res, g.const([3])], keepdims=0)  # [B, C, KV, D]
        return (g.op("Reshape", [q_res, g.const([0, 0, self.heads * d])]),
                g.op("Reshape", [k_res, g.const([0, 0, kv * d])]))

    def _depthwise(self, m: str, full: str) -> str:
        """[B, C + cca_time1 - 1, channels]: the depthwise convolution of the raw q|k."""
        name, kernel = m + "conv_qk_depthwise", self.shape.depthwise
        taps = self.conv.taps(name + ".weight", kernel, self.channels,
                              lambda n: self.w.ckpt.get(n, np.float32))
        return self.conv.convolve(full, taps, kernel, self.w.tensor(name + ".bias"))

    def _grouped(self, m: str, x: str) -> str:
        """[B, C, channels]: the grouped convolution (per head, D channels in and out) of
        the depthwise one's output x, one MatMul per tap over each head's channels."""
        g, d, kernel = self.g, self.head_dim, self.shape.grouped
        groups = self.heads + self.kv_heads
        name = m + "conv_qk_grouped"
        stored = name + ".weight"  # [channels out, D in, taps]
        taps = g.weight(stored + ".per_head", (kernel, groups, d, d), self.w.dtype,
                        lambda: np.ascontiguousarray(self.w.ckpt.get(stored, np.float32)
                                                     .reshape(groups, d, d, kernel)
                                                     .transpose(3, 0, 2, 1))
                        .astype(self.w.dtype))  # [tap, group, in, out]
        per_head = g.op("Unsqueeze", [g.op("Reshape", [x, g.const([0, 0, groups, d])]),
                                      g.const([3])])  # [B, L, G, 1, D]
        weights = g.op("Split", [taps], kernel, axis=0, num_outputs=kernel)
        weights = [weights] if kernel == 1 else weights
        big = np.iinfo(np.int64).max
        terms = []
        for k, weight in enumerate(weights):
            end = k - (kernel - 1) if k < kernel - 1 else big
            part = g.op("Slice", [per_head, g.const([k]), g.const([end]), g.const([1])])
            terms.append(g.op("MatMul", [part, g.op("Squeeze", [weight, g.const([0])])]))
        summed = g.op("Reshape", [g.op("Sum", terms), g.const([0, 0, self.channels])])
        return g.op("Add", [summed, self.w.tensor(name + ".bias")])

    def _values(self, m: str, h: str, layer: int, bias: bool) -> str:
        """v [B, C, KV*D]: each token's current half beside the token before's delayed half;
        the state is the last valid token's delayed half."""
        g, w = self.g, self.w
        names = [m + "v_proj_current", m + "v_proj_delayed"]
        both = self.tokens.spread(w.linear(h, [n + ".weight" for n in names],
                                           names[0] + ".bias.packed" if bias else None))
        current, delayed = g.op("Split", [both], 2, axis=-1, num_outputs=2)
        state = state_names(layer, RECURRENT)
        # A fresh sequence's token 0 reads v_proj_delayed(0): its bias, or zeros.
        fresh = w.tensor(names[1] + ".bias") if bias else g.const(0.0, w.dtype)
        before = g.op("Where", [g.op("Squeeze", [self.conv.continues, g.const([2])]),
                                state.past, fresh])  # [B, KV*D/2]
        full = g.op("Concat", [g.op("Unsqueeze", [before, g.const([1])]), delayed], axis=1)
        index = g.op("Expand", [g.op("Unsqueeze", [self.conv.valid, g.const([2])]),
                                g.const([1, 1, self.half])])  # [B, 1, KV*D/2]
        g.op("Squeeze", [g.op("GatherElements", [full, index], axis=1), g.const([1])],
             [state.present])
        shifted = g.op("Slice", [full, g.const([0]), g.const([-1]), g.const([1])])
        return g.op("Concat", [current, shifted], axis=-1)

    def _check_shapes(self, m: str) -> None:
        """A checkpoint that disagrees with config.json fails here in one line."""
        d, hidden = self.head_dim, self.hidden
        expected = [(m + "q_proj.weight", (self.heads * d, hidden)),
                    (m + "k_proj.weight", (self.kv_heads * d, hidden)),
                    (m + "v_proj_current.weight", (self.half, hidden)),
                    (m + "v_proj_delayed.weight", (self.half, hidden)),
                    (m + "conv_qk_depthwise.weight", (self.channels, 1, self.shape.depthwise)),
                    (m + "conv_qk_grouped.weight", (self.channels, d, self.shape.grouped))]
        self.w.check_shapes(expected, f"{self.heads} heads, {self.kv_heads} KV heads of {d}, "
                                      f"hidden {hidden}, cca_time0 {self.shape.depthwise}, "
                                      f"cca_time1 {self.shape.grouped}")


def qk_normed(g: GraphBuilder, x: str, heads: int, head_dim: int, dtype: np.dtype,
              temp: str | None = None) -> str:
    """ZayaQKNorm of x [.., heads*D]: each head times sqrt(D) / max(its L2 norm, the dtype's
    epsilon), then times its `temp` [heads] where given (the keys')."""
    per_head = g.op("Reshape", [x, g.const([0, 0, heads, head_dim])])
    length = g.op("Sqrt", [g.op("ReduceSum", [g.op("Mul", [per_head, per_head]),
                                             g.const([-1])], keepdims=1)])
    factor = g.op("Div", [g.const(head_dim ** 0.5, dtype),
                          g.op("Max", [length, g.const(float(np.finfo(dtype).eps), dtype)])])
    normed = g.op("Mul", [per_head, factor])
    if temp is not None:
        normed = g.op("Mul", [normed, g.op("Unsqueeze", [temp, g.const([-1])])])
    return g.op("Reshape", [normed, g.const([0, 0, heads * head_dim])])
