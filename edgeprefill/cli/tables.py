"""`inspect`'s word on a bundle's token tables and LM head: float or quantized, read off
its graph (so bundles exported before `--lm-head` and `--embeddings all` are described too).

The token tables are the Gather / GatherBlockQuantized nodes on an initializer whose
indices come from the ids input (the main table, Gemma 4's per-layer one; not GPT-2's
positions). The LM head is the node reading the initializer the exporter names
`lm_head.weight` (float Gemm), `lm_head.int8` (DynamicQuantizeMatMul; MatMulNBits with
bits 8 in a float16 bundle) or `lm_head.int4` (MatMulNBits): export/decoder.py's `_lm_head`.
"""

from __future__ import annotations

import math

from onnx import GraphProto, NodeProto, TensorProto, helper

from edgeprefill.contract import INPUT_IDS

HEAD_WEIGHTS = ("lm_head.weight", "lm_head.int8", "lm_head.int4")
TABLE_OPS = ("Gather", "GatherBlockQuantized")
TERNARY = ".ternary"  # BitNet's ternary projection weights (export/bitlinear.py)
TERNARY_OPS = {"MatMulInteger": "MatMulInteger on each token's int8 codes: exact int32 sums",
               "DequantizeLinear": "DequantizeLinear into the float MatMul: exact float sums"}


def head_kind(graph: GraphProto) -> str | None:
    """The LM head's weights: "int4", "int8", "float32" (or "float16"), None if not found."""
    node = _head(graph)
    if node is None:
        return None
    if node.op_type == "MatMulNBits":
        return f"int{_attribute(node, 'bits', 4)}"
    if node.op_type == "DynamicQuantizeMatMul":
        return "int8"
    return _float(next(t for t in graph.initializer if t.name in node.input))


def head_line(graph: GraphProto) -> str:
    """One line: the LM head's weights and the op that reads them."""
    node, kind = _head(graph), head_kind(graph)
    if node is None:
        return "lm head     not found in the graph"
    how = (f", {_blocks(node)}" if node.op_type == "MatMulNBits"
           else ", one scale per vocabulary row" if kind == "int8" else "")
    return f"lm head     {kind} ({node.op_type}{how})"


def ternary_line(graph: GraphProto) -> list[str]:
    """BitNet bundles (export/bitlinear.py): their ternary projections' weights (int8; float
    where exported before they were), how many bytes they hold and the op that multiplies
    by them; [] for other bundles."""
    weights = [t for t in graph.initializer if t.name.endswith(TERNARY)]
    if not weights:
        return []
    names = {t.name for t in weights}
    ops = sorted({n.op_type for n in graph.node if any(i in names for i in n.input)})
    types = [helper.tensor_dtype_to_np_dtype(t.data_type) for t in weights]
    size = sum(math.prod(t.dims) * k.itemsize for t, k in zip(weights, types, strict=True))
    return [f"projections {len(weights)} BitNet ternary weights, "
            f"{'/'.join(sorted({k.name for k in types}))} ({size / 1e6:.2f} MB; "
            f"{'; '.join(TERNARY_OPS.get(op, op) for op in ops)})"]


def _head(graph: GraphProto) -> NodeProto | None:
    return next((n for n in graph.node if any(i in HEAD_WEIGHTS for i in n.input)), None)


def embeddings_line(graph: GraphProto) -> str:
    """One line: each token table's weights (float or quantized) and the op that reads it."""
    initializers = {t.name: t for t in graph.initializer}
    parts = [_described(node, initializers) for node in token_tables(graph, initializers)]
    return f"embeddings  {'; '.join(parts) or 'no token table in the graph'}"


def token_tables(graph: GraphProto, initializers: dict[str, TensorProto]) -> list[NodeProto]:
    """The Gathers of an initializer's rows at the token ids, in graph order."""
    from_ids, tables = {INPUT_IDS}, []
    for node in graph.node:
        if (node.op_type in TABLE_OPS and node.input[0] in initializers
                and node.input[1] in from_ids):
            tables.append(node)
        elif node.input and node.input[0] in from_ids:  # the ids reshaped, packed
            from_ids.update(node.output)
    return tables


def _described(node: NodeProto, initializers: dict[str, TensorProto]) -> str:
    data = node.input[0]
    if node.op_type == "Gather":
        return f"{data} {_float(initializers[data])} (Gather)"
    bits = _attribute(node, "bits", 4)
    name = data.removesuffix(f".int{bits}")
    per_row = list(initializers[node.input[2]].dims)[1:] == [1]  # scales [rows, blocks]
    block = "one scale per row" if per_row else _blocks(node)
    return f"{name} int{bits} ({node.op_type}, {block})"


def _blocks(node: NodeProto) -> str:
    return f"blocks of {_attribute(node, 'block_size', 0)}"


def _attribute(node: NodeProto, name: str, default: int) -> int:
    found = [a for a in node.attribute if a.name == name]
    return int(helper.get_attribute_value(found[0])) if found else default


def _float(weight: TensorProto) -> str:
    return {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
            TensorProto.BFLOAT16: "bfloat16"}.get(weight.data_type, "float")
