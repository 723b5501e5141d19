"""Weight quantization for the `ort` flavour's linear layers.

- int8: per-output-channel symmetric int8 weights, activations quantized on the fly
  (`com.microsoft.DynamicQuantizeMatMul`): integer GEMMs use the CPU's int8 matrix units,
  the prefill lever (several times the fp32 MatMul rate on this class of CPU), and read a
  quarter of the fp32 bytes per decode step.
- int4: blockwise symmetric 4-bit weights (`com.microsoft.MatMulNBits`), activations in
  float: an eighth of the fp32 bytes per decode step, the decode (bandwidth) lever.
- int8 in a float16 bundle (a GPU's): blockwise symmetric 8-bit weights, MatMulNBits with
  bits 8 (DynamicQuantizeMatMul is float32-only, and neither ONNX Runtime's CUDA provider
  nor TensorRT has it): half the float16 bytes per decode step, int4's blocks and scales
  with 8-bit codes.

Every projection (`GraphWeights.linear`) and the LM head is quantized (the head at int8 or
float instead where `QuantConfig.head` says), and so are the embedding tables a Gather reads
(`com.microsoft.GatherBlockQuantized`, which dequantizes only the rows it gathers;
`QuantConfig.embeddings` False keeps them float): int4 in the projections' blocks (the same
packing, as [rows, blocks x block/2] bytes), int8 with one scale per row (as int8 projections have
per output channel), both as uint8 with the op's implicit zero point (8, 128). The main
table is quantized where it is untied. A tied one stays float in its Gather unless
`QuantConfig.tied_embeddings`: then it gets its own quantized copy, which dequantizes to the
head's very values where the two share a kind (same blocks, same per-row int8 scale). One
initializer for both is possible for int4 (GatherBlockQuantized reads MatMulNBits' [rows,
blocks, block/2] bytes with quantize_axis 2, given its own [rows, blocks, 1] scales, as
MatMulNBits refuses rank-3 scales), but ONNX Runtime then holds it whole beside the head's
repacked copy: on a 131072 x 1152 table one shared initializer measured 76 MB less on disk
and 72 MB more resident after load than two (docs/benchmarks.md), so the copies stay apart,
as the float ones do (decoder._lm_head). GPT-2's learned position table stays float (small).
Gemma 4's per-layer-input table ([vocab, layers x 256], the largest tensor of E2B) is always
its own, always quantized. The norms, biases and the state layers' own small tensors stay
float: the short-conv and DeltaNet conv kernels, A_log and dt_bias (llama.cpp keeps these
too: conv1d and 1-D tensors). The DeltaNet's gate projections `in_proj_a`/`in_proj_b` are
quantized with the rest (ONNX Runtime GenAI keeps them dense): keeping them float changed
the logits' drift from fp32 by under 5%, either way, on the test fixtures and on wider ones
scaled like trained weights.
The hybrids' larger drift on the fixtures is the model's (transformers with the same
dequantized weights computes the same logits, tests/test_quantize.py), mostly through the
DeltaNet's in_proj_qkv.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeprefill.errors import ExportError

KINDS = ("int8", "int4")
HEADS = ("int8", "int4", "float")  # the LM head's weights (QuantConfig.head)


@dataclass(frozen=True)
class QuantConfig:
    kind: str  # "int8" or "int4"
    block_size: int = 32  # int4, int8 at fp16: weights per scale along the input dimension
    # int4: MatMulNBits compute type. 4 (int8 activations) decodes ~1.2x faster than 0
    # (float) on x86 and prefills ~0.7x as fast (docs/benchmarks.md): int4 is the decode lever.
    # At load, level-4 projections get an int8-GEMM prefill branch (engines/ort/int4_prefill).
    accuracy_level: int = 4
    # Untied embedding tables (and Gemma 4's per-layer one) quantized too (GatherBlockQuantized)
    embeddings: bool = True
    # A tied table quantized too, its own copy beside the head's (off: it stays float)
    tied_embeddings: bool = False
    # The LM head's weights: None is the bundle's kind. int8 in an int4 bundle, as llama.cpp
    # keeps its Q4 files' output matrix at Q6_K/Q8_0: int4 alone moved the random fixtures'
    # logits by 0.085-0.133 of the largest, int8 by 0.007-0.012 (docs/benchmarks.md, stop 40).
    head: str | None = None
    # The projections stored float quantized too. False: only a pre-quantized checkpoint's
    # int4 layers are (export/prequantized.py), the layers it keeps float stay float.
    float_layers: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ExportError(f"unknown quantization {self.kind!r}; choose one of: int8, int4")
        if self.head is not None and self.head not in HEADS:
            raise ExportError(f"unknown LM head {self.head!r}; choose one of: "
                              f"{', '.join(HEADS)}")
        if self.kind == "int8" and self.head == "int4":
            raise ExportError("an int8 bundle's LM head is int8 or float (an int4 head needs "
                              "--quantize int4)")
        if self.tied_embeddings and not self.embeddings:
            raise ExportError("a tied embedding table is quantized only with the others")
        if self.block_size not in (16, 32, 64, 128, 256):
            raise ExportError(f"{self.kind} block_size must be 16..256, a power of 2: "
                              f"{self.block_size}", "block_size")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ExportError(f"accuracy_level must be 0..4, got {self.accuracy_level}",
                              "accuracy_level")

    @property
    def head_kind(self) -> str:
        """The LM head's weights: "int8", "int4" or "float"."""
        return self.head or self.kind


