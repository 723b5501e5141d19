"""Switches the native GatedDeltaRule into a chunk graph, in memory: each Gated DeltaNet
layer's recurrence, the `Scan` export/gated_delta.py writes (its body from
GatedDeltaNet._step_body: one token's update of the float32 state S and its output),
becomes one `edgeprefill.GatedDeltaRule` node on the same six inputs and two outputs
(edgeprefill/kernels/gated_delta.cc).

The Scan runs its body's ~14 nodes once per token, each over every head's S; the op keeps
one (row, head)'s S in cache across the chunk's tokens, the pieces on ONNX Runtime's pool.
The same arithmetic in the same order, so the same values up to float rounding (the sums
over the key dimension: tests/test_gated_delta_kernel.py). Only a Scan with exactly that
body (its inputs, outputs and ops, as the exporter writes them) is switched.
"""

from __future__ import annotations

import re
from collections import Counter

from onnx import GraphProto, ModelProto, NodeProto, helper

from edgeprefill.kernels.graph import DOMAIN, declare_domain

OP = "GatedDeltaRule"
# GatedDeltaNet._step_body(f"delta{layer}_"): its name, its inputs and outputs in order
# (after the prefix) and the ops of one token's update.
BODY_NAME = re.compile(r"delta\d+_step")
BODY_INPUTS = ("S", "q", "k", "v", "decay", "beta")
BODY_OUTPUTS = ("S_out", "o")
BODY_OPS = Counter({"Unsqueeze": 6, "Mul": 3, "MatMul": 2, "Sub": 1, "Add": 1,
                    "Identity": 1, "Squeeze": 1})


def fuse_gated_delta(model: ModelProto) -> int:
    """Rewrites `model`'s top-level graph in place; returns how many Scans now run OP."""
    count = 0
    for node in model.graph.node:  # in place: a node keeps its position
        if is_delta_scan(node):
            node.CopyFrom(_swapped(node))
            count += 1
    if count:
        declare_domain(model)
    return count


def delta_scans(model: ModelProto) -> int:
    """How many Scans of `model`'s graph the rewrite would switch (what `inspect` says)."""
    return sum(is_delta_scan(node) for node in model.graph.node)


def is_delta_scan(node: NodeProto) -> bool:
    """A Scan over the chunk's axis 1 (five scanned inputs, one scanned output, forward)
    whose body is the exporter's DeltaNet step."""
    if node.op_type != "Scan" or node.domain not in ("", "ai.onnx"):
        return False
    if len(node.input) != 6 or len(node.output) != 2:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if (attrs.get("num_scan_inputs") != 5 or list(attrs.get("scan_input_axes", [])) != [1] * 5
            or list(attrs.get("scan_output_axes", [])) != [1]
            or any(attrs.get(d) for d in ("scan_input_directions", "scan_output_directions"))):
        return False
    body = attrs.get("body")
    return isinstance(body, GraphProto) and _is_step_body(body)


def _is_step_body(body: GraphProto) -> bool:
    if not BODY_NAME.fullmatch(body.name):
        return False
    prefix = body.name[: -len("step")]
    return ([i.name for i in body.input] == [prefix + n for n in BODY_INPUTS]
            and [o.name for o in body.output] == [prefix + n for n in BODY_OUTPUTS]
            and all(n.domain in ("", "ai.onnx") for n in body.node)
            and Counter(n.op_type for n in body.node) == BODY_OPS)


def _swapped(scan: NodeProto) -> NodeProto:
    return helper.make_node(OP, list(scan.input), list(scan.output), domain=DOMAIN,
                            name=f"{scan.name or scan.output[1]}.delta_rule")
