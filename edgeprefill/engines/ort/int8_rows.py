"""At load time: an int8 bundle's projections quantize each row on its own.

An int8 bundle's projections are `com.microsoft.DynamicQuantizeMatMul`, which quantizes a
call's whole activation tensor with one scale: a token's numbers then depend on the rows
beside it: its prompt's chunking and, in a batched decode step, the other sessions' rows
(docs/design.md). Where the native kernels run with AVX512-VNNI or AVX2, each such node
whose weights are per-output-channel int8 initializers becomes `edgeprefill.MatMulInt8`
(kernels/matmul_int8.cc): the same int8 weights, each row of activations quantized by its
own largest magnitude. A prompt's numbers no longer depend on its chunking, nor a
session's decode rows on the other sessions' rows in a batched step; on the Zen 4 VM it
prefilled as fast as DynamicQuantizeMatMul and decoded 14-22% faster (docs/benchmarks.md).
`EDGEPREFILL_INT8_ROWS=off` keeps the bundle's nodes. The bundle on disk is never changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper

from edgeprefill.engines.ort import int4_decode, int8_unsigned
from edgeprefill.engines.ort.derived import Derived, hand_over, initializer
from edgeprefill.engines.ort.int8_unsigned import int8_projection
from edgeprefill.env_choice import env_choice
from edgeprefill.errors import BackendError
from edgeprefill.kernels.graph import DOMAIN, declare_domain

OP = "MatMulInt8"
PREFIX = "edgeprefill.int8"  # every name this rewrite adds starts with it
MODE_ENV = "EDGEPREFILL_INT8_ROWS"
PANEL = 64  # columns per packed panel (matmul_int8.cc kPanel)


class Int8Rows(NamedTuple):
    rewritten: int  # nodes switched to MatMulInt8
    described: str  # what `--stats` says ("" when nothing was switched)
    weights: tuple[object, ...] = ()  # the packed weights, alive as long as the session


MODES = ("auto", "off")


def why_not(native: bool) -> str | None:
    """Why an int8 bundle keeps DynamicQuantizeMatMul here, or None: turned off, no native
    kernels, or a CPU with neither AVX512-VNNI nor the AVX2 path (AVX-512 without VNNI:
    portable loops). On AVX2 (Zen 1-3, Intel client CPUs) MatMulInt8 sums the same int32s
    as with VNNI, so a bundle's logits are the same bits on either; on a Zen 3 it prefilled
    as fast as DynamicQuantizeMatMul and decoded 2-15% faster (docs/benchmarks.md, stop 44),
    and DynamicQuantizeMatMul's one scale a call left two families' int8 logits 7-10% of
    their scale off fp32 (stop 55)."""
    value = env_choice(MODE_ENV, MODES)
    if value == "off":
        return f"{MODE_ENV}=off"
    if not native:
        return "no native kernels"
    if not int4_decode.cpu_has_int_kernels():
        return "this CPU has neither AVX512-VNNI nor AVX2 without AVX-512"
    return None


def describe(native: bool) -> str:
    """What `inspect` says about an int8 bundle's projections here."""
    try:
        reason = why_not(native)
    except BackendError as err:
        return str(err)
    if reason is None:
        return f"{OP} (native: each row quantized on its own)"
    weights = f", on {int8_unsigned.describe()}" if int8_unsigned.saturates() else ""
    return f"DynamicQuantizeMatMul ({reason}: a call's rows quantized together){weights}"


def choose(graph: ModelProto, bundle_dir: Path, native: bool, session_options: Any) -> Int8Rows:
    """Rewrites `graph`'s eligible DynamicQuantizeMatMul nodes in place (weights not loaded;
    they stay in `bundle_dir`) where the native kernels run on a CPU with VNNI."""
    initializers = {t.name: t for t in graph.graph.initializer}
    targets = [node for node in graph.graph.node if int8_projection(node, initializers)]
    if not targets or why_not(native) is not None:
        return Int8Rows(0, "")
    derived = Derived(graph, bundle_dir)
    said = int8_unsigned.counted(graph, targets)
    for node in targets:
        node.CopyFrom(_swapped(node, initializers[node.input[1]], derived))
    declare_domain(graph)
    weights = hand_over(graph, derived.arrays, session_options)
    return Int8Rows(len(targets), f"{said}: {OP} (each row quantized on its own)", weights)


def _swapped(node: NodeProto, weight: TensorProto, derived: Derived) -> NodeProto:
    packed, sums = f"{PREFIX}.{node.input[1]}", f"{PREFIX}.{node.input[1]}.sums"
    derived.cached([packed, sums], lambda: pack(
        initializer(derived.graph, node.input[1], derived.bundle_dir)))
    return helper.make_node(
        OP, [node.input[0], packed, node.input[2], sums], list(node.output), domain=DOMAIN,
        name=f"{node.name or node.output[0]}.rows", N=int(weight.dims[1]),
    )


def pack(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 [K, N] -> MatMulInt8's [ceil(N / 64), ceil(K / 4), 64, 4] bytes (panel p, line i,
    column c: its codes for k = 4 i .. 4 i + 3; zero past K and N) and each column's sum of
    codes (int32 [N])."""
    k, n = codes.shape
    k4, panels = -(-k // 4), -(-n // PANEL)
    padded = np.zeros((k4 * 4, panels * PANEL), np.int8)
    padded[:k, :n] = codes
    lines = padded.reshape(k4, 4, panels, PANEL).transpose(2, 0, 3, 1)
    return (np.ascontiguousarray(lines).view(np.uint8),
            codes.astype(np.int32).sum(axis=0, dtype=np.int32))
