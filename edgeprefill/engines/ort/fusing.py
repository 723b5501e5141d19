"""Whether one call may carry a prefill chunk and other requests' decode rows (a fused step,
docs/design.md) without changing any row's tokens.

A fused call must give every row what a call of its own gives it. A decode row beside a
chunk takes the prefill attention (one valid token) where a decode call takes the decode
attention: the same sum in another order, equal to float32 rounding, which keeps a float
bundle's greedy tokens (tests/test_fused_steps.py). Three things break it:

- ONNX Runtime's GroupQueryAttention refuses a chunk with a past in more than one row;
- quantized bundles: their projections round a row's activations to an 8-bit grid, which
  turns those rounding differences into different codes and, measured on the compare.py
  int8 and int4 bundles, into different tokens for some sessions. Worse, per-tensor dynamic
  quantization (`DynamicQuantizeMatMul`: int8 bundles without the native kernels, int4
  bundles' default prefill) scales a call's rows together, so a session's decode rows moved
  with another request's prompt: every session's greedy text changed;
- a graph that does not pack its tokens (exported before them, or the standard flavour).
"""

from __future__ import annotations

from collections.abc import Iterator

from onnx import AttributeProto, GraphProto, ModelProto

from edgeprefill.bundle import GraphInfo


def why_not(graph: ModelProto, info: GraphInfo) -> str | None:
    """Why a step's chunk and decode rows run as two calls with this graph (after the
    load-time rewrites; `info`: the manifest's word on it), or None where one call gives
    every row its own tokens."""
    if not info.packed_tokens:
        return ("a TensorRT-ready (standard) graph keeps static shapes" if info.flavor ==
                "standard" else "the bundle was exported before packed tokens: re-export it")
    if "GroupQueryAttention" in set(_op_types(graph.graph)):
        return ("ONNX Runtime's GroupQueryAttention takes one row per call with a past "
                "(the native kernels do not run here)")
    if info.quantization is not None:
        return (f"{info.quantization} projections quantize activations: a decode row beside "
                "a chunk would not get a decode call's tokens")
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
