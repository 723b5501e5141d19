"""BitNet b1.58 projections, computed as transformers computes them (its integrations/bitnet.py).

A BitNet checkpoint's config.json carries a `quantization_config` of quant_method "bitnet",
and transformers then replaces every nn.Linear but the LM head with one of three layers:

  linear_class "bitlinear" (the Hub's microsoft/bitnet-b1.58-2B-4T): BitLinear. Its weight
      is stored packed, uint8 [out / 4, in], four ternary rows per stored row: row
      i * (out / 4) + r of the weight is bits 2i..2i+1 of stored row r, minus 1; beside it
      `weight_scale` [1]. y = (q(x) @ W^T) / (s(x) * weight_scale).
  "autobitlinear", quantization_mode "offline": AutoBitLinear over the ternary weight
      (stored as floats, or packed as above where it has out / 4 rows):
      y = (q(x) / s(x)) @ W^T * weight_scale.
  "autobitlinear", "online" (master weights): the float weight W is made ternary on the fly,
      T = clamp(round(W * c), -1, 1) with c = 1 / mean |W|: y = (q(x) / s(x)) @ (T / c)^T.

q(x) is each token's int8 fake-quantization, s(x) = 127 / max(|x|, 1e-5) over the token's
row, q(x) = clamp(round(x * s(x)), -128, 127). All three are y = (q(x) @ T^T) / (s(x) * d)
with T ternary and d one divisor per projection, which is how the graph computes them.
T is stored as int8 [in, out] (a quarter of float32's bytes), and q(x) @ T^T is an integer
sum (|sum| <= 128 * in), so integer arithmetic computes it exactly:

  ort flavour: MatMulInteger of the codes q(x) + 128 as uint8 (zero point 128) by the int8
      T, an int32 sum cast to the graph's float. uint8 x int8 is the GEMM ONNX Runtime's x86
      MLAS packs (int8 x int8 ran ~65x slower on an AVX2 CPU), and with |T| <= 1 its
      saturating int16 pair sums (vpmaddubsw, without VNNI) hold at most 2 * 255.
  standard flavour: TensorRT's parser has no MatMulInteger; T goes through a
      DequantizeLinear of scale 1 (exact) into the float MatMul, whose integer-valued
      operands sum exactly in float32.

ONNX Runtime's 2-bit MatMulNBits would store T in a quarter of int8's bytes, but it is exact
only at accuracy level 0 (float dequantization, 15-28x slower than the float MatMul for one
row on one CPU thread); level 4 re-quantizes q(x) per block of 256 or fewer (sums off by 22).
Without a quantization_config (a plain float checkpoint) the family's projections are plain
MatMuls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from edgeprefill.errors import ExportError
from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.graph import ONNX_DTYPE, GraphBuilder
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.export.weights import GraphWeights

CODE_OFFSET = 128  # q(x) + 128 is q(x)'s uint8 code; MatMulInteger's zero point takes it back
ROWS_PER_BYTE = 4  # transformers' VALUES_PER_ITEM: four 2-bit values per stored byte
LAYOUTS = ("bitlinear", "autobitlinear_offline", "autobitlinear_online")


@dataclass(frozen=True)
class BitNetScheme:
    layout: str  # one of LAYOUTS

    def divisor(self, weight_scale: float) -> float:
        """d of y = (q(x) @ T^T) / (s(x) * d), from the module's stored weight_scale."""
        return weight_scale if self.layout == "bitlinear" else 1.0 / weight_scale


def read_bitnet_scheme(family: str, raw: dict[str, Any]) -> BitNetScheme | None:
    """The layout a BitNet quantization_config asks for (None without one); what export
    cannot compute as transformers does is refused in one line."""
    quant = raw.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "bitnet":
        return None
    linear = quant.get("linear_class", "bitlinear")
    mode = quant.get("quantization_mode", "offline")
    layout = linear if linear == "bitlinear" else f"{linear}_{mode}"
    if layout not in LAYOUTS or (linear == "bitlinear" and mode != "offline"):
        raise ExportError(f"{family}: quantization_config linear_class {linear!r} with "
                          f"quantization_mode {mode!r} is not supported")
    if quant.get("use_rms_norm"):
        raise ExportError(f"{family}: quantization_config use_rms_norm=true (an RMSNorm inside "
                          "each BitLinear) is not supported")
    skipped = quant.get("modules_to_not_convert")
    if skipped is not None and set(skipped) != {"lm_head"}:
        raise ExportError(f"{family}: quantization_config modules_to_not_convert {skipped!r} "
                          "is not supported; export takes every projection but the LM head "
                          "as BitLinear (null or [\"lm_head\"])")
    return BitNetScheme(layout)


def unpack_ternary(packed: np.ndarray) -> np.ndarray:
    """uint8 [rows, in] -> int8 [4 * rows, in] in {-1, 0, 1} (transformers'
    unpack_weights: the i-th 2-bit field of every stored row makes the i-th block of rows)."""
    fields = [(packed >> (2 * i)) & 3 for i in range(ROWS_PER_BYTE)]
    return np.concatenate(fields).astype(np.int8) - np.int8(1)


