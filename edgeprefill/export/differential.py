"""DiffLlama's differential attention (FamilySpec.differential), as transformers'
DiffLlamaAttention computes it, over the ordinary KV cache.

transformers splits the KV heads' values in two halves, V1 = V[:KV/2] and V2 = V[KV/2:],
each repeated to KV heads, and attends with the same softmax P_h (query head h over its
KV head g = h // (H/KV)) twice: O_h = [P_h V[g mod KV/2] | P_h V[KV/2 + g mod KV/2]], 2D
wide. Then the first half of the heads minus lambda times the second half,
D_i = O_i - lambda O_{i + H/2} (i < H/2), each D_i RMS-normed over its 2D values without
weight, times 1 - lambda_init, and the H/2 pairs read as [H * D] by o_proj. lambda is
exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, a constant of the
layer's weights and depth (lambda_init = 0.8 - 0.6 exp(-0.3 layer)): computed at export.

The chunk graph attends twice over the one cache: once with its own values, A_h =
P_h V[g] (the call that writes the chunk's keys and values in place), once with the
values of the KV head half a cache away, B_h = P_h V[(g + KV/2) mod KV] (swapped(): the two
halves of the heads exchanged). The first half of the query heads has g < KV/2, so
O_h = [A_h | B_h] there and [B_h | A_h] in the second half, and

    D_i = [A_i - lambda B_{i + H/2} | B_i - lambda A_{i + H/2}]     (difference())

In the `ort` flavour the second GroupQueryAttention reads copies of the updated cache up to
the longest row (the values' halves swapped) and writes its own throwaway present: the
cache itself is written once, by the first. The `standard` flavour attends once over
[values | swapped values], 2D wide.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from edgeprefill.export.graph import GraphBuilder

if TYPE_CHECKING:
    from edgeprefill.export.flavors import Flavor

# The layer's lambda vectors (each [head_dim]), relative to the layer prefix, in the order
# lambda_full() takes them.
LAMBDAS = ("self_attn.lambda_q1", "self_attn.lambda_k1", "self_attn.lambda_q2",
           "self_attn.lambda_k2")


def lambda_init(layer: int) -> float:
    """transformers' lambda_init_fn: the layer's depth-dependent part of lambda."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def lambda_full(q1: np.ndarray, k1: np.ndarray, q2: np.ndarray, k2: np.ndarray,
                layer: int, dtype: np.dtype) -> np.ndarray:
    """lambda as transformers computes it in a model of `dtype`: each product in that
    dtype, summed in float32, exp'd, cast to it; then lambda_1 - lambda_2 + lambda_init."""
    def term(q: np.ndarray, k: np.ndarray) -> np.ndarray:
        dot = np.float32((q.astype(dtype) * k.astype(dtype)).astype(np.float64).sum())
        return np.exp(dot).astype(dtype)

    difference = np.float32(term(q1, k1) - term(q2, k2))
    return np.asarray(difference + np.float32(lambda_init(layer))).astype(dtype)


def swapped(g: GraphBuilder, x: str, axis: int) -> str:
    """x with the two halves of `axis` exchanged: over the KV heads' axis (or the last axis
    of [.., KV*D], whose halves are the heads'), head j's values become head
    (j + KV/2) mod KV's."""
    first, second = g.op("Split", [x], 2, axis=axis, num_outputs=2)
    return g.op("Concat", [second, first], axis=axis)


def difference(g: GraphBuilder, flavor: Flavor, own: str, other: str, heads: int,
               head_dim: int, lam: np.ndarray, layer: int) -> str:
    """The layer's differential output [.., H*D] from the attentions with the heads' own
    values `own` and the swapped ones `other` (each [.., H*D]): each pair's difference
    RMS-normed over its 2D values, times 1 - lambda_init (as the norm's weight)."""
    dtype = flavor.dtype
    per_head = g.const([0, 0, heads, head_dim])
    a1, a2 = g.op("Split", [g.op("Reshape", [own, per_head])], 2, axis=2, num_outputs=2)
    b1, b2 = g.op("Split", [g.op("Reshape", [other, per_head])], 2, axis=2, num_outputs=2)
    lam_c = g.const(lam, dtype)
    first = g.op("Sub", [a1, g.op("Mul", [lam_c, b2])])
    second = g.op("Sub", [b1, g.op("Mul", [lam_c, a2])])
    pairs = g.op("Concat", [first, second], axis=-1)  # [.., H/2, 2D]
    scale = g.const(np.full(2 * head_dim, 1.0 - lambda_init(layer)), dtype)
    normed = flavor.rms_norm(g, pairs, scale)
    return g.op("Reshape", [normed, g.const([0, 0, heads * head_dim])])
