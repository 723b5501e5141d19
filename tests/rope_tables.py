"""Comparing rotary and sinusoid tables ([positions, columns]) with transformers' own.

torch's float32 `pow` and `exp` round differently on different CPUs: on a Zen 4 (an
AVX-512 build of its vector math) `10000 ** (-2k / 64)` came out one ulp from the correctly
rounded frequency for 6 of 32 k, where on a Zen 3 (AVX2) every one matched ours. A frequency
one ulp off moves position p's angle by p ulps of it, so the tables drift apart linearly in
the position: at 4,096 positions by up to 5e-4, while a wrong frequency, factor or layout
moves them by O(1).
"""

from __future__ import annotations

import numpy as np

# One ulp of a frequency of at most 1 (rotary and sinusoid frequencies are theta ** -x).
FREQUENCY_ULP = float(np.spacing(np.float32(1.0)))


def assert_tables_close(ours: np.ndarray, theirs: np.ndarray, atol: float,
                        scale: float = 1.0) -> None:
    """|ours - theirs| within `atol` plus what an ulp of each frequency moves row p by (p
    ulps of its angle, times the table's `scale`, e.g. yarn's attention factor)."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    rows = np.arange(ours.shape[0], dtype=np.float64)[:, None]
    allowed = atol + rows * FREQUENCY_ULP * abs(scale)
    excess = np.abs(ours.astype(np.float64) - theirs.astype(np.float64)) - allowed
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (
        f"tables differ at {tuple(int(i) for i in worst)}: {ours[worst]} against "
        f"{theirs[worst]}, allowed {allowed[worst[0], 0]:.2e}")
