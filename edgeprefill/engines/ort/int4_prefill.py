"""At load time: give an int4 bundle's prefill chunks a faster projection than decode's.

An int4 bundle's projections are `com.microsoft.MatMulNBits` at accuracy level 4 (int8
activations, blockwise): the fastest decode (one row: bandwidth-bound on the 4-bit
weights), but on a many-row chunk ONNX Runtime's x86 kernel is well below its int8 GEMM
(`DynamicQuantizeMatMul`): int4 prefill was the slowest precision (docs/benchmarks.md,
"int4 prefill at int8 speed"). Each MatMulNBits before the logits becomes an `If` on "the
chunk is one token": the then-branch is the node unchanged (decode keeps its kernel and
its exact numbers, or the native MatMulInt4 where engines/ort/int4_decode.py switches it
in), the else-branch the prefill variant picked by `EDGEPREFILL_INT4_PREFILL`:

- `int8` (the default): `DynamicQuantizeMatMul` on per-output-channel int8 weights derived
  here from the int4 ones (dequantized, then requantized: a grid 18x finer than the int4
  one, so the weights move by at most 1/36 of an int4 step) — the int8 bundle's kernel.
  Costs the int8 copy of the weights in memory (twice the int4 bytes). Where the native
  MatMulInt8 runs (VNNI; `choose`'s `rows`) it takes the same int8 weights, packed, and
  quantizes each row on its own: a prompt's numbers do not depend on its chunking, ~100 MB
  less memory (no ONNX Runtime prepacked copy) and a 4-13% faster 2,048-token prefill.
- `level0`: the same node at accuracy level 0 (float activations) on the same weights.
- `decode`: no switch: every row takes decode's projection (MatMulInt4 where
  engines/ort/int4_decode.py switches it in, else the stock node), so a row's numbers do not
  depend on its chunk-mates, and no int8 copy of the weights is kept; an 11-17% slower
  2,048-token prefill than `int8` on the Zen 4 VM (docs/benchmarks.md).
- `off`: the stock graph.

The bundle on disk is never changed (a stock ONNX Runtime still loads it); the rewritten
graph is loaded from bytes, its own weights from the bundle's files, the derived ones from
arrays handed to the session (docs/design.md, "int4 prefill at int8 speed").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from onnx import (
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    helper,
)

from edgeprefill.contract import INPUT_IDS
from edgeprefill.engines.ort import int8_unsigned
from edgeprefill.engines.ort.derived import Derived, hand_over, initializer
from edgeprefill.env_choice import env_choice
from edgeprefill.errors import BackendError
from edgeprefill.export.quantize import int4_dequantize, int8_per_channel
from edgeprefill.kernels.graph import DOMAIN, declare_domain, int_attribute, takes_last_rows

MODE_ENV = "EDGEPREFILL_INT4_PREFILL"
PREFIX = "edgeprefill.int4"  # every name this rewrite adds starts with it
IS_DECODE = f"{PREFIX}.is_decode"
INT8_ACTIVATIONS = 4  # MatMulNBits accuracy_level: int8 activations
STOCK = "MatMulNBits (accuracy level of the bundle)"


class Int4Prefill(NamedTuple):
    rewritten: bool  # the graph was changed in place and must be loaded from bytes
    projections: str  # what `--stats` and `inspect` say runs for prefill projections
    # The derived weights (arrays and their OrtValues): ONNX Runtime reads them in place,
    # so they live as long as the session.
    weights: tuple[object, ...] = ()


Variant = Callable[[NodeProto, Derived], list[NodeProto]]


# Modes that switch nothing: the stock projection for every row, or decode's.
UNSWITCHED = ("decode", "off")
MODES = ("int8", "level0", *UNSWITCHED)


def mode() -> str:
    return env_choice(MODE_ENV, MODES)


def every_row_as_decode() -> bool:
    """EDGEPREFILL_INT4_PREFILL=decode: prefill rows take decode's projection too."""
    return mode() == "decode"


