"""A float32 bundle's projections as the load-time rewrites find and replace them: every
MatMul on a 2-D float32 weight, and the LM head's Gemm (bf16_compute.py's MatMulBf16,
f32_projections.py's MatMulF32). One native node takes each, on the weight repacked for it
once (through `Derived`: the disk cache keeps it for the bundle's later loads)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper

from edgeprefill.engines.ort.derived import Derived, initializer
from edgeprefill.kernels.graph import DOMAIN


def is_projection(node: NodeProto, initializers: dict[str, TensorProto]) -> bool:
    """Whether the node multiplies by a float32 2-D initializer in a way the kernels take:
    MatMul(x, W[K, N]) or the LM head's Gemm(x, W[N, K], bias?, transB=1)."""
    if node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return False
    if node.op_type == "Gemm":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == 1.0 and (
            attrs.get("beta", 1.0) == 1.0)
        if attrs.get("transB", 0) != 1 or not plain:
            return False
    elif node.op_type != "MatMul":
        return False
    weight = initializers.get(node.input[1])
    return weight is not None and len(weight.dims) == 2 and weight.data_type == TensorProto.FLOAT


def replace_projections(graph: ModelProto, derived: Derived, op: str, prefix: str,
                        pack: Callable[[np.ndarray], np.ndarray]) -> int:
    """Every projection of `graph` becomes `op` (attribute N, its columns) on its weight
    packed by `pack` ([K, N] float32 in), named `prefix`.<weight>. Returns how many."""
    initializers = {t.name: t for t in graph.graph.initializer}
    nodes = graph.graph.node
    targets = [i for i, node in enumerate(nodes) if is_projection(node, initializers)]
    for i in reversed(targets):  # from the end: a Gemm's bias adds a node after it
        replacement = _nodes(nodes[i], initializers[nodes[i].input[1]], derived, op, prefix,
                             pack)
        nodes[i].CopyFrom(replacement[0])
        for j, extra in enumerate(replacement[1:], start=1):
            nodes.insert(i + j, extra)
    return len(targets)


def _nodes(node: NodeProto, weight: TensorProto, derived: Derived, op: str, prefix: str,
           pack: Callable[[np.ndarray], np.ndarray]) -> list[NodeProto]:
    """`weight`: the node's initializer as the graph declares it (its dims; the data stays in
    the bundle until derive() reads it)."""
    gemm = node.op_type == "Gemm"  # its weight is stored [N, K]

    def derive() -> list[np.ndarray]:
        values = initializer(derived.graph, node.input[1], derived.bundle_dir)
        return [pack(values.T if gemm else values)]

    name = f"{prefix}.{node.input[1]}"
    derived.cached([name], derive)
    columns = int(weight.dims[0] if gemm else weight.dims[1])
    label = node.name or node.output[0]
    bias = gemm and len(node.input) > 2 and node.input[2]
    product = f"{prefix}.{label}.product" if bias else node.output[0]
    nodes = [helper.make_node(op, [node.input[0], name], [product], domain=DOMAIN,
                              name=f"{prefix}.{label}", N=columns)]
    if bias:
        nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]],
                                      name=f"{prefix}.{label}.bias"))
    return nodes
