"""Whether one call may carry a prefill chunk and other requests' decode rows (a fused step,
docs/design.md) without changing any row's tokens.

A fused call must give every row what a call of its own gives it. A decode row beside a
chunk is the prefill attention's row of one valid token, which it computes with the decode
attention's own code (kernels/decode_rows.h): the same bits as in a decode call. What is
left is the projections:

- float bundles: ONNX Runtime's MatMul could sum a row in another order when the call has
  more rows, equal to float32 rounding, which keeps their greedy tokens
  (tests/test_fused_steps.py); measured on the Zen 4 VM it does not: fp32 and `--compute
  bf16` fused calls were the separate calls bit for bit (docs/benchmarks.md);
- quantized bundles: their projections round a row's activations to an 8-bit grid, which
  turns any rounding difference into other codes and, measured on the compare.py int8 and
  int4 bundles, into other tokens; per-tensor dynamic quantization (`DynamicQuantizeMatMul`)
  even scales a call's rows together, so a session's decode rows moved with another
  request's prompt. They fuse only where every projection is one of the native ops that
  quantize each row on its own with integer sums (`PER_ROW`: the same bits for a row in any
  call), and one op for all rows: an int8 bundle with MatMulInt8, an int4 bundle with
  `EDGEPREFILL_INT4_PREFILL=decode` (MatMulInt4 for every row; the default gives prefill
  chunks MatMulInt8 on int8 weights derived from the int4 ones, another function).

Two more things rule it out: ONNX Runtime's GroupQueryAttention refuses a chunk with a past
in more than one row, and a graph that does not pack its tokens (exported before them, or
the standard flavour).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from onnx import GraphProto, ModelProto, NodeProto

from edgeprefill.bundle import GraphInfo
from edgeprefill.contract import LOGITS
from edgeprefill.kernels.graph import every_node

PER_ROW = ("MatMulInt8", "MatMulInt4")  # native: each row quantized on its own, int32 sums
# ONNX Runtime's quantized projections: a row's numbers depend on the call's other rows
# (one scale for the call, or another kernel for a many-row call).
STOCK_QUANTIZED = ("DynamicQuantizeMatMul", "MatMulNBits", "MatMulInteger")


def why_not(info: GraphInfo, stock_attention: bool,
            projections: Iterable[str] = (), kernels_take_it: bool = False) -> str | None:
    """Why a step's chunk and decode rows run as two calls with this bundle (`info`: the
    manifest's word on its graph; `stock_attention`: ONNX Runtime's GroupQueryAttention runs
    here, not the native kernels; `projections`: the quantized projections' op types that
    run, `quantized_ops`; `kernels_take_it`: the native kernels would take every attention
    node, where they ran: then saying so is a way to one call), or None where one call gives
    every row its own tokens. The backend and `inspect` both ask."""
    if not info.packed_tokens:
        return ("a TensorRT-ready graph keeps static shapes" if info.flavor == "standard"
                else "exported before packed tokens: re-export to fuse")
    if stock_attention:
        # Not a hint where the kernels could not help (attributes they lack: a smooth softmax).
        return ("the stock GroupQueryAttention takes one row per call with a past"
                + ("; one call with the native kernels" if kernels_take_it else ""))
    if info.quantization is not None:
        return _why_not_quantized(info.quantization, set(projections))
    return None


def _why_not_quantized(quantization: str, ops: set[str]) -> str | None:
    stock = sorted(ops & set(STOCK_QUANTIZED))
    if stock:
        return (f"{quantization} projections by ONNX Runtime's {', '.join(stock)}: a row's "
                "numbers depend on the rows beside it, so a decode row beside a chunk would "
                "not get a decode call's tokens")
    if len(ops) > 1:
        prefill = ", ".join(sorted(ops - {"MatMulInt4"}))
        return (f"{quantization} prefill projections run {prefill}, decode's MatMulInt4: a "
                "decode row beside a chunk would not get a decode call's tokens; "
                "EDGEPREFILL_INT4_PREFILL=decode gives every row decode's")
    return None


def quantized_ops(graph: ModelProto) -> set[str]:
    """The quantized projections' op types left in `graph` after the load-time rewrites.
    The LM head counts only where it is a stock op: a native one computes each of its rows
    (one per sequence) by itself in any call, so an int8 head (MatMulInt8) beside an int4
    body (`--lm-head int8`) changes no row's numbers in a fused call, though its op differs
    from the body's."""
    quantized = {*PER_ROW, *STOCK_QUANTIZED}
    head = lm_head(graph.graph)
    ops = {node.op_type for node in every_node(graph.graph)
           if node.op_type in quantized and node is not head}
    if head is not None and head.op_type in STOCK_QUANTIZED:
        ops.add(head.op_type)
    return ops


PROJECTIONS = ("MatMul", "Gemm", "MatMulBf16", *PER_ROW, *STOCK_QUANTIZED)


def lm_head(graph: GraphProto) -> NodeProto | None:
    """The node computing the logits: back from the `logits` output through the ops after
    the head (bias, scaling, soft-cap, a float16 graph's cast) to the first projection."""
    producers = {out: node for node in graph.node for out in node.output}
    node = producers.get(LOGITS)
    while node is not None and node.op_type not in PROJECTIONS:
        node = producers.get(node.input[0]) if node.input else None
    return node


def stock_attention(graph: ModelProto) -> bool:
    """Whether ONNX Runtime's GroupQueryAttention is left in `graph` after the load-time
    rewrites, in subgraphs (the switches' Ifs) too."""
    return "GroupQueryAttention" in set(_op_types(graph.graph))


def _op_types(graph: GraphProto) -> Iterator[str]:
    """Every node's op type, in subgraphs (the load-time switches' Ifs) too."""
    return (node.op_type for node in every_node(graph))