def why_not(flavor: str, device: str, dtype: str = "float32") -> str | None:
    """Why this bundle keeps its stock projections for prefill, or None."""
    if mode() in UNSWITCHED:
        return f"{MODE_ENV}={mode()}"
    if device != "cpu":
        return f"device {device}"
    if flavor != "ort":
        return f"{flavor} flavour"
    if dtype != "float32":  # the int8 GEMMs it derives (DynamicQuantizeMatMul, MatMulInt8)
        return f"a {dtype} bundle"  # take float32 activations only
    return None


def choose(graph: ModelProto, bundle_dir: Path, flavor: str, device: str,
           session_options: Any, rows: bool = False, dtype: str = "float32") -> Int4Prefill:
    """Rewrites `graph` (weights not loaded; they stay in `bundle_dir`) in place when it
    has int4 projections and nothing rules the rewrite out. `rows`: the native MatMulInt8
    runs here (engines/ort/int8_rows.py), so `int8` quantizes each row on its own. `dtype`:
    the bundle's (manifest.graph.dtype)."""
    targets = prefill_targets(graph)
    if not targets:
        return Int4Prefill(False, "")
    reason = why_not(flavor, device, dtype)
    if reason is not None:
        return Int4Prefill(False, _unswitched(reason))
    variant = _variant(rows)
    described = _described(variant, graph, targets)  # before the switch rewrites the nodes
    derived = Derived(graph, bundle_dir)
    switch(graph, targets, VARIANTS[variant], derived)
    if variant == "int8 rows":
        declare_domain(graph)
    weights = hand_over(graph, derived.arrays, session_options) if derived.arrays else ()
    return Int4Prefill(True, described, weights)


def describe(graph: ModelProto, flavor: str, device: str = "cpu", rows: bool = False,
             dtype: str = "float32") -> str:
    """What `inspect` says about an int4 bundle's prefill projections here (`rows`,
    `dtype`: as `choose`'s)."""
    try:
        reason = why_not(flavor, device, dtype)
    except BackendError as err:
        return str(err)
    if reason is not None:
        return _unswitched(reason)
    return _described(_variant(rows), graph, prefill_targets(graph))


def _described(variant: str, graph: ModelProto, targets: list[int]) -> str:
    """The variant, and which targets it cannot take: weights with zero points (a
    pre-quantized asymmetric checkpoint's, export/prequantized.py) derive no int8 ones and
    run MatMulNBits at accuracy level 0 instead."""
    said = describe_variant(variant)
    left = sum(not _derivable(graph.graph.node[i]) for i in targets)
    if variant == "level0" or not left:
        return said
    if left == len(targets):
        return f"{describe_variant('level0')} (the weights have zero points: no int8 ones derive)"
    return f"{said}; {left} of {len(targets)} with zero points at MatMulNBits accuracy level 0"


def _variant(rows: bool) -> str:
    """The switched variant: `mode()`; its int8 one quantizing each row on its own where
    MatMulInt8 runs (`rows`), else on uint8 weights where this CPU's int8 GEMM would
    saturate (engines/ort/int8_unsigned.py)."""
    variant = mode()
    if variant == "int8" and rows:
        return "int8 rows"
    if variant == "int8" and int8_unsigned.saturates():
        return "uint8"
    return variant


def _unswitched(reason: str) -> str:
    if every_row_as_decode():
        return f"decode's projections for every row ({reason}: each row's numbers its own)"
    return f"{STOCK} ({reason})"


def describe_variant(variant: str) -> str:
    # Decode's projections are said apart (engines.ort.int4_decode, `inspect`'s int4 decode).
    if variant == "uint8":
        return f"DynamicQuantizeMatMul on uint8 weights derived at load {int8_unsigned.reason()}"
    return {"int8": "DynamicQuantizeMatMul on int8 weights derived at load",
            "int8 rows": "MatMulInt8 on int8 weights derived at load (each row quantized on "
                         "its own)",
            "level0": "MatMulNBits accuracy level 0"}[variant]


