"""Fixed sinusoidal position encodings (CTRL's `positional_encoding`), which its
checkpoints do not store: the table is computed at export and added as a learned one is."""

from __future__ import annotations

import numpy as np


def sinusoid_table(rows: int, width: int) -> np.ndarray:
    """[rows, width] float32: the sines of the even channels' angles, then the cosines of
    the odd ones' (CTRL concatenates the halves rather than interleaving them). The angles
    are rounded to float32 as transformers computes them, then turned in float64."""
    channel = np.arange(width, dtype=np.float32)
    rates = (1.0 / np.power(np.float32(10000.0),
                            (2 * (channel // 2)) / np.float32(width))).astype(np.float32)
    angles = (np.arange(rows, dtype=np.float32)[:, None] * rates[None, :]).astype(np.float32)
    angles64 = angles.astype(np.float64)
    table = np.concatenate([np.sin(angles64[:, 0::2]), np.cos(angles64[:, 1::2])], axis=-1)
    return table.astype(np.float32)
