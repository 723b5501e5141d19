"""Chameleon's q/k norm (FamilySpec.qk_norm "head_affine"): each head of q or k
LayerNorm-ed over its own head_dim values, then times that head's own weight plus that
head's own bias ([heads, head_dim] each).

ChameleonLayerNorm keeps the statistics per head but the affine per head and channel:
Chameleon's model-parallel shards each trained their own q/k norm, and transformers' copy
repeats each shard's over its heads. Its epsilon is 1e-5, fixed in the module whatever
rms_norm_eps says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgeprefill.export.graph import GraphBuilder

if TYPE_CHECKING:
    from edgeprefill.export.flavors import Flavor

# ChameleonLayerNorm's F.layer_norm(..., eps=1e-5)
HEAD_AFFINE_EPS = 1e-5


def head_affine_norm(g: GraphBuilder, flavor: Flavor, x: str, heads: int, head_dim: int,
                     weight: str, bias: str) -> str:
    """x [.., heads * head_dim] (q or k, before rotary) normed per head at HEAD_AFFINE_EPS;
    `weight` and `bias` [heads, head_dim]."""
    per_head = g.op("Reshape", [x, g.const([0, 0, heads, head_dim])])
    ones = g.const(np.ones(head_dim), flavor.dtype)
    normed = flavor.layer_norm(g, per_head, ones, None, HEAD_AFFINE_EPS)  # statistics only
    affine = g.op("Add", [g.op("Mul", [normed, weight]), bias])
    return g.op("Reshape", [affine, g.const([0, 0, heads * head_dim])])
