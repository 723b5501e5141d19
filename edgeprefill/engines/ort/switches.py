"""At load time: one `If` per step instead of one per switched node.

The int4 prefill rewrite (`engines.ort.int4_prefill`) gives decode steps and prefill chunks
different projections through an `If` on "the chunk is one token" around each projection it
switches (the native attention needs none: one op serves both, `edgeprefill.kernels.graph`).
An `If` costs ONNX Runtime ~14 us to run whichever the branch (a new frame, its feeds and
fetches): 150 of them were ~1.7 ms of a 14 ms int4 decode step on the SmolLM2-135M shape
(docs/benchmarks.md).

This pass takes the graph after those rewrites and replaces the nodes from the first
switch to the last by ONE `If`: its then-branch is that region with each switch's
then-branch inlined, its else-branch the same with the else-branches. Nodes in the region
that are not switches (norms, the MLP's activation) are written into both branches; a node
that reads a large initializer would have it prepacked twice, once per branch, so a region
holding one is left as it is, unless the node is one of the native library's, which never
prepack. The bundle on disk never changes; the computation is the same, node for node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper

from edgeprefill.engines.ort.int4_prefill import IS_DECODE
from edgeprefill.kernels.graph import DOMAIN as KERNELS_DOMAIN

# A weight its kernel may prepack (MatMul, MatMulNBits, ...): never written into both
# branches. Norm weights (a few KB) are far below it.
HEAVY_BYTES = 64 * 1024
ITEM_BYTES = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2,
              TensorProto.INT8: 1, TensorProto.UINT8: 1, TensorProto.INT32: 4,
              TensorProto.INT64: 8}


class Switches(NamedTuple):
    merged: int  # switch Ifs replaced by the one If (0: the graph is unchanged)
    why_not: str = ""  # when nothing was merged though there were switches

    def describe(self) -> str:
        if self.merged:
            return f"one If per step ({self.merged} switches merged)"
        return f"one If per switched node ({self.why_not})" if self.why_not else ""


def merge_switches(model: ModelProto) -> Switches:
    """Rewrites `model` in place when its switches can share one If; says what it did."""
    nodes = list(model.graph.node)
    switches = [i for i, node in enumerate(nodes) if _is_switch(node)]
    if len(switches) < 2:
        return Switches(0)
    first, last = switches[0], switches[-1]
    hoisted, region = _split_region(nodes[first : last + 1])
    heavy = _heavy_initializers(model.graph)
    if any(not _is_switch(n) and _prepacks(n) and set(n.input) & heavy for n in region):
        return Switches(0, "a weight outside the switches would be held twice")
    if any(_has_subgraph(n) for n in _inner_nodes(region)):
        return Switches(0, "a subgraph inside the region")  # not renamed by this pass
    outputs = _region_outputs(region, nodes[last + 1 :], model.graph)
    merged = helper.make_node(
        "If", [region[0].input[0]], outputs, name="edgeprefill.switches",
        then_branch=_branch(region, outputs, "then_branch", "decode", model.graph),
        else_branch=_branch(region, outputs, "else_branch", "prefill", model.graph),
    )
    del model.graph.node[:]
    model.graph.node.extend([*nodes[:first], *hoisted, merged, *nodes[last + 1 :]])
    return Switches(len(switches))


def _split_region(span: list[NodeProto]) -> tuple[list[NodeProto], list[NodeProto]]:
    """(the nodes of `span` that read nothing a switch makes, directly or through other
    nodes of it; the rest). The first run before the If, once, and the branches read their
    values from outside: a conv layer's state indices, int64 values of the step's lengths
    that a later layer reads, would otherwise be region outputs, which the branches
    declare float."""
    switched: set[str] = set()
    before, region = [], []
    for node in span:
        if _is_switch(node) or switched.intersection(_reads(node)):
            switched.update(o for o in node.output if o)
            region.append(node)
        else:
            before.append(node)
    return before, region


def _prepacks(node: NodeProto) -> bool:
    """Whether the node's kernel may keep its own packed copy of a weight: ONNX Runtime's
    may (MatMul, Gemm, MatMulNBits, ...); the native library's never do (they read the
    initializer in place, as `--compute bf16`'s MatMulBf16 does)."""
    return node.domain != KERNELS_DOMAIN