def prefill_targets(graph: ModelProto) -> list[int]:
    """Indices of the MatMulNBits nodes whose rows are the chunk's tokens: all but those
    after the last-position gather (the last layer's output projection and MLP, and the
    logits head, see one row per sequence), and only at accuracy level 4: those already
    quantize activations to int8, so an int8 prefill is the same class of approximation; a
    bundle exported at level 0 asked for float activations (exact with the dequantized
    weights) and keeps them."""
    one_row = after_gather(graph.graph)
    return [i for i, node in enumerate(graph.graph.node)
            if i not in one_row and node.op_type == "MatMulNBits"
            and node.domain == "com.microsoft"
            and int_attribute(node, "accuracy_level") == INT8_ACTIVATIONS]


def after_gather(graph: GraphProto) -> set[int]:
    """Indices of the nodes whose rows are one per sequence: the last-position gather
    (GatherND, or the last layer's attention where it took that gather in:
    kernels.graph.takes_last_rows) and every node that reads what it, or a node after it,
    produced."""
    produced: set[str] = set()
    found = set()
    for i, node in enumerate(graph.node):
        if node.op_type == "GatherND" or any(x in produced for x in node.input):
            produced.update(node.output)
            found.add(i)
        elif takes_last_rows(node):  # its cache outputs are every token's
            produced.add(node.output[0])
            found.add(i)
    return found


def switch(graph: ModelProto, targets: list[int], variant: Variant, derived: Derived) -> None:
    nodes = graph.graph.node
    for i in targets:
        nodes[i].CopyFrom(_if(nodes[i], variant(nodes[i], derived)))
    for node in reversed(_selector()):
        nodes.insert(0, node)  # depends on a graph input only


def _selector() -> list[NodeProto]:
    """is_decode = (the chunk axis of input_ids [B, C] is 1), a scalar bool. Its own names,
    so it composes with the native kernels' selector (edgeprefill.kernels.graph)."""
    one = helper.make_tensor(f"{PREFIX}.one", TensorProto.INT64, [1], [1])
    return [
        helper.make_node("Shape", [INPUT_IDS], [f"{PREFIX}.chunk"], start=1, end=2,
                         name=f"{PREFIX}.chunk"),
        helper.make_node("Constant", [], [f"{PREFIX}.one"], value=one, name=f"{PREFIX}.one"),
        helper.make_node("Equal", [f"{PREFIX}.chunk", f"{PREFIX}.one"], [f"{PREFIX}.eq"],
                         name=f"{PREFIX}.eq"),
        helper.make_node("Squeeze", [f"{PREFIX}.eq"], [IS_DECODE], name=IS_DECODE),
    ]


def _if(node: NodeProto, prefill: list[NodeProto]) -> NodeProto:
    name = node.name or node.output[0]
    decode = NodeProto()
    decode.CopyFrom(node)
    decode.output[0] = f"{PREFIX}.{name}.decode"
    decode.name = f"{PREFIX}.{name}.decode"
    prefill[-1].output[0] = f"{PREFIX}.{name}.prefill"
    return helper.make_node(
        "If", [IS_DECODE], [node.output[0]], name=f"{PREFIX}.{name}.switch",
        then_branch=_branch([decode], f"{PREFIX}.{name}.decode_branch"),
        else_branch=_branch(prefill, f"{PREFIX}.{name}.prefill_branch"),
    )


def _branch(nodes: list[NodeProto], name: str) -> GraphProto:
    out = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    return helper.make_graph(nodes, name, [], [out])


def _level0(node: NodeProto, derived: Derived) -> list[NodeProto]:
    twin = NodeProto()
    twin.CopyFrom(node)
    twin.name = f"{PREFIX}.{node.name}.level0"
    for attr in twin.attribute:
        if attr.name == "accuracy_level":
            attr.i = 0
    return [twin]