def ternary_online(weight: np.ndarray) -> tuple[np.ndarray, float]:
    """AutoBitLinear's online WeightQuant of a float32 [out, in] weight: (T as int8, c)."""
    c = np.float32(1.0) / max(np.abs(weight).mean(dtype=np.float32), np.float32(1e-5))
    return np.clip(np.round(weight * c), -1, 1).astype(np.int8), float(c)


def stored_ternary(name: str, weight: np.ndarray) -> np.ndarray:
    """An offline AutoBitLinear weight stored as floats, as int8; one that is not
    integer-valued would not be the ternary weight transformers multiplies by: refused."""
    if not np.array_equal(weight, np.clip(np.round(weight), -1, 1)):
        raise ExportError(f"{name}: an AutoBitLinear offline weight stored as floats must "
                          "hold only -1, 0 and 1")
    return weight.astype(np.int8)


class BitWeights(GraphWeights):
    """GraphWeights whose projections are BitNet layers (the LM head and the embedding
    stay float: transformers never converts them)."""

    def __init__(self, g: GraphBuilder, ckpt: Checkpoint, dtype: np.dtype,
                 quant: QuantConfig | None, scheme: BitNetScheme, integer_matmul: bool) -> None:
        super().__init__(g, ckpt, dtype, quant)
        self.scheme = scheme
        self.integer_matmul = integer_matmul  # MatMulInteger runs (the ort flavour)

    def shape(self, name: str) -> tuple[int, ...]:
        """A packed weight's shape as transformers unpacks it, [out, in]."""
        shape = super().shape(name)
        return (shape[0] * ROWS_PER_BYTE, *shape[1:]) if self._packed(name) else shape

    def linear(self, x: str, weight_names: list[str], bias_name: str | None,
               reorder: Callable[[np.ndarray], np.ndarray] | None = None) -> str:
        """(q(x) @ [T_1; T_2; ...]^T) / s(x) / d per output column: one quantization of
        x for the projections packed together (q, k and v read the same input)."""
        if bias_name is not None or reorder is not None:
            raise ExportError("BitNet projections with biases or reordered rows are not "
                              "supported")
        g = self.g
        absmax = g.op("ReduceMax", [g.op("Abs", [x]), g.const([-1])], keepdims=1)
        scale = g.op("Div", [g.const(127.0, self.dtype),
                             g.op("Max", [absmax, g.const(1e-5, self.dtype)])])  # [..., 1]
        quantized = g.op("Clip", [g.op("Round", [g.op("Mul", [x, scale])]),
                                  g.const(-128.0, self.dtype), g.const(127.0, self.dtype)])
        in_dim = self.shape(weight_names[0])[1]
        out_dim = sum(self.shape(n)[0] for n in weight_names)
        stem = weight_names[0].removesuffix(".weight") + ("" if len(weight_names) == 1
                                                          else ".packed")
        ternary = g.weight(stem + ".ternary", (in_dim, out_dim), np.int8,
                           lambda: np.ascontiguousarray(
                               np.concatenate([self._ternary(n) for n in weight_names]).T))
        y = self._integer_product(quantized, ternary)
        inverse = self.g.weight(stem + ".inverse_divisor", (out_dim,), self.dtype,
                                lambda: self._inverse_divisors(weight_names))
        return g.op("Mul", [g.op("Div", [y, scale]), inverse])

    def _integer_product(self, quantized: str, ternary: str) -> str:
        """q(x) @ T in the graph's float type, computed exactly: the integer-valued q(x)
        (floats) times the int8 T [in, out]."""
        g = self.g
        if not self.integer_matmul:  # a scale of 1 dequantizes T exactly
            weight = g.op("DequantizeLinear", [ternary, g.const(1.0, self.dtype)])
            return g.op("MatMul", [quantized, weight])
        codes = g.op("Cast", [g.op("Add", [quantized, g.const(float(CODE_OFFSET), self.dtype)])],
                     to=TensorProto.UINT8)
        sums = g.op("MatMulInteger", [codes, ternary, g.const(CODE_OFFSET, np.uint8)])
        return g.op("Cast", [sums], to=ONNX_DTYPE[np.dtype(self.dtype)])

    def _ternary(self, name: str) -> np.ndarray:
        """The projection's T, int8 [out, in] in {-1, 0, 1}."""
        if self.scheme.layout == "autobitlinear_online":
            return ternary_online(self.ckpt.get(name, np.float32))[0]
        if self._packed(name):
            return unpack_ternary(self.ckpt.get(name, np.uint8))
        return stored_ternary(name, self.ckpt.get(name, np.float32))

    def _inverse_divisors(self, names: list[str]) -> np.ndarray:
        """1 / d of each projection, once per output column [sum of outs]."""
        parts = []
        for name in names:
            if self.scheme.layout == "autobitlinear_online":
                divisor = ternary_online(self.ckpt.get(name, np.float32))[1]
            else:
                stored = self.ckpt.get(name.removesuffix(".weight") + ".weight_scale")
                divisor = self.scheme.divisor(float(stored.reshape(-1)[0]))
            parts.append(np.full(self.shape(name)[0], 1.0 / divisor, np.float32))
        return np.concatenate(parts).astype(self.dtype)

    def _packed(self, name: str) -> bool:
        return self.scheme.layout != "autobitlinear_online" and self.ckpt.stored_bytes(name)
