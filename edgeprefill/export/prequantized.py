"""Pre-quantized int4 checkpoints (GPTQ, AWQ, compressed-tensors W4A16), exported as they are.

The Hub's -GPTQ-Int4, -AWQ and llm-compressor W4A16 releases store each quantized linear
layer as 4-bit codes, with a scale and a zero point per group of inputs (their layouts:
export/int4_layouts.py). MatMulNBits computes with exactly that form (bits 4, block_size
the group size, its scales and zero points), so export copies it: the bundle's weights
dequantize to the checkpoint's own values, with no float round trip and no requantization.
A layer the checkpoint keeps float (lm_head, embeddings, `modules_to_not_convert`,
`ignore`) stores a plain `weight`, read as any float checkpoint's. An act-order layer
(a g_idx that scatters each group's inputs) is read with its inputs in group order, to be
gathered into that order in the graph (export/act_order.py). Anything else the
checkpoint's `quantization_config` asks for (other widths, other packings) is refused in
one line that names it.

Which layers are quantized is read off the tensors, not the config's module lists: a
layer is int4 where the checkpoint stores its `qweight` (GPTQ, AWQ) or `weight_packed`
(compressed-tensors) instead of its `weight`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeprefill.errors import ExportError
from edgeprefill.export import act_order, int4_layouts
from edgeprefill.export.int4_layouts import Int4Weight

METHODS = ("gptq", "awq", "compressed-tensors")
BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits' block_size: a power of 2, 16..256
# The name of a quantized module's codes, per method (`{module}.{codes}`); beside them GPTQ
# stores qzeros, scales and g_idx, AWQ qzeros and scales, compressed-tensors weight_scale,
# weight_shape and (asymmetric) weight_zero_point, (act-order) weight_g_idx.
CODES = {"gptq": "qweight", "awq": "qweight", "compressed-tensors": "weight_packed"}
LABELS = {"gptq": "GPTQ", "awq": "AWQ", "compressed-tensors": "compressed-tensors W4A16"}
G_IDX = {"gptq": "g_idx", "compressed-tensors": "weight_g_idx"}  # each input's group, if any

Reader = Callable[[str], np.ndarray]  # a stored tensor by name, as it is stored


@dataclass(frozen=True)
class Int4Scheme:
    """A pre-quantized checkpoint's 4-bit scheme, from config.json's quantization_config."""

    method: str  # one of METHODS
    group_size: int
    symmetric: bool  # every zero point 8 (the bundle then stores none: MatMulNBits' default)
    v1_zeros: bool = False  # gptq's v1 format: zero points stored minus one

    def describe(self) -> str:
        """In words, for the manifest's quirks and `inspect`."""
        zeros = "symmetric" if self.symmetric else "asymmetric"
        return (f"{LABELS[self.method]} int4 weights (groups of {self.group_size}, {zeros}), "
                "kept 4-bit in the ort flavour, dequantized in the standard one")

    @property
    def codes(self) -> str:
        """The suffix of a quantized module's codes (`{module}.{codes}`)."""
        return CODES[self.method]

    def shape(self, module: str, stored_shape: Callable[[str], tuple[int, ...]],
              read: Reader) -> tuple[int, int]:
        """The layer's weight shape [out, in], from the stored parts' shapes."""
        codes = stored_shape(f"{module}.{self.codes}")
        if self.method == "gptq":
            return codes[1], codes[0] * int4_layouts.NIBBLES
        if self.method == "awq":
            return codes[1] * int4_layouts.NIBBLES, codes[0]
        return _ct_shape(module, read)

    def read(self, module: str, read: Reader, has: Callable[[str], bool]) -> Int4Weight:
        """The layer's codes, scales and zero points (export/int4_layouts.py), its codes'
        columns in `order` (act-order, export/act_order.py); a symmetric scheme's zero
        points must all be 8."""
        weight = self._unpacked(module, read, has)
        if self.symmetric and not (weight.zeros == 8).all():
            raise ExportError(f"{module}: the {self.method} config says symmetric, but the "
                              "layer's zero points are not all 8")
        return act_order.in_order(weight, self.order(module, read, has, weight.codes.shape[1]))

    def order(self, module: str, read: Reader, has: Callable[[str], bool],
              inputs: int) -> np.ndarray | None:
        """The order of the layer's `inputs` inputs that makes its groups contiguous
        (act-order), or None where they already are (no g_idx, or the plain one)."""
        name = f"{module}.{G_IDX[self.method]}" if self.method in G_IDX else None
        if name is None or not has(name):
            return None
        return act_order.input_order(module, read(name), self.group_size, inputs)

    def _unpacked(self, module: str, read: Reader, has: Callable[[str], bool]) -> Int4Weight:
        if self.method == "gptq":
            return int4_layouts.gptq(read(f"{module}.qweight"), read(f"{module}.qzeros"),
                                     read(f"{module}.scales"), self.group_size, self.v1_zeros)
        if self.method == "awq":
            return int4_layouts.awq(read(f"{module}.qweight"), read(f"{module}.qzeros"),
                                    read(f"{module}.scales"), self.group_size)
        zero_name = f"{module}.weight_zero_point"
        return int4_layouts.compressed_tensors(
            read(f"{module}.weight_packed"), read(f"{module}.weight_scale"),
            read(zero_name) if has(zero_name) else None,
            _ct_shape(module, read), self.group_size)


def _ct_shape(module: str, read: Reader) -> tuple[int, int]:
    out, cols = (int(v) for v in read(f"{module}.weight_shape"))
    return out, cols


