"""xIELU, Apertus's activation (transformers' XIELUActivation, its Python form), with each
layer's learned alphas:

    alpha_p = softplus(alpha_p'),  alpha_n = beta + softplus(alpha_n')
    xielu(x) = alpha_p * x * x + beta * x                               where x > 0
               (expm1(min(x, eps)) - x) * alpha_n + beta * x            elsewhere

alpha_p' and alpha_n' are the module's parameters ([1] each), beta and eps its buffers
(0.5 and -1e-6 as initialized, where a checkpoint lacks them). The softplus is taken at
export, in float32 as transformers takes it; ONNX has no Expm1, so the graph takes
exp(m) - 1, whose rounding near m = 0 (at most a few 1e-8) is far below the tolerance the
bundle is held to.
"""

from __future__ import annotations

import numpy as np

from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.graph import GraphBuilder

DEFAULTS = {"beta": 0.5, "eps": -1e-6}  # XIELUActivation's


def softplus(x: np.ndarray) -> np.ndarray:
    """torch.nn.functional.softplus (beta 1, linear above 20), float32."""
    x = x.astype(np.float32)
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def xielu(g: GraphBuilder, ckpt: Checkpoint, x: str, module: str, dtype: np.dtype) -> str:
    """xIELU of `x` under the parameters of `module` (the activation's prefix, with a dot)."""
    def scalar(name: str, compute) -> str:
        return g.weight(module + name, (1,), dtype,
                        lambda: np.asarray(compute(), np.float32).reshape(1).astype(dtype))

    def stored(name: str) -> np.ndarray:
        key = module + name
        return ckpt.get(key) if ckpt.has(key) else np.float32(DEFAULTS[name])

    beta = scalar("beta", lambda: stored("beta"))
    alpha_p = scalar("alpha_p_softplus", lambda: softplus(ckpt.get(module + "alpha_p")))
    alpha_n = scalar("alpha_n_softplus", lambda: stored("beta") + softplus(
        ckpt.get(module + "alpha_n")))
    linear = g.op("Mul", [beta, x])
    positive = g.op("Add", [g.op("Mul", [g.op("Mul", [alpha_p, x]), x]), linear])
    low = g.op("Min", [x, scalar("eps", lambda: stored("eps"))])
    expm1 = g.op("Sub", [g.op("Exp", [low]), g.const(1.0, dtype)])
    negative = g.op("Add", [g.op("Mul", [g.op("Sub", [expm1, x]), alpha_n]), linear])
    return g.op("Where", [g.op("Greater", [x, g.const(0.0, dtype)]), positive, negative])
