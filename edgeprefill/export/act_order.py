"""Act-order int4 layers (GPTQ `desc_act`, compressed-tensors `actorder: group`), made plain.

GPTQ quantizes a layer's input columns in the order of its Hessian's diagonal (largest
first) and groups them in that order, then stores the codes back in the input order with
`g_idx[k]`, the group of input k: GPTQModel and AutoGPTQ (`quantization/gptq.py`) set
g_idx = invperm // group_size, llm-compressor (`gptq_quantize.py`, actorder "group") the
same; "weight" actorder, and `static_groups`, store the plain k // group_size. ONNX
Runtime's MatMulNBits takes a g_idx input, but its CPU kernel (1.32) computes other numbers
with a permuted one (measured: off by the outputs' own size at accuracy levels 0 and 4).

So export permutes the inputs instead: an order P with g_idx[P] = j // group_size (a stable
argsort of g_idx) makes each group contiguous, the codes taken in that order (`codes[:, P]`)
are a plain grouped int4 matrix with the checkpoint's own scales and zero points, and the
graph gathers the activations' last axis by P before the MatMulNBits (export/weights.py):
x[..., P] @ W[:, P]^T = x @ W^T, exactly the same products in another order.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export.int4_layouts import Int4Weight


def input_order(module: str, g_idx: np.ndarray, group_size: int,
                inputs: int) -> np.ndarray | None:
    """The order P (int64 [inputs]) that makes `module`'s groups contiguous, or None where
    the g_idx is already the plain k // group_size. Groups of other sizes than the plain
    ones (every group group_size inputs, the last one the rest) are refused."""
    if g_idx.shape != (inputs,):
        raise ExportError(f"{module} has a g_idx of shape {list(g_idx.shape)} for a weight "
                          f"of {inputs} inputs")
    plain = np.arange(inputs) // group_size
    if np.array_equal(g_idx, plain):
        return None
    order = np.argsort(g_idx, kind="stable")
    if not np.array_equal(g_idx[order], plain):
        raise ExportError(f"{module}'s g_idx gives groups other than {group_size} inputs "
                          "each, which MatMulNBits' blocks cannot hold")
    return order


def in_order(weight: Int4Weight, order: np.ndarray | None) -> Int4Weight:
    """`weight` (codes in the input order) with its codes' columns taken in `order`."""
    if order is None:
        return weight
    return replace(weight, codes=np.ascontiguousarray(weight.codes[:, order]), order=order)
