"""Switches the native SkipRmsNorm into a chunk graph, in memory: each
`com.microsoft.SkipSimplifiedLayerNormalization` the exporter writes between a layer's
blocks (the residual add and the RMS norm after it, no bias) becomes one
`edgeprefill.SkipRmsNorm` node (edgeprefill/kernels/rms_norm.cc).

ONNX Runtime's CPU kernel for it runs one scalar loop per row: ~160 µs per 256-row chunk of
a 576-wide model on one core of a Zen 4 VM, two per layer, ~3% of a 2,048-token prefill.
The native op vectorizes the same arithmetic in float32 (ONNX Runtime sums the squares in
another order: the same to float32 rounding, tests/test_rms_norm_kernel.py). Only nodes
whose mean and inverse-variance outputs nothing reads are switched.

Where a native projection (MatMulInt8, MatMulBf16, MatMulF32, MatMulInt4: int8 bundles,
int4 prefill chunks, `--compute bf16`, float32 bundles, int4 decode steps) alone reads the
norm's output, `fold_norms` then
moves the norm into it (attribute epsilon, inputs skip and gamma, output 1 the residual
sum): the projection normalizes each row as it quantizes or rounds it (kernels/rms_norm.h's
arithmetic, the same bits), so the normalized rows are never written out and read back, and
a layer runs two nodes fewer (tests/test_norm_projection.py).
"""

from __future__ import annotations

from onnx import GraphProto, ModelProto, NodeProto, helper

from edgeprefill.kernels.graph import (
    DOMAIN,
    consumers_of,
    declare_domain,
    float_attribute,
    forget_values,
    readers_with_subgraphs,
    rewrite_nodes,
    subgraphs,
)

OP = "SkipRmsNorm"
STOCK = "SkipSimplifiedLayerNormalization"
EPSILON = "epsilon"  # the projections' attribute that says the norm runs inside
# The native projections that take the norm, and where their skip input goes (gamma next).
SKIP_INPUT = {"MatMulInt8": 4, "MatMulBf16": 2, "MatMulF32": 2, "MatMulInt4": 3}


def fuse_skip_rms_norm(model: ModelProto) -> int:
    """Rewrites `model`'s top-level graph in place; returns how many norms now run OP."""
    count = 0
    for i, node in enumerate(model.graph.node):
        if _eligible(node):
            model.graph.node[i].CopyFrom(_swapped(node))
            count += 1
    if count:
        declare_domain(model)
    return count


def _eligible(node: NodeProto) -> bool:
    if node.op_type != STOCK or node.domain != "com.microsoft":
        return False
    if len(node.input) != 3 or not all(node.input):  # a bias (input 3): not the exporter's
        return False
    return not any(node.output[1:3])  # mean and inverse variance unread


def _swapped(node: NodeProto) -> NodeProto:
    epsilon = float_attribute(node, "epsilon", 1e-12)  # the contrib op's default
    name = node.name or node.output[0]
    total = node.output[3] if len(node.output) > 3 and node.output[3] else f"{name}.sum"
    return helper.make_node(OP, list(node.input), [node.output[0], total], domain=DOMAIN,
                            name=f"{name}.rms", epsilon=epsilon)


def fold_norms(model: ModelProto) -> int:
    """Moves each SkipRmsNorm into the native projection that alone reads its normalized
    output: that projection, taking the norm's x, skip and gamma and epsilon and giving its
    residual sum as output 1, replaces the norm where the norm was (the sum may be read
    before the projection ran). Runs on the graph and on every subgraph (the merged If of
    an int4 prefill), each on its own; returns how many norms were moved."""
    return _fold_norms(model.graph)


def _fold_norms(graph: GraphProto) -> int:
    count = sum(_fold_norms(sub) for node in graph.node for sub in subgraphs(node))
    readers, users = readers_with_subgraphs(graph), consumers_of(graph)
    made = {o for node in graph.node for o in node.output if o}
    outputs = {o.name for o in graph.output}
    fused: dict[int, NodeProto] = {}  # id(norm) -> the projection with the norm inside
    dropped: set[int] = set()  # id(projection)
    normed_values: set[str] = set()  # the norms' outputs no node makes any more
    for norm in graph.node:
        if norm.op_type != OP or norm.domain != DOMAIN or len(norm.output) < 2:
            continue
        normed = norm.output[0]
        if readers[normed] != 1 or len(users[normed]) != 1 or normed in outputs:
            continue
        projection = users[normed][0]
        if not _takes_norm(projection, normed, made):
            continue
        fused[id(norm)] = _with_norm(projection, norm)
        dropped.add(id(projection))
        normed_values.add(normed)
    rewrite_nodes(graph, fused, dropped)
    forget_values(graph, normed_values)
    return count + len(fused)


def _takes_norm(projection: NodeProto, normed: str, made: set[str]) -> bool:
    """A native projection reading `normed` as its rows, without a norm yet, whose other
    inputs no node makes (its weights): it can then run where the norm ran."""
    skip = SKIP_INPUT.get(projection.op_type)
    return (projection.domain == DOMAIN and skip is not None
            and len(projection.input) == skip and projection.input[0] == normed
            and all(a.name != EPSILON for a in projection.attribute)
            and not any(name in made for name in projection.input[1:]))


def _with_norm(projection: NodeProto, norm: NodeProto) -> NodeProto:
    node = NodeProto()
    node.CopyFrom(projection)
    node.input[0] = norm.input[0]
    node.input.extend(norm.input[1:3])
    node.output.append(norm.output[1])
    node.attribute.append(helper.make_attribute(EPSILON, float_attribute(norm, EPSILON, 0.0)))
    return node