def _derivable(node: NodeProto) -> bool:
    """4-bit weights without zero points: what the int8 variants derive from."""
    return int_attribute(node, "bits", 4) == 4 and not (len(node.input) > 3 and any(node.input[3:]))


def _int8_codes(node: NodeProto, derived: Derived) -> tuple[np.ndarray, np.ndarray]:
    """The node's int4 weights dequantized and requantized per output channel: int8 [K, N]
    codes and float32 [N] scales."""
    packed = initializer(derived.graph, node.input[1], derived.bundle_dir)
    scales = initializer(derived.graph, node.input[2], derived.bundle_dir)
    weights = int4_dequantize(packed, scales, int_attribute(node, "K"))  # [N, K]
    return int8_per_channel(weights.T)


def _int8(node: NodeProto, derived: Derived) -> list[NodeProto]:
    """DynamicQuantizeMatMul over int8 weights derived from the node's int4 ones."""
    if not _derivable(node):
        return _level0(node, derived)  # zero points or other widths: not derived
    base = f"{PREFIX}.{node.input[1]}"

    def derive() -> tuple[np.ndarray, np.ndarray]:
        q, scale = _int8_codes(node, derived)
        return np.ascontiguousarray(q), scale  # ORT reads them in place

    derived.cached([f"{base}.int8", f"{base}.int8_scale"], derive)
    return [helper.make_node(
        "DynamicQuantizeMatMul", [node.input[0], f"{base}.int8", f"{base}.int8_scale"],
        ["out"], domain="com.microsoft", name=f"{PREFIX}.{node.name}.int8",
    )]


def _uint8(node: NodeProto, derived: Derived) -> list[NodeProto]:
    """`_int8`'s codes as uint8 at a zero point of 128: the same numbers, which a CPU
    without VNNI multiplies without saturating (engines/ort/int8_unsigned.py)."""
    if not _derivable(node):
        return _level0(node, derived)
    base = f"{PREFIX}.{node.input[1]}.uint8"

    def derive() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q, scale = _int8_codes(node, derived)
        return int8_unsigned.unsigned(q), scale, int8_unsigned.zero_points(q.shape[1])

    names = [base, f"{base}.scale", f"{base}.zero_point"]
    derived.cached(names, derive)
    return [helper.make_node(
        "DynamicQuantizeMatMul", [node.input[0], *names], ["out"], domain="com.microsoft",
        name=f"{PREFIX}.{node.name}.uint8",
    )]


def _int8_rows(node: NodeProto, derived: Derived) -> list[NodeProto]:
    """edgeprefill.MatMulInt8 over the same derived int8 weights, packed for it: each row
    of activations quantized on its own, so a prompt's numbers do not depend on its
    chunking (engines/ort/int8_rows.py)."""
    from edgeprefill.engines.ort.int8_rows import OP as ROWS_OP  # int8_rows imports this module
    from edgeprefill.engines.ort.int8_rows import pack as pack_rows

    if not _derivable(node):
        return _level0(node, derived)
    base = f"{PREFIX}.{node.input[1]}.rows"

    def derive() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q, scale = _int8_codes(node, derived)
        lines, sums = pack_rows(q)
        return lines, scale, sums

    derived.cached([base, f"{base}.scale", f"{base}.sums"], derive)
    return [helper.make_node(
        ROWS_OP, [node.input[0], base, f"{base}.scale", f"{base}.sums"], ["out"],
        domain=DOMAIN, name=f"{PREFIX}.{node.name}.rows", N=int_attribute(node, "N"),
    )]


# What `int8` becomes where the native MatMulInt8 runs (choose's `rows`): "int8 rows"; where
# the int8 GEMM would saturate: "uint8".
VARIANTS: dict[str, Variant] = {"int8": _int8, "int8 rows": _int8_rows, "uint8": _uint8,
                                "level0": _level0}
