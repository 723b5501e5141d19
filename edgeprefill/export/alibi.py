"""ALiBi (BLOOM, MPT, Falcon-RW): no positions in the stream; each head h adds slope_h *
(key position - query position) to its scaled attention scores, a penalty growing with
distance.

transformers adds slope_h * key position (BLOOM: counted from the row's first unpadded
token; MPT: key position - (keys - 1)); for one query those differ from the relative form
by a constant, which the softmax ignores. The relative form stays small near the
diagonal, so a long context rounds no worse than a short one.

transformers' Falcon (Falcon-RW) builds slope_h * key position in bfloat16: the slope and
the position each rounded to it, then their product, before it divides the bias by
sqrt(head_dim) with the scores. Past key position 256 that rounding is no constant per
query (bfloat16 keeps 8 significant bits), so its bias is computed as Falcon computes it.
"""

from __future__ import annotations

import math

import numpy as np

from edgeprefill.export.graph import GraphBuilder

# MPT's alibi_bias_max; BLOOM's slopes are the same numbers. transformers' MPT uses 8
# whatever its config says, so export refuses another value (families/dense.py).
BIAS_MAX = 8.0


def slopes(heads: int) -> tuple[float, ...]:
    """Each head's slope, as MPT's gen_slopes and transformers' BLOOM build_alibi_tensor
    compute them (float32): 2^(-8 k / n) for k = 1..n, n the power of two at or above
    `heads`; where `heads` is not a power of two, the odd k first, then the even ones, cut
    to `heads` (BLOOM: the power-of-two slopes below `heads`, then the odd ones between
    them). tests/test_alibi.py checks both against transformers."""
    n = 2 ** math.ceil(math.log2(heads))
    every = [2.0 ** (-BIAS_MAX * k / n) for k in range(1, n + 1)]
    if n != heads:
        every = (every[1::2] + every[0::2])[:heads]
    return tuple(float(np.float32(s)) for s in every)


def bias(g: GraphBuilder, head_slopes: tuple[float, ...], key_pos: str, query_pos: str,
         heads_shape: tuple[int, ...], dtype: np.dtype,
         bfloat16_scale: float | None = None) -> str:
    """The additive scores [B, *heads_shape, C, K]: slope_h * (key_pos - query_pos), with
    key_pos [K] and query_pos [B,C] int64, computed in float32 (as transformers builds its
    alibi tensor) and cast to `dtype`. `heads_shape` splits the heads as the scores do
    (the `standard` flavour's [KV, rep], GroupQueryAttention's [H]). With `bfloat16_scale`
    (Falcon-RW's scores scale), Falcon's bias instead (_bfloat16_bias)."""
    per_head = np.asarray(head_slopes, np.float32).reshape(1, *heads_shape, 1, 1)
    slopes = g.const(per_head, np.float32)
    heads_axes = g.const(list(range(1, 1 + len(heads_shape))))
    if bfloat16_scale is None:
        out = _distance_bias(g, slopes, key_pos, query_pos, heads_axes)
    else:
        out = _bfloat16_bias(g, slopes, key_pos, query_pos, heads_axes, bfloat16_scale)
    return out if np.dtype(dtype) == np.float32 else g.op("Cast", [out], to=10)


def _distance_bias(g: GraphBuilder, slopes: str, key_pos: str, query_pos: str,
                   heads_axes: str) -> str:
    distance = g.op("Sub", [g.op("Unsqueeze", [key_pos, g.const([0, 1])]),
                            g.op("Unsqueeze", [query_pos, g.const([2])])])  # [B,C,K]
    distance = g.op("Cast", [distance], to=1)
    return g.op("Mul", [g.op("Unsqueeze", [distance, heads_axes]), slopes])


def _bfloat16_bias(g: GraphBuilder, slopes: str, key_pos: str, query_pos: str,
                   heads_axes: str, scale: float) -> str:
    """Falcon's build_alibi_tensor, bf16(bf16(slope) * bf16(key position)), times the
    scores' scale (Falcon adds it before the scale), less its value at the query's own
    position: the softmax ignores that constant per query, and without it the bias stays
    small near the diagonal, as the relative form does. Both terms are bfloat16 numbers,
    so their float32 difference is exact. ONNX Runtime's Cast to bfloat16 rounds to
    nearest even, as torch does (tests/test_alibi.py)."""
    slopes = _bfloat16(g, slopes)
    keys = g.op("Unsqueeze", [key_pos, g.const([0, 1])])  # [1,1,K]
    queries = g.op("Unsqueeze", [query_pos, g.const([2])])  # [B,C,1]
    at_key, at_query = (
        _bfloat16(g, g.op("Mul", [g.op("Unsqueeze", [_bfloat16(g, pos), heads_axes]), slopes]))
        for pos in (keys, queries))
    return g.op("Mul", [g.op("Sub", [at_key, at_query]), g.const(scale, np.float32)])


def _bfloat16(g: GraphBuilder, x: str) -> str:
    """x (any number type) rounded to bfloat16, as float32."""
    return g.op("Cast", [g.op("Cast", [x], to=16)], to=1)
