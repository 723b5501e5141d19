"""ALiBi (BLOOM, MPT): no positions in the stream; each head h adds slope_h * (key position
- query position) to its scaled attention scores, a penalty growing with distance.

transformers adds slope_h * key position (BLOOM: counted from the row's first unpadded
token; MPT: key position - (keys - 1)); for one query those differ from the relative form
by a constant, which the softmax ignores. The relative form stays small near the
diagonal, so a long context rounds no worse than a short one.
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
         heads_shape: tuple[int, ...], dtype: np.dtype) -> str:
    """The additive scores [B, *heads_shape, C, K]: slope_h * (key_pos - query_pos), with
    key_pos [K] and query_pos [B,C] int64, computed in float32 (as transformers builds its
    alibi tensor) and cast to `dtype`. `heads_shape` splits the heads as the scores do
    (the `standard` flavour's [KV, rep], GroupQueryAttention's [H])."""
    distance = g.op("Sub", [g.op("Unsqueeze", [key_pos, g.const([0, 1])]),
                            g.op("Unsqueeze", [query_pos, g.const([2])])])  # [B,C,K]
    distance = g.op("Cast", [distance], to=1)
    per_head = np.asarray(head_slopes, np.float32).reshape(1, *heads_shape, 1, 1)
    heads_axes = list(range(1, 1 + len(heads_shape)))
    out = g.op("Mul", [g.op("Unsqueeze", [distance, g.const(heads_axes)]),
                       g.const(per_head, np.float32)])
    return out if np.dtype(dtype) == np.float32 else g.op("Cast", [out], to=10)
