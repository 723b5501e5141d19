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
"""

from __future__ import annotations

from onnx import ModelProto, NodeProto, helper

from edgeprefill.kernels.graph import DOMAIN, axis, consumers_of, declare_domain

OP = "SwiGlu"


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
    kept = [replaced.get(id(n), n) for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
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
