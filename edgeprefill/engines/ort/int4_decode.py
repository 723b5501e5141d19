"""At load time, with the native kernels: an int4 bundle's decode projections run
`edgeprefill.MatMulInt4` (edgeprefill/kernels/matmul_int4.cc) instead of ONNX Runtime's
MatMulNBits, on the same 4-bit weights repacked here for it.

A decode step reads every weight once for a handful of rows, so it is bound by memory, and
ONNX Runtime's MatMulNBits reads 11-16 GB/s on one core of an AMD EPYC (Zen 4), short of
what the memory gives. MatMulInt4's weights are repacked here, once, so that each int32
lane of an AVX-512 register is one output column: a 64-byte load holds 8 weights of 16
columns, split into two AVX512-VNNI dot products against broadcast activations, and no sum
crosses lanes (23-32 GB/s on one core, docs/benchmarks.md). The repacked weights take the
place of the bundle's in memory where nothing else reads those (int4 prefill's default
int8 variant has its own). It computes what MatMulNBits computes at accuracy level 4: the
activations quantized to int8 per block of 32 (largest magnitude / 127, rounded to nearest
even), the 4-bit weights minus their zero point 8, int32 sums per block scaled in float32;
only the order of the float32 sums differs (tests/test_int4_decode.py).

Which nodes: MatMulNBits at accuracy level 4 (4 bits, blocks of 32, no zero points) whose
rows are one token per sequence: those in int4_prefill's decode branches (the then-branch
of its If on "the chunk is one token") and those after the last-position gather (the last
layer's output projection and MLP, and the LM head). A MatMulNBits on a prefill chunk's
rows keeps ONNX Runtime's kernel (a GEMM there, where this op is a GEMV). Only on CPUs
with AVX512-VNNI or (AVX2 CPUs without AVX-512: Zen 1-3, Intel client CPUs) AVX2, whose
vpmaddubsw sums the same int32s 8 columns to a register (a decode step 4-15% shorter than
with MatMulNBits on a Zen 3, docs/benchmarks.md); elsewhere the op's portable loops would
be slower than ONNX Runtime's kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, helper

from edgeprefill.engines.ort.derived import Derived, hand_over, initializer
from edgeprefill.engines.ort.int4_prefill import INT8_ACTIVATIONS, IS_DECODE, after_gather
from edgeprefill.kernels.build import builds_avx2, cpu_identity
from edgeprefill.kernels.graph import DOMAIN, declare_domain

OP = "MatMulInt4"
BLOCK = 32  # the only block size the kernel takes (kBlock in the .cc)
TILE = 16  # columns per register (kTile in the .cc)
PREFIX = "edgeprefill.int4d"


class Int4Decode(NamedTuple):
    rewritten: int  # projections now running MatMulInt4 (0: the graph is unchanged)
    described: str  # what `--stats` says ("" when nothing changed)
    weights: tuple[object, ...] = ()  # the repacked weights and their OrtValues (session-lived)


def cpu_has_vnni() -> bool:
    return "avx512_vnni" in cpu_identity().split()


def cpu_has_int_kernels() -> bool:
    """Whether MatMulInt4 builds integer vector code here: AVX512-VNNI, or AVX2 with FMA
    and no AVX-512 (kernel_common.h's EP_AVX2: Zen 1-3, Intel client CPUs). AVX-512
    without VNNI (Skylake-SP) builds neither: the portable loops, slower than MatMulNBits."""
    flags = cpu_identity().split()
    return "avx512_vnni" in flags or builds_avx2(flags)


def why_not(native: bool) -> str | None:
    """Why decode keeps MatMulNBits here, or None."""
    if not native:
        return "no native kernels"
    if not cpu_has_int_kernels():
        return "this CPU has neither AVX512-VNNI nor AVX2 without AVX-512"
    return None


def describe(graph: ModelProto, native: bool) -> str:
    """What `inspect` says about an int4 bundle's decode projections here."""
    reason = why_not(native)
    if reason is None and not any(_eligible(n) for n in graph.graph.node):
        reason = (f"{OP} takes 4-bit blocks of {BLOCK} at accuracy level 4 without zero "
                  "points; these projections are not")
    return f"{OP} (native)" if reason is None else f"MatMulNBits ({reason})"


def choose(graph: ModelProto, bundle_dir: Path, native: bool,
           session_options: Any, every_row: bool = False) -> Int4Decode:
    """Rewrites `graph` (weights not loaded; they stay in `bundle_dir`) in place where the
    native kernels run with VNNI or AVX2 code. `every_row`: prefill chunks' projections too
    (EDGEPREFILL_INT4_PREFILL=decode, which leaves them unswitched)."""
    if why_not(native) is not None:
        return Int4Decode(0, "")
    derived = Derived(graph, bundle_dir)
    count = _rewrite(graph.graph, every_row, derived)
    if count == 0:
        return Int4Decode(0, "")
    declare_domain(graph)
    weights = hand_over(graph, derived.arrays, session_options)
    rows = "int4 projections of every row" if every_row else "int4 decode projections"
    return Int4Decode(count, f"{rows} {OP} ({count}, {_scale_types(derived)} scales)", weights)


def _scale_types(derived: Derived) -> str:
    """float16 (exports with half_exact scales), float32 (older ones: re-exporting the
    bundle gives float16 ones) or both."""
    types = {str(a.dtype) for name, a in derived.arrays.items() if name.endswith(".scales")}
    return " and ".join(sorted(types, key=["float16", "float32"].index))


def _rewrite(graph: GraphProto, decode_branch: bool, derived: Derived) -> int:
    """Swaps the one-row-per-sequence MatMulNBits of `graph` (all of them in a decode
    branch; after the last-position gather elsewhere), descending into int4_prefill's Ifs."""
    one_row = after_gather(graph)
    count = 0
    for i, node in enumerate(graph.node):
        if (decode_branch or i in one_row) and _eligible(node):
            node.CopyFrom(_swapped(node, derived))
            count += 1
        elif node.op_type == "If" and node.input[:1] == [IS_DECODE]:
            then = next(a for a in node.attribute if a.name == "then_branch")
            if then.type == AttributeProto.GRAPH:
                count += _rewrite(then.g, True, derived)
    return count


def _eligible(node: NodeProto) -> bool:
    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    plain = len(node.input) == 3 or not any(node.input[3:])  # no zero points, g_idx, bias
    return (plain and attrs.get("bits", 4) == 4 and attrs.get("block_size") == BLOCK
            and attrs.get("accuracy_level", 0) == INT8_ACTIVATIONS)


def _swapped(node: NodeProto, derived: Derived) -> NodeProto:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    weight, scale = f"{PREFIX}.{node.input[1]}", f"{PREFIX}.{node.input[1]}.scales"
    derived.cached([weight, scale], lambda: repack(
        initializer(derived.graph, node.input[1], derived.bundle_dir),
        initializer(derived.graph, node.input[2], derived.bundle_dir)))
    return helper.make_node(
        OP, [node.input[0], weight, scale], list(node.output), domain=DOMAIN,
        name=f"{node.name or node.output[0]}.int4", K=int(attrs["K"]), N=int(attrs["N"]),
    )


def repack(packed: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' weight [N, blocks, 16] uint8 (per column, blocks of 32 along K, even k in
    the low nibble) and scales [N * blocks] -> MatMulInt4's: [T, blocks, 4, 64] uint8 with
    T = ceil(N / 16) tiles of 16 columns, where byte 4 c + i of part h holds column c's
    weights k = 8 h + i (low nibble) and 8 h + 4 + i (high): the two quads of k one 64-byte
    load feeds to two `vpdpbusd`; and the scales as [T, blocks, 16], in float16 where that
    is exact (half_if_exact). Columns past N get the code 8 (weight 0) and scale 0."""
    n, blocks = packed.shape[0], packed.shape[1]
    tiles = -(-n // TILE)
    codes = np.full((tiles * TILE, blocks, BLOCK), 8, np.uint8)
    codes[:n, :, 0::2] = packed.reshape(n, blocks, BLOCK // 2) & 15
    codes[:n, :, 1::2] = packed.reshape(n, blocks, BLOCK // 2) >> 4
    parts = codes.reshape(tiles, TILE, blocks, 4, 2, 4)  # k = 8 h + 4 (high) + i
    bytes_ = parts[..., 0, :] | (parts[..., 1, :] << 4)  # [T, 16, blocks, 4, 4]
    weight = np.ascontiguousarray(bytes_.transpose(0, 2, 3, 1, 4)).reshape(tiles, blocks, 4, 64)
    padded = np.zeros((tiles * TILE, blocks), np.float32)
    padded[:n] = scales.reshape(n, blocks)
    tiled = np.ascontiguousarray(padded.reshape(tiles, TILE, blocks).transpose(0, 2, 1))
    return weight, half_if_exact(tiled)


def half_if_exact(scales: np.ndarray) -> np.ndarray:
    """float16 scales where each holds its float32 value exactly (exports since
    export/quantize.py's half_exact): a decode step then reads 2 bytes a scale, not 4, and
    computes with the same values. Else (older bundles) the float32 scales."""
    with np.errstate(over="ignore"):
        half = scales.astype(np.float16)
    return half if np.array_equal(half.astype(np.float32), scales) else scales
