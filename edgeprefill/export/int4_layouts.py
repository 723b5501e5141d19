"""How GPTQ, AWQ and compressed-tensors pack a 4-bit linear layer, unpacked to one form.

Each format stores, per linear layer of weight W [out, in], 4-bit codes q, one scale s and
one zero point z per group of `group_size` inputs, and dequantizes W[n, k] = (q[n, k] -
z[n, g(k)]) * s[n, g(k)] with g(k) = k // group_size (act-order: g(k) = g_idx[k], made
plain by export/act_order.py). They differ only in how the codes and zero points are laid
into int32 words; every function here returns them as an `Int4Weight`
of codes and zero points 0..15, the form MatMulNBits takes (export/prequantized.py).

Read from the reference code (the layouts are nowhere else written down):
- GPTQ: AutoGPTQ `nn_modules/qlinear/qlinear_cuda_old.py` and GPTQModel
  `nn_modules/qlinear/__init__.py` (`pack`, `dequantize_weight`), `utils/model.py`
  (`convert_gptq_v1_to_v2_format`); transformers `integrations` defer to them.
- AWQ: AutoAWQ `awq/utils/packing_utils.py` (`AWQ_ORDER`, `AWQ_REVERSE_ORDER`,
  `unpack_awq`, `reverse_awq_order`) and `modules/linear/gemm.py` (`WQLinear_GEMM.from_linear`).
- compressed-tensors: `compressors/pack_quantized/helpers.py` (`pack_to_int32`,
  `unpack_from_int32`) and `compressors/pack_quantized/base.py` (`compress`: the zero
  point packed along the output axis, `packed_dim=0`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeprefill.errors import ExportError

NIBBLES = 8  # 4-bit values per int32 word
SHIFTS = np.arange(NIBBLES, dtype=np.uint32) * 4  # nibble t of a word: bits 4t..4t+3
# AWQ's GEMM packing: nibble t of a word holds column 8c + AWQ_ORDER[t] of its 8 columns
# (the order its CUDA kernel's dequantization reads them in).
AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])


@dataclass(frozen=True)
class Int4Weight:
    """One linear layer's 4-bit weight: W[n, order[j]] = (codes[n, j] - zeros[n, j //
    group_size]) * scales[n, j // group_size], `order` the identity unless act-order
    (export/act_order.py) stored the groups' inputs scattered."""

    codes: np.ndarray  # uint8 [out, in], 0..15
    scales: np.ndarray  # float32 [out, groups] (a float16/bfloat16 scale widens exactly)
    zeros: np.ndarray  # uint8 [out, groups], 0..15
    group_size: int
    order: np.ndarray | None = None  # int64 [in]: the input of codes' column j; None: j

    def dequantize(self) -> np.ndarray:
        """W [out, in] float32: exact, as (code - zero) is an integer of -15..15 and each
        scale has at most 11 significant bits (float16; bfloat16 8), so the product fits
        float32's 24 (a float16 or bfloat16 product would round)."""
        cols = self.codes.shape[1]
        scales = np.repeat(self.scales, self.group_size, axis=1)[:, :cols]
        zeros = np.repeat(self.zeros, self.group_size, axis=1)[:, :cols]
        grouped = (self.codes.astype(np.float32) - zeros) * scales
        if self.order is None:
            return grouped
        w = np.empty_like(grouped)
        w[:, self.order] = grouped  # back to the input order
        return w


def nibbles(words: np.ndarray) -> np.ndarray:
    """int32 [..., w] -> uint8 [..., w, 8]: each word's eight 4-bit values, lowest bits
    first."""
    unsigned = words.astype(np.int32, copy=False).view(np.uint32)
    return ((unsigned[..., None] >> SHIFTS) & 0xF).astype(np.uint8)


def gptq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int,
         v1_zeros: bool) -> Int4Weight:
    """GPTQ's layout (AutoGPTQ / GPTQModel `QuantLinear`, 4 bits):
    - qweight int32 [in / 8, out]: packed along the input, word r of column n holds inputs
      8r..8r+7, the lowest bits first;
    - qzeros int32 [groups, out / 8]: packed along the output, word c of group g holds the
      zero points of outputs 8c..8c+7, the lowest bits first;
    - scales float16 [groups, out].
    The gptq v1 format (`checkpoint_format` "gptq", the default) stores each zero point
    minus one (AutoGPTQ's packing subtracts 1, its dequantization adds it back); gptq_v2
    stores it as it is. A v1 zero point of 0 wraps to a stored 15, which dequantizes with a
    zero of 16: no 4-bit zero point holds that, so such a weight is refused."""
    codes = nibbles(qweight.T).reshape(qweight.shape[1], -1)  # [out, in]
    zeros = nibbles(qzeros).reshape(qzeros.shape[0], -1).T  # [out, groups]
    if v1_zeros:
        if (zeros == 15).any():
            raise ExportError("a gptq (v1) weight has a stored zero point of 15 (a zero of "
                              "16, which MatMulNBits' 4-bit zero points cannot hold)")
        zeros = zeros + 1
    return _checked(codes, scales.T, zeros, group_size, "gptq")