def _is_switch(node: NodeProto) -> bool:
    return node.op_type == "If" and node.domain == "" and node.input[0] == IS_DECODE


def _inner_nodes(region: list[NodeProto]) -> Iterable[NodeProto]:
    """The region's nodes, a switch counting as the nodes of its two branches."""
    for node in region:
        if _is_switch(node):
            for attr in node.attribute:
                yield from attr.g.node
        else:
            yield node


def _has_subgraph(node: NodeProto) -> bool:
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def _heavy_initializers(graph: GraphProto) -> set[str]:
    heavy = set()
    for tensor in graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= dim
        if count * ITEM_BYTES.get(tensor.data_type, 4) >= HEAVY_BYTES:
            heavy.add(tensor.name)
    return heavy


def _region_outputs(region: list[NodeProto], after: list[NodeProto],
                    graph: GraphProto) -> list[str]:
    """Values the region makes that nodes after it or the graph's outputs read, in the
    order the region makes them."""
    wanted = {name for node in after for name in _reads(node)}
    wanted |= {o.name for o in graph.output}
    return [o for node in region for o in node.output if o and o in wanted]


def _reads(node: NodeProto) -> Iterable[str]:
    """The node's inputs and, for If/Loop/Scan, what its subgraphs read from outside."""
    yield from node.input
    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)):
            for inner in sub.node:
                yield from _reads(inner)


def _branch(region: list[NodeProto], outputs: list[str], side: str, kind: str,
            graph: GraphProto) -> GraphProto:
    """The region as one branch: each switch replaced by its `side` branch's nodes. Every
    name made inside gets a suffix, so nothing shadows a name of the outer graph."""
    made = {o for node in region for o in node.output if o}
    renamed = {name: f"{name}.{kind}" for name in made}
    body: list[NodeProto] = []
    for index, node in enumerate(region):
        if _is_switch(node):
            body.extend(_inline(node, side, renamed, f"{kind}.{index}"))
        else:
            body.append(_copy(node, renamed, f".{kind}"))
    # A graph output keeps the type the graph declares (uint16 bf16 bits where the load keeps
    # a bf16 cache: engines/ort/bf16_kv.py); any other value is left untyped, for ONNX Runtime
    # to take from the node that makes it: not all are float (a hybrid's first layer makes
    # the int64 token indices its later layers read; declared float, the load failed).
    declared = {o.name: o.type.tensor_type.elem_type for o in graph.output}
    values = [helper.make_tensor_value_info(renamed[o], declared[o], None) if o in declared
              else helper.make_empty_tensor_value_info(renamed[o]) for o in outputs]
    return helper.make_graph(body, f"edgeprefill.switches.{kind}", [], values)


def _inline(switch: NodeProto, side: str, renamed: dict[str, str],
            tag: str) -> list[NodeProto]:
    """The nodes of one switch's branch, reading the renamed region values and writing the
    switch's own outputs (renamed) where the branch wrote its outputs."""
    branch = next(a.g for a in switch.attribute if a.name == side)
    inner = {o for node in branch.node for o in node.output if o}
    local = {name: f"{name}.{tag}" for name in inner}
    for result, target in zip(branch.output, switch.output, strict=True):
        if result.name in inner:
            local[result.name] = renamed[target]
    nodes = [_copy(node, {**renamed, **local}, f".{tag}") for node in branch.node]
    for result, target in zip(branch.output, switch.output, strict=True):
        if result.name not in inner:  # the branch passes an outer value straight through
            source = renamed.get(result.name, result.name)
            nodes.append(helper.make_node("Identity", [source], [renamed[target]],
                                          name=f"{target}.{tag}.identity"))
    return nodes


def _copy(node: NodeProto, renamed: dict[str, str], suffix: str) -> NodeProto:
    twin = NodeProto()
    twin.CopyFrom(node)
    twin.name = (node.name or node.output[0]) + suffix
    for i, name in enumerate(twin.input):
        twin.input[i] = renamed.get(name, name)
    for i, name in enumerate(twin.output):
        twin.output[i] = renamed.get(name, name)
    return twin
