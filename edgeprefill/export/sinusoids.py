"""XGLM's fixed sinusoidal position table (tensor2tensor's layout), computed at export as
transformers computes it (XGLMSinusoidalPositionalEmbedding.get_embedding)."""

from __future__ import annotations

import math

import numpy as np


def sinusoids(rows: int, width: int, padding_row: int | None) -> np.ndarray:
    """[rows, width] float32: row p is sin(p * f) | cos(p * f) over `width // 2`
    frequencies from 1 down to 1/10000 (a zero column after them where width is odd), and
    the row `padding_row` all zeros. In float32 throughout, as torch's default dtype."""
    half = width // 2
    step = math.log(10000) / (half - 1)
    # exp correctly rounded to float32: torch's float32 exp is within an ulp of it (numpy's
    # float32 exp differs from torch's on a third of the frequencies, this on one in 30-100;
    # an ulp off moves position 2048's angle by ~2e-4)
    exponents = np.arange(half, dtype=np.float32) * np.float32(-step)
    freqs = np.exp(exponents.astype(np.float64)).astype(np.float32)
    angles = np.arange(rows, dtype=np.float32)[:, None] * freqs[None, :]
    # sin and cos of the float32 angles taken exactly (float64), as torch's are to an ulp
    exact = angles.astype(np.float64)
    table = np.concatenate([np.sin(exact), np.cos(exact)], axis=1).astype(np.float32)
    if width % 2:
        table = np.concatenate([table, np.zeros((rows, 1), np.float32)], axis=1)
    if padding_row is not None and 0 <= padding_row < rows:
        table[padding_row] = 0.0
    return table