def awq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray,
        group_size: int) -> Int4Weight:
    """AWQ's GEMM layout (AutoAWQ `WQLinear_GEMM`, `version: gemm`):
    - qweight int32 [in, out / 8]: packed along the output, nibble t of word c holds column
      8c + AWQ_ORDER[t] ([0, 2, 4, 6, 1, 3, 5, 7]);
    - qzeros int32 [groups, out / 8]: the same packing;
    - scales float16 [groups, out].
    Zero points are stored as they are (no v1 "minus one")."""
    codes = _awq_columns(qweight).T  # [out, in]
    zeros = _awq_columns(qzeros).T  # [out, groups]
    return _checked(codes, scales.T, zeros, group_size, "awq")


def _awq_columns(words: np.ndarray) -> np.ndarray:
    """[rows, out / 8] int32 in AWQ's order -> [rows, out] uint8 in column order."""
    packed = nibbles(words)  # [rows, out / 8, 8]: nibble t is column AWQ_ORDER[t]
    columns = np.empty_like(packed)
    columns[..., AWQ_ORDER] = packed
    return columns.reshape(words.shape[0], -1)


def compressed_tensors(packed: np.ndarray, scales: np.ndarray, zero_point: np.ndarray | None,
                       shape: tuple[int, int], group_size: int) -> Int4Weight:
    """compressed-tensors' `pack-quantized` layout, 4 bits (llm-compressor's W4A16):
    - weight_packed int32 [out, ceil(in / 8)]: packed along the input, word j of row n holds
      inputs 8j..8j+7, the lowest bits first, each signed code q (-8..7) stored as q + 8;
    - weight_scale [out, groups] (bfloat16, float16 or float32);
    - weight_zero_point (asymmetric schemes only; symmetric ones have zero 0): signed
      -8..7, stored plus 8 and packed along the output axis, int32 [ceil(out / 8), groups]
      (`pack_to_int32(..., packed_dim=0)`; earlier releases packed it along the groups,
      [out, ceil(groups / 8)], or left it unpacked int8 [out, groups]: told apart by shape);
    - weight_shape int [2]: [out, in].
    W = (q - zero) * scale = ((q + 8) - (zero + 8)) * scale: the stored codes are the codes."""
    out, cols = shape
    codes = nibbles(packed).reshape(out, -1)[:, :cols]
    groups = scales.shape[1]
    if zero_point is None:
        zeros = np.full((out, groups), 8, np.uint8)
    else:
        zeros = _ct_zeros(zero_point, out, groups)
    return _checked(codes, scales, zeros, group_size, "compressed-tensors")


def _ct_zeros(zero_point: np.ndarray, out: int, groups: int) -> np.ndarray:
    """compressed-tensors' zero points, any of their three layouts -> uint8 [out, groups]."""
    rows, cols = zero_point.shape
    if zero_point.dtype == np.int8 and (rows, cols) == (out, groups):  # unpacked, signed
        return (zero_point.astype(np.int16) + 8).astype(np.uint8)
    if (rows, cols) == (-(-out // NIBBLES), groups):  # packed along the output
        return nibbles(zero_point.T).reshape(groups, -1)[:, :out].T
    if (rows, cols) == (out, -(-groups // NIBBLES)):  # packed along the groups
        return nibbles(zero_point).reshape(out, -1)[:, :groups]
    raise ExportError(f"a compressed-tensors weight_zero_point of shape {[rows, cols]} fits "
                      f"no layout of a weight of {out} rows and {groups} groups")


def _checked(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, group_size: int,
             method: str) -> Int4Weight:
    """The unpacked weight, once its parts agree on the rows and the groups."""
    out, cols = codes.shape
    groups = -(-cols // group_size)
    if scales.shape != (out, groups) or zeros.shape != (out, groups):
        raise ExportError(f"a {method} weight of [{out}, {cols}] with group_size {group_size} "
                          f"has scales {list(scales.shape)} and zero points "
                          f"{list(zeros.shape)}; expected {[out, groups]}")
    return Int4Weight(np.ascontiguousarray(codes), np.ascontiguousarray(scales, np.float32),
                      np.ascontiguousarray(zeros), group_size)
