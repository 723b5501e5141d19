"""Gemma 3n's activation sparsity: on the layers `activation_sparsity_pattern` names, an
MLP's gate keeps only what exceeds a gaussian quantile of its own values, per token.

transformers (Gemma3nTextMLP._gaussian_topk) takes the gate's mean and (population)
standard deviation over its width and cuts at mean + std * Phi^-1(sparsity), the
standard normal's quantile: relu(gate - cutoff). A sparsity of 0.95 keeps about the top
5% of a gaussian gate. The quantile is a constant of the layer, computed here in double
precision of the float32 target transformers hands its icdf, then rounded to float32.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from edgeprefill.export.graph import GraphBuilder


def sparse_gate(g: GraphBuilder, gate: str, sparsity: float, dtype: np.dtype) -> str:
    """relu(gate - (mean + std * Phi^-1(sparsity))) over the last axis of `gate`."""
    quantile = NormalDist().inv_cdf(float(np.float32(sparsity)))
    mean = g.op("ReduceMean", [gate, g.const([-1])], keepdims=1)
    centered = g.op("Sub", [gate, mean])
    variance = g.op("ReduceMean", [g.op("Mul", [centered, centered]), g.const([-1])],
                    keepdims=1)
    std = g.op("Sqrt", [variance])
    cutoff = g.op("Add", [mean, g.op("Mul", [std, g.const(quantile, dtype)])])
    return g.op("Relu", [g.op("Sub", [gate, cutoff])])
