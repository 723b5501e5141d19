"""MXFP4 expert weights (gpt-oss's Hub checkpoints), read back to float as transformers
dequantizes them.

A weight [out, in] is stored as `{name}_blocks` [..., out, in / 32, 16] uint8 and
`{name}_scales` [..., out, in / 32] uint8: each block of 32 inputs is 16 bytes of two FP4
(E2M1) codes, the low nibble first, and one E8M0 exponent (scale - 127) for the block.
transformers' `convert_moe_packed_tensors` (integrations/mxfp4.py) looks each code up in
FP4_VALUES and multiplies by 2^exponent (`ldexp`), then transposes the expert's matrix to
its module's [in, out]; export keeps nn.Linear's [out, in]. Every value is a code times a
power of two, so float32 holds it exactly (as transformers' bf16 does).
"""

from __future__ import annotations

import numpy as np

BLOCK = 32  # weights per scale
FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
BLOCKS, SCALES = "_blocks", "_scales"


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., rows, G, 16] uint8 codes and [..., rows, G] uint8 exponents -> [..., rows,
    G * 32] float32."""
    blocks = blocks.astype(np.uint8, copy=False)
    values = np.empty((*blocks.shape[:-1], 2 * blocks.shape[-1]), np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    exponent = scales.astype(np.int32) - 127
    values = np.ldexp(values, exponent[..., None]).astype(np.float32)
    return values.reshape(*values.shape[:-2], -1)


def stored_shapes(experts: int, rows: int, cols: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The blocks' and scales' shapes of `experts` weights [rows, cols]."""
    groups = cols // BLOCK
    return (experts, rows, groups, BLOCK // 2), (experts, rows, groups)
