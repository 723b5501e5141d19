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


def why_not(info: GraphInfo, stock_attention: bool) -> str | None:
    """Why a step's chunk and decode rows run as two calls with this bundle (`info`: the
    manifest's word on its graph; `stock_attention`: ONNX Runtime's GroupQueryAttention runs
    here, not the native kernels), or None where one call gives every row its own tokens.
    The backend and `inspect` both ask."""
    if not info.packed_tokens:
        return ("a TensorRT-ready graph keeps static shapes" if info.flavor == "standard"
                else "exported before packed tokens: re-export to fuse")
    if info.quantization is not None:
        return (f"{info.quantization} projections quantize activations: a decode row beside "
                "a chunk would not get a decode call's tokens")
    if stock_attention:
        return ("the stock GroupQueryAttention takes one row per call with a past; one call "
                "with the native kernels")
    return None


def stock_attention(graph: ModelProto) -> bool:
    """Whether ONNX Runtime's GroupQueryAttention is left in `graph` after the load-time
    rewrites, in subgraphs (the switches' Ifs) too."""
    return "GroupQueryAttention" in set(_op_types(graph.graph))


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
