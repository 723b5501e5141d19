"""Doge's dynamic mask attention (transformers' DogeAttention.prepare_dynamic_mask).

Each key gets a bias per KV head from its own value states (all KV heads' values of that
position, concatenated): exp(A * softplus(dt_proj(v))). The bias is added to the scaled
scores of every query head of that KV head, where the causal (or sliding) mask lets the
query see the key; masked keys stay at the dtype's minimum. Where the keys outnumber
`keep_window_size`, each query row keeps only its `keep_window_size` keys of the largest
masked bias (a TopK over the keys) and masks the rest.

The bias depends on nothing but the cached values, so no extra state is kept: each call
recomputes it from the value cache (one small projection of KV * head_dim to KV per key),
after the call's own values are written. A row's kept keys are those whose masked bias is
at least its `keep`-th largest (TopK's smallest value): transformers' TopK, except where a
row's bias ties exactly at that boundary (it then keeps one of the tied keys arbitrarily;
this keeps them all). A row with no more than `keep` visible keys keeps them all, as
transformers does whatever its key length: visible keys' biases are positive, masked
ones the minimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeprefill.export.graph import GraphBuilder


@dataclass(frozen=True)
class DynamicMask:
    """One layer's dynamic mask as graph values: dt_proj's weight [KV, KV*D] and bias [KV]
    (None: none), A [KV], and how many keys a query keeps (None: every visible key, where
    no call can have more keys than keep_window_size)."""

    weight: str
    bias: str | None
    a: str
    keep: int | None


def key_bias(g: GraphBuilder, values: str, mask: DynamicMask) -> str:
    """values [B, K, KV*D] (each key's values, all KV heads) -> the bias [B, KV, K]."""
    dt = g.op("MatMul", [values, g.op("Transpose", [mask.weight], perm=[1, 0])])
    if mask.bias is not None:
        dt = g.op("Add", [dt, mask.bias])
    dt = g.op("Exp", [g.op("Mul", [mask.a, g.op("Softplus", [dt])])])
    return g.op("Transpose", [dt], perm=[0, 2, 1])


def cache_bias(g: GraphBuilder, cache: str, mask: DynamicMask) -> str:
    """The bias [B, KV, K] of the keys whose values are `cache` [B, KV, K, D]."""
    tokens_first = g.op("Transpose", [cache], perm=[0, 2, 1, 3])  # [B,K,KV,D]
    flat = g.op("Reshape", [tokens_first, g.const([0, 0, -1])])
    return key_bias(g, flat, mask)


def masked(g: GraphBuilder, bias: str, additive_mask: str, keep: int | None,
           dtype: np.dtype) -> str:
    """The bias [..., C, K] of each query row's kept keys, the dtype's minimum elsewhere:
    `bias` where the step's additive mask is 0 (visible), the minimum where it is not (as
    transformers' masked_fill: in float16 a bias added to the minimum would move it),
    then, where `keep` is set, every key below the row's keep-th largest masked too."""
    blocked = g.const(float(np.finfo(dtype).min), dtype)
    visible = g.op("Equal", [additive_mask, g.const(0.0, dtype)])
    biased = g.op("Where", [visible, bias, blocked])
    if keep is None:
        return biased
    keys = g.op("Shape", [biased], start=-1)  # [1]: K
    count = g.op("Min", [keys, g.const([keep])])
    largest, _ = g.op("TopK", [biased, count], 2, axis=-1, largest=1, sorted=0)
    threshold = g.op("ReduceMin", [largest, g.const([-1])], keepdims=1)
    kept = g.op("GreaterOrEqual", [biased, threshold])
    return g.op("Where", [kept, biased, blocked])