def read_int4_scheme(family: str, raw: dict[str, Any]) -> Int4Scheme | None:
    """The checkpoint's int4 scheme, or None where its quantization_config is none of
    METHODS (export/fp8.py reads, or refuses, the rest); a config of these methods that
    export cannot copy is refused in one line."""
    quant = raw.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") not in METHODS:
        return None
    method = quant["quant_method"]
    read = {"gptq": _gptq, "awq": _awq, "compressed-tensors": _compressed_tensors}[method]
    return read(f"{family}: the checkpoint's {method} quantization", quant)


def _gptq(what: str, quant: dict[str, Any]) -> Int4Scheme:
    _check_bits(what, quant.get("bits"))
    layout = quant.get("checkpoint_format", "gptq")
    if layout not in ("gptq", "gptq_v2"):
        raise ExportError(f"{what} is stored as {layout!r}; export reads the gptq and "
                          "gptq_v2 formats")
    return Int4Scheme("gptq", _group_size(what, quant.get("group_size")),
                      symmetric=bool(quant.get("sym", True)), v1_zeros=layout == "gptq")


def _awq(what: str, quant: dict[str, Any]) -> Int4Scheme:
    _check_bits(what, quant.get("bits", quant.get("w_bit", 4)))  # AutoAWQ's w_bit default
    version = str(quant.get("version", "gemm")).lower()
    if version != "gemm":
        raise ExportError(f"{what} is packed for {version!r}; export reads AWQ's gemm packing")
    if not quant.get("zero_point", True):
        raise ExportError(f"{what} has no zero points (zero_point false); export reads "
                          "AWQ's default, with them")
    size = _group_size(what, quant.get("group_size", quant.get("q_group_size")))
    return Int4Scheme("awq", size, symmetric=False)


def _compressed_tensors(what: str, quant: dict[str, Any]) -> Int4Scheme:
    groups = quant.get("config_groups") or {}
    schemes = [g.get("weights") for g in groups.values() if isinstance(g, dict)]
    if not schemes or len({repr(s) for s in schemes}) != 1 or not isinstance(schemes[0], dict):
        raise ExportError(f"{what} needs one weights scheme in config_groups, got "
                          f"{len(schemes)} different")
    first = next(iter(groups.values()))
    layout = first.get("format") or quant.get("format")
    if layout != "pack-quantized":
        raise ExportError(f"{what} has format {layout!r}; export reads pack-quantized")
    weights = schemes[0]
    if first.get("input_activations"):
        raise ExportError(f"{what} quantizes activations too; export reads weight-only "
                          "(W4A16) schemes")
    if weights.get("type", "int") != "int":
        raise ExportError(f"{what} has {weights.get('type')} weights; export reads int ones")
    _check_bits(what, weights.get("num_bits"))
    if weights.get("strategy") != "group":
        raise ExportError(f"{what} has the {weights.get('strategy')!r} strategy; export "
                          "reads the group strategy")
    return Int4Scheme("compressed-tensors", _group_size(what, weights.get("group_size")),
                      symmetric=bool(weights.get("symmetric", True)))


def _check_bits(what: str, bits: Any) -> None:
    if bits != 4:
        raise ExportError(f"{what} has {bits}-bit weights; export reads 4-bit ones")


def _group_size(what: str, size: Any) -> int:
    if size not in BLOCK_SIZES:
        raise ExportError(f"{what} has group_size {size}; export reads "
                          f"{', '.join(map(str, BLOCK_SIZES))} (MatMulNBits' block sizes)")
    return int(size)


def matmul_nbits(weight: Int4Weight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits' operands: uint8 [out, groups, group/2] (per output row, blocks along the
    input as the codes hold them, an act-order weight's in its `order`, which the graph
    gathers its inputs into, export/weights.py; even k in the low nibble; the last block
    padded with code 0, which its K leaves unread), float32 scales [out * groups], and
    uint8 zero points [out, ceil(groups / 2)] (two per byte, the even group low; a
    symmetric scheme's, all 8, the op's default, are left out of the graph: the int4
    kernels engines/ort swaps in at load take only those)."""
    out, cols = weight.codes.shape
    groups, block = weight.scales.shape[1], weight.group_size
    codes = np.zeros((out, groups * block), np.uint8)
    codes[:, :cols] = weight.codes
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(out, groups, block // 2)
    scales = weight.scales.reshape(-1).astype(np.float32)
    zeros = np.zeros((out, groups + groups % 2), np.uint8)
    zeros[:, :groups] = weight.zeros
    return packed, scales, (zeros[:, 0::2] | (zeros[:, 1::2] << 4)).astype(np.uint8)


def stacked(weights: list[Int4Weight]) -> Int4Weight:
    """Layers of one input, group size and input order side by side along the output (a
    fused q|k|v or gate|up projection)."""
    sizes = {w.group_size for w in weights}
    if len(sizes) != 1:
        raise ExportError(f"the parts of a fused projection have group sizes {sorted(sizes)}")
    order = weights[0].order
    if not all(same_order(w.order, order) for w in weights):
        raise ExportError("the parts of a fused projection have different act-order "
                          "input orders")
    return Int4Weight(*(np.concatenate(parts) for parts in zip(
        *((w.codes, w.scales, w.zeros) for w in weights), strict=True)),
        group_size=sizes.pop(), order=order)


def same_order(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Whether two input orders (None: the identity) are one."""
    return (a is None and b is None) or (a is not None and b is not None
                                         and np.array_equal(a, b))
