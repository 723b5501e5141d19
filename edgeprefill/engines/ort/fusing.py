"""Whether one call may carry a prefill chunk and other requests' decode rows (a fused step,
docs/design.md) without changing any row's numbers.

A fused call must give every row what a call of its own gives it: each operator on the
token rows computes a row from that row alone, and a decode row takes the same operators
as in a decode call. Three things break that:

- ONNX Runtime's GroupQueryAttention refuses a chunk with a past in more than one row;
- per-tensor dynamic quantization (`DynamicQuantizeMatMul`, an int8 bundle's projections and
  an int4 bundle's default prefill ones, engines/ort/int4_prefill.py) scales a call's
  activations by their largest value over all rows: the decode rows would move with the
  other request's prompt (measured: every session's greedy text changed);
- the int4 prefill rewrite's projections differ from decode's (int8 weights, or float
  activations), and a fused call takes the prefill ones for its decode rows too.
"""

from __future__ import annotations

from collections.abc import Iterator

from onnx import AttributeProto, GraphProto, ModelProto

from edgeprefill.bundle import GraphInfo

# Operators that quantize a call's activations with one scale for all its rows.
PER_TENSOR_QUANTIZATION = frozenset({"DynamicQuantizeMatMul", "DynamicQuantizeLinear"})


def why_not(graph: ModelProto, info: GraphInfo, int4_prefill_rewritten: bool) -> str | None:
    """Why a step's chunk and decode rows run as two calls with this graph (after the
    load-time rewrites; `info`: the manifest's word on it), or None where one call gives
    every row its own numbers."""
    if not info.packed_tokens:
        return ("a TensorRT-ready (standard) graph keeps static shapes" if info.flavor ==
                "standard" else "the bundle was exported before packed tokens: re-export it")
    ops = set(_op_types(graph.graph))
    if "GroupQueryAttention" in ops:
        return ("ONNX Runtime's GroupQueryAttention takes one row per call with a past "
                "(the native kernels do not run here)")
    if ops & PER_TENSOR_QUANTIZATION:
        return ("the int8 projections quantize a call's rows with one scale: other "
                "requests' rows would change each other's numbers")
    if int4_prefill_rewritten:
        return ("the int4 prefill projections are not decode's (EDGEPREFILL_INT4_PREFILL="
                "decode keeps one kind for both)")
    return None


def _op_types(graph: GraphProto) -> Iterator[str]:
    """Every node's op type, in subgraphs (the load-time switches' Ifs) too."""
    for node in graph.node:
        yield node.op_type
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _op_types(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _op_types(sub)
