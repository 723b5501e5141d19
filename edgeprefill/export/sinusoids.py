"""Fixed sinusoidal position tables, which no checkpoint stores: computed at export as
transformers computes them, and added to the tokens' embedding as a learned table is.

Both layouts put the sines of all frequencies first, then their cosines (not interleaved),
but their frequencies differ, so each family's table has its own function:
- XGLM (tensor2tensor's `get_embedding`): `width // 2` frequencies exp(-k ln(10000) /
  (half - 1)), from 1 down to exactly 1/10000; a zero column where width is odd; the row of
  pad_token_id all zeros.
- CTRL (`positional_encoding`): channel c's frequency 1 / 10000 ** (2 (c // 2) / width),
  sines of the even channels then cosines of the odd ones (an odd width has one sine more);
  no padding row.
"""

from __future__ import annotations

import math

import numpy as np


def xglm_sinusoids(rows: int, width: int, padding_row: int | None) -> np.ndarray:
    """[rows, width] float32: XGLM's table (XGLMSinusoidalPositionalEmbedding)."""
    half = width // 2
    step = math.log(10000) / (half - 1)
    # exp correctly rounded to float32: torch's float32 exp is within an ulp of it (numpy's
    # float32 exp differs from torch's on a third of the frequencies, this on one in 30-100;
    # an ulp off moves position 2048's angle by ~2e-4)
    exponents = np.arange(half, dtype=np.float32) * np.float32(-step)
    freqs = np.exp(exponents.astype(np.float64)).astype(np.float32)
    table = _sines_then_cosines(_angles(rows, freqs), half)
    if width % 2:
        table = np.concatenate([table, np.zeros((rows, 1), np.float32)], axis=1)
    if padding_row is not None and 0 <= padding_row < rows:
        table[padding_row] = 0.0
    return table


def ctrl_sinusoids(rows: int, width: int) -> np.ndarray:
    """[rows, width] float32: CTRL's table (modeling_ctrl.positional_encoding)."""
    pairs = np.arange(0, width, 2, dtype=np.float32)  # 2 (c // 2) of each even channel c
    # 1 / 10000 ** (pairs / width), each step rounded to float32 as torch's are
    freqs = (np.float32(1.0) / np.power(np.float32(10000.0), pairs / np.float32(width))
             ).astype(np.float32)
    return _sines_then_cosines(_angles(rows, freqs), width // 2)


def _angles(rows: int, freqs: np.ndarray) -> np.ndarray:
    """[rows, len(freqs)] float32: position times frequency, rounded as torch's float32."""
    return np.arange(rows, dtype=np.float32)[:, None] * freqs[None, :]


def _sines_then_cosines(angles: np.ndarray, cosines: int) -> np.ndarray:
    """The sines of all `angles`' columns, then the cosines of the first `cosines`: of the
    float32 angles taken exactly (float64), as torch's are to an ulp."""
    exact = angles.astype(np.float64)
    return np.concatenate([np.sin(exact), np.cos(exact[:, :cosines])],
                          axis=1).astype(np.float32)
