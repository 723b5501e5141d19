"""Switches the native SwiGlu into a chunk graph, in memory: each SiLU-gated MLP's
Split -> Sigmoid -> Mul -> Mul (as `edgeprefill.export.decoder` writes it) becomes one
`edgeprefill.SwiGlu` node on the packed gate/up projection (edgeprefill/kernels/swiglu.cc).

A decode step runs three fewer nodes per layer and a prefill chunk makes one pass over the
projection instead of three (the Split copied both halves). Only the exact pattern is
matched: every intermediate value must feed nothing else, so the graph computes the same
function with or without the rewrite. Not the same bits: ONNX Runtime's QuickGelu uses an
approximate sigmoid (off by up to ~1e-3 relative where the gate is very negative), SwiGlu
an exp accurate to ~1e-7, so the rewritten graph is the closer of the two to the exact
value (tests/test_swiglu_kernel.py).

Where the gate/up projection is itself a native op (MatMulInt8, MatMulBf16, MatMulF32,
MatMulInt4: the int8 and int4 bundles' prefill, `--compute bf16`, float32 bundles, int4
bundles' decode steps), `fold_gated` then moves
the SwiGlu into it (attribute gated=1): the projection applies the same arithmetic
(kernels/swiglu.h) to its gate and up panels before writing anything, so the 2 I columns
are never written out and read back, and a layer runs one node fewer. The same bits
(tests/test_gated_projection.py).
"""

from __future__ import annotations

from onnx import GraphProto, ModelProto, NodeProto, helper

from edgeprefill.kernels.graph import (
    DOMAIN,
    axis,
    consumers_of,
    declare_domain,
    forget_values,
    int_attribute,
    readers_with_subgraphs,
    rewrite_nodes,
    subgraphs,
)

OP = "SwiGlu"
GATED = "gated"  # the projections' attribute (matmul_int8.cc, matmul_bf16.cc, matmul_f32.cc)
PROJECTIONS = ("MatMulInt8", "MatMulBf16", "MatMulF32", "MatMulInt4")  # those that take it
PANEL = 64  # their panel width: gate and up must each fill whole panels


def fuse_swiglu(model: ModelProto) -> int:
    """Rewrites `model` in place; returns how many MLPs now run SwiGlu."""
    graph = model.graph
    consumers = consumers_of(graph)
    outputs = {o.name for o in graph.output}
    replaced: dict[int, NodeProto] = {}  # id(final Mul) -> SwiGlu
    dropped: set[int] = set()
    for node in graph.node:
        match = _match(node, consumers, outputs)
        if match is None:
            continue
        sigmoid, first, final = match
        replaced[id(final)] = helper.make_node(
            OP, [node.input[0]], [final.output[0]], domain=DOMAIN,
            name=f"{final.name or final.output[0]}.swiglu",
        )
        dropped.update({id(node), id(sigmoid), id(first)})
    if not replaced:
        return 0
    rewrite_nodes(graph, replaced, dropped)
    declare_domain(model)
    return len(replaced)


def _match(split: NodeProto, consumers: dict[str, list[NodeProto]],
           outputs: set[str]) -> tuple[NodeProto, NodeProto, NodeProto] | None:
    """(Sigmoid, Mul(gate, sigmoid), Mul(that, up)) when `split` starts the pattern."""
    if split.op_type != "Split" or split.domain not in ("", "ai.onnx"):
        return None
    if len(split.input) != 1 or len(split.output) != 2 or axis(split) != -1:
        return None  # explicit split sizes, or another axis: not the exporter's gate/up
    gate, up = split.output
    gate_users, up_users = consumers[gate], consumers[up]
    sigmoid = next((n for n in gate_users if n.op_type == "Sigmoid"), None)
    if sigmoid is None or len(gate_users) != 2 or len(up_users) != 1:
        return None
    first = next((n for n in gate_users if n is not sigmoid), None)
    if first is None or not _is_mul_of(first, gate, sigmoid.output[0]):
        return None
    final = up_users[0]
    if not _is_mul_of(final, first.output[0], up):
        return None
    private = [gate, up, sigmoid.output[0], first.output[0]]
    if any(name in outputs for name in private):
        return None
    if len(consumers[sigmoid.output[0]]) != 1 or len(consumers[first.output[0]]) != 1:
        return None
    return sigmoid, first, final


def _is_mul_of(node: NodeProto, a: str, b: str) -> bool:
    return (node.op_type == "Mul" and node.domain in ("", "ai.onnx")
            and sorted(node.input) == sorted([a, b]))


def fold_gated(model: ModelProto) -> int:
    """Moves each SwiGlu into the native projection that makes its input, where that
    projection's output feeds nothing else and its gate and up halves fill whole panels:
    the projection gets gated=1 and the SwiGlu's output, and the SwiGlu goes. Runs on the
    graph and on every subgraph (the merged If of an int4 prefill, engines/ort/switches.py),
    each on its own; returns how many SwiGlus were moved."""
    return _fold_gated(model.graph)


def _fold_gated(graph: GraphProto) -> int:
    count = sum(_fold_gated(sub) for node in graph.node for sub in subgraphs(node))
    producer = {o: n for n in graph.node for o in n.output}
    readers = readers_with_subgraphs(graph)
    outputs = {o.name for o in graph.output}
    dropped: list[NodeProto] = []
    for node in graph.node:
        if node.op_type != OP or node.domain != DOMAIN:
            continue
        value = node.input[0]
        projection = producer.get(value)
        if (projection is None or not _gateable(projection) or readers[value] != 1
                or value in outputs):
            continue
        projection.attribute.append(helper.make_attribute(GATED, 1))
        projection.output[0] = node.output[0]
        dropped.append(node)
    rewrite_nodes(graph, dropped={id(n) for n in dropped})
    forget_values(graph, {d.input[0] for d in dropped})
    return count + len(dropped)


def _gateable(node: NodeProto) -> bool:
    columns = int_attribute(node, "N")
    return (node.op_type in PROJECTIONS and node.domain == DOMAIN
            and int_attribute(node, GATED) == 0 and columns > 0 and columns % (2 * PANEL) == 0)
