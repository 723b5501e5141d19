"""Muse Spark's residual gates (MuseSparkResidualGate): each residual add of its layers is
a * x + b * sublayer per channel, with w = gate / temperature, b = sigmoid(w) and
a = sqrt(max(sigmoid(-w) (1 + b), 1e-3)). Both factors depend on the stored gate alone, so
export computes them once (in float32, as the model keeps its gates) and the graph
multiplies by them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeprefill.export.checkpoint import Checkpoint

EPS = 1e-3  # MuseSparkResidualGate's residual_gate_eps: the floor under a's square


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) of a large -x is inf: sigmoid 0, as torch's
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def factors(gate: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of a stored gate [hidden], float32."""
    w = gate.astype(np.float32) / np.float32(temperature)
    b = _sigmoid(w)
    a = np.sqrt(np.maximum(_sigmoid(-w) * (1.0 + b), np.float32(EPS)))
    return a.astype(np.float32), b


def residual_gate_factors(ckpt: Checkpoint, name: str, temperature: float, dtype: np.dtype,
                          ) -> tuple[tuple[str, Callable[[], np.ndarray]], ...]:
    """The readers of the factors a ("residual") and b ("sublayer") of the gate `name`,
    each read when the writer asks."""
    def part(i: int) -> Callable[[], np.ndarray]:
        return lambda: factors(ckpt.get(name, np.float32), temperature)[i].astype(dtype)
    return ("residual", part(0)), ("sublayer", part(1))