def int8_per_channel(w_in_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W [in, out] float -> (int8 [in, out], float32 scale [out]); W ~ q * scale."""
    w = w_in_out.astype(np.float32)
    scale = np.abs(w).max(axis=0) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def int4_blockwise(w_out_in: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """W [out, in] float -> (uint8 [out, blocks, block/2], float32 scales [out * blocks]),
    the MatMulNBits layout: per output row, blocks along the input dimension, two 4-bit
    values per byte (even index in the low nibble), stored with an implicit zero point 8."""
    # Symmetric -7..7 (the code -8 is unused): the largest magnitude is 7 scales.
    q, scale = _symmetric_blocks(w_out_in, block, 7)
    q = q.astype(np.int16) + 8
    packed = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
    return packed, scale


def int8_blockwise(w_out_in: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """W [out, in] float -> (uint8 [out, blocks, block], float32 scales [out * blocks]),
    MatMulNBits' 8-bit layout: int4_blockwise's blocks with one byte per value, symmetric
    -127..127 stored plus 128 (the op's implicit zero point for 8 bits)."""
    q, scale = _symmetric_blocks(w_out_in, block, 127)
    return (q + 128).astype(np.uint8), scale


def _symmetric_blocks(w_out_in: np.ndarray, block: int,
                      levels: int) -> tuple[np.ndarray, np.ndarray]:
    """W [out, in] -> (codes -levels..levels [out, blocks, block] as float32, float32 scales
    [out * blocks]): the input dimension padded with zeros to whole blocks, each block's
    largest magnitude `levels` scales (half_exact)."""
    w = w_out_in.astype(np.float32)
    rows, cols = w.shape
    blocks = -(-cols // block)
    padded = np.zeros((rows, blocks * block), np.float32)
    padded[:, :cols] = w
    grouped = padded.reshape(rows, blocks, block)
    scale = np.abs(grouped).max(axis=2) / float(levels)
    scale[scale == 0] = 1.0
    scale = half_exact(scale)
    q = np.clip(np.rint(grouped / scale[:, :, None]), -levels, levels)
    return q, scale.reshape(-1).astype(np.float32)


def int8_dequantize(data: np.ndarray, scales: np.ndarray, cols: int) -> np.ndarray:
    """Inverse of int8_blockwise (for tests and accuracy reports): [out, in] float32."""
    rows, blocks, block = data.shape
    w = (data.astype(np.float32) - 128) * scales.reshape(rows, blocks)[:, :, None]
    return w.reshape(rows, -1)[:, :cols]


# MatMulNBits' blockwise quantizers by bits
BLOCKWISE = {4: int4_blockwise, 8: int8_blockwise}


def half_exact(scale: np.ndarray) -> np.ndarray:
    """Each int4 scale rounded to the nearest float16 value where that is a normal float16
    (else kept: a subnormal one would lose relative precision). The bundle stores float32
    (MatMulNBits takes its activations' type), but values a float16 holds exactly let the
    native decode kernel read 2 bytes per scale instead of 4 (engines/ort/int4_decode.py):
    a tenth of a decode step's weight bytes. The rounding moves a scale by at most 2^-11 of
    itself; a code's step is 1/7 of the block's largest magnitude."""
    with np.errstate(over="ignore"):  # too large for float16: inf, kept as float32 below
        half = scale.astype(np.float16).astype(np.float32)
    normal = np.isfinite(half) & (half >= np.finfo(np.float16).tiny)
    return np.where(normal, half, scale).astype(np.float32)


def int4_dequantize(packed: np.ndarray, scales: np.ndarray, cols: int) -> np.ndarray:
    """Inverse of int4_blockwise (for tests and accuracy reports): [out, in] float32."""
    rows, blocks, half = packed.shape
    q = np.empty((rows, blocks, half * 2), np.int16)
    q[:, :, 0::2] = packed & 0x0F
    q[:, :, 1::2] = packed >> 4
    w = (q - 8).astype(np.float32) * scales.reshape(rows, blocks)[:, :, None]
    return w.reshape(rows, -1)[:, :cols]


def block_rows(table: np.ndarray, block: int, bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """An embedding table [rows, width] -> GatherBlockQuantized's operands in blocks of
    `bits` (4, or 8 in a float16 bundle): uint8 [rows, blocks * block * bits / 8] (the
    blockwise quantizer's bytes, whole blocks: the width padded with zeros to a multiple of
    the block, which the graph slices off the gathered rows) and float32 scales [rows,
    blocks]. ONNX Runtime's CUDA kernel (onnxruntime-gpu 1.31) dequantizes a partial last
    block wrong (0.3-0.4 of the values' scale off, on an H200); the CPU kernel takes one."""
    rows = table.shape[0]
    data, scales = BLOCKWISE[bits](table, block)
    return np.ascontiguousarray(data.reshape(rows, -1)), scales.reshape(rows, -1)


def int8_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An embedding table [rows, width] -> GatherBlockQuantized's int8 operands: uint8
    [rows, width] (symmetric -127..127 stored plus 128, the op's implicit zero point) and one
    float32 scale per row [rows, 1]; row ~ (data - 128) * scale."""
    w = table.astype(np.float32)
    scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    data = (np.clip(np.rint(w / scale), -127, 127) + 128).astype(np.uint8)
    return data, scale.astype(np.float32)


def in_row_chunks(quantize, table: np.ndarray, rows: int = 8192) -> tuple[np.ndarray, ...]:
    """A row-wise quantizer (block_rows, int8_rows) over `rows` rows at a time: its float
    temporaries are a few times its input, and Gemma 4 E2B's per-layer table alone is
    9.4 GB in float32."""
    parts = [quantize(table[i:i + rows]) for i in range(0, len(table), rows)]
    return tuple(np.concatenate(p) for p in zip(*parts, strict=True))
