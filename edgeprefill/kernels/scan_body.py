"""What the recurrence rewrites share (gated_delta.py, mamba2_scan.py): an exporter's
`Scan` known by its body, and its switch, in memory, for one native op on the same inputs
and outputs.

The exporter writes a recurrent mixer's recurrence as a forward `Scan` over the chunk's
axis 1 with one state carried (the first input and output) and every other input and
output scanned; its body is one token's update. A Scan is switched only where its body is
exactly the exporter's: its name, its inputs and outputs in order and the ops it runs
(older bundles' extra copy of the state aside, COPY).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import NamedTuple

from onnx import GraphProto, ModelProto, NodeProto, helper

from edgeprefill.kernels.graph import DOMAIN, declare_domain

# Bundles exported before stop 40 copied the new state to the body's output through an
# Identity each token (the exporters now write the sum to the output itself): the same
# step, switched too.
COPY = Counter({"Identity": 1})


class ScanBody(NamedTuple):
    """An exporter's step body and the op that takes its Scan's place."""
    op: str  # the native op (in DOMAIN)
    name: re.Pattern[str]  # the body's name: a layer prefix, then "step"
    inputs: tuple[str, ...]  # after the prefix, in order: the state, then the scanned ones
    outputs: tuple[str, ...]  # the same: the state, then the scanned ones
    ops: Counter[str]  # the ops of one token's update


def fuse(model: ModelProto, body: ScanBody) -> int:
    """Rewrites `model`'s top-level graph in place; returns how many Scans now run body.op."""
    count = 0
    for node in model.graph.node:  # in place: a node keeps its position
        if matches(node, body):
            node.CopyFrom(helper.make_node(body.op, list(node.input), list(node.output),
                                           domain=DOMAIN,
                                           name=f"{node.name or node.output[-1]}.{body.op}"))
            count += 1
    if count:
        declare_domain(model)
    return count


def count(model: ModelProto, body: ScanBody) -> int:
    """How many Scans of `model`'s graph `fuse` would switch (what `inspect` says)."""
    return sum(matches(node, body) for node in model.graph.node)


def matches(node: NodeProto, body: ScanBody) -> bool:
    """A forward Scan over axis 1 carrying one state, whose body is `body`."""
    if node.op_type != "Scan" or node.domain not in ("", "ai.onnx"):
        return False
    if len(node.input) != len(body.inputs) or len(node.output) != len(body.outputs):
        return False
    scanned_in, scanned_out = len(body.inputs) - 1, len(body.outputs) - 1
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if (attrs.get("num_scan_inputs") != scanned_in
            or list(attrs.get("scan_input_axes", [])) != [1] * scanned_in
            or list(attrs.get("scan_output_axes", [])) != [1] * scanned_out
            or any(attrs.get(d) for d in ("scan_input_directions", "scan_output_directions"))):
        return False
    graph = attrs.get("body")
    return isinstance(graph, GraphProto) and _is_body(graph, body)


def _is_body(graph: GraphProto, body: ScanBody) -> bool:
    if not body.name.fullmatch(graph.name):
        return False
    prefix = graph.name[: -len("step")]
    return ([i.name for i in graph.input] == [prefix + n for n in body.inputs]
            and [o.name for o in graph.output] == [prefix + n for n in body.outputs]
            and all(n.domain in ("", "ai.onnx") for n in graph.node)
            and Counter(n.op_type for n in graph.node) in (body.ops, body.ops + COPY))
