"""Switches the native attention into an `ort`-flavour chunk graph, in memory.

Each `com.microsoft.GroupQueryAttention` node the kernels take becomes one
`edgeprefill.PrefillAttention` on the same inputs (and the graph's `valid_lens`). It serves
every call: a chunk's rows flash-style (query blocks of a whole KV group, online softmax),
and each row of one valid token, a decode step's rows included, with `DecodeAttention`'s
own code (`decode_rows.h`: each row's positions split over the pool), bit for bit. So
no `If` on the chunk length is needed: an `If` costs ONNX Runtime ~14 us whichever branch
runs, and 30 of them were 1-3% of an fp32 bundle's decode step (docs/benchmarks.md). The
KV buffers bound to the graph's present outputs are written in place.

The bundle on disk is never changed: it stays loadable by a stock ONNX Runtime, and the
switch happens at load time only where the library is present (kernels.select).
"""

from __future__ import annotations

from onnx import ModelProto, NodeProto, helper

from edgeprefill.contract import VALID_LENS

DOMAIN = "edgeprefill"
OP = "DecodeAttention"
PREFILL_OP = "PrefillAttention"
# PREFILL_OP over a bf16 KV cache (uint16 bits), under --compute bf16 (engines/ort/bf16_kv.py)
PREFILL_BF16_KV_OP = "PrefillAttentionBf16KV"
# GroupQueryAttention inputs DecodeAttention takes (the decode rows' code as an op of its
# own, which benchmarks and tests run): qkv, past k, past v, seqlens_k (the new token's
# position when the chunk is one token), cos, sin.
KERNEL_INPUTS = (0, 3, 4, 5, 7, 8)
# PrefillAttention takes total_sequence_length (6) too: it tells a first prompt (past 0);
# and the graph's valid_lens where it has them, to skip each row's padding.
PREFILL_INPUTS = (0, 3, 4, 5, 6, 7, 8)
MAX_GROUP = 96  # query heads per KV head the prefill kernel takes (kColumns in the .cc)
# Attributes whose non-default values change the math; the kernel has none of them.
UNSUPPORTED = {"local_window_size": -1, "softcap": 0.0, "smooth_softmax": 0,
               "rotary_interleaved": 0, "qk_output": 0}


def eligible(node: NodeProto) -> bool:
    """A packed-qkv GroupQueryAttention with rotary inside and nothing the kernel lacks."""
    if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input) + [""] * (9 - len(node.input))
    packed_or_split = (not inputs[1] and not inputs[2]) or (inputs[1] and inputs[2])
    heads, kv_heads = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
    # PrefillAttention's pieces hold at most 96 (query, head) columns: one query of a group.
    group_fits = kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP
    return (
        attrs.get("do_rotary") == 1 and "scale" in attrs and group_fits
        and all(attrs.get(k, default) == default for k, default in UNSUPPORTED.items())
        and len(node.input) <= 9 and bool(packed_or_split)
        and all(inputs[i] for i in PREFILL_INPUTS) and len(node.output) == 3
    )


def add_native_attention(model: ModelProto) -> int:
    """Rewrites `model` in place; returns how many attention nodes were switched."""
    graph = model.graph
    targets = [i for i, node in enumerate(graph.node) if eligible(node)]
    if not targets:
        return 0
    valid_lens = VALID_LENS if any(i.name == VALID_LENS for i in graph.input) else None
    for i in reversed(targets):  # from the end: a Concat of split q/k/v adds a node
        gqa = graph.node[i]
        nodes = _packed(gqa, kernel_node(gqa, prefill=True, valid_lens=valid_lens))
        graph.node[i].CopyFrom(nodes[-1])
        for node in reversed(nodes[:-1]):
            graph.node.insert(i, node)
    declare_domain(model)
    return len(targets)


def declare_domain(model: ModelProto) -> None:
    """Adds this library's op domain to `model`'s opsets, once (every rewrite that puts one
    of its ops in a graph calls it)."""
    if all(o.domain != DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def kernel_node(
    gqa: NodeProto, suffix: str = "", prefill: bool = False, valid_lens: str | None = None,
) -> NodeProto:
    """The DecodeAttention node computing what `gqa` computes for a one-token chunk, or
    with `prefill` the PrefillAttention node, which the graph switch puts in for every call
    (given `valid_lens`, the graph input of each row's valid tokens, it skips the padding
    and gives rows of one token the decode rows' code)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
    op, inputs = (PREFILL_OP, PREFILL_INPUTS) if prefill else (OP, KERNEL_INPUTS)
    extra = [valid_lens] if prefill and valid_lens else []
    return helper.make_node(
        op, [gqa.input[i] for i in inputs] + extra, [o + suffix for o in gqa.output],
        domain=DOMAIN, name=gqa.name + suffix, num_heads=attrs["num_heads"],
        kv_num_heads=attrs["kv_num_heads"], scale=attrs["scale"],
    )


def _packed(gqa: NodeProto, kernel: NodeProto) -> list[NodeProto]:
    """`kernel`, after a Concat of q, k and v where the node has them apart (q/k norms)."""
    if not (len(gqa.input) > 2 and gqa.input[1]):
        return [kernel]
    packed = f"{gqa.name}.qkv"
    kernel.input[0] = packed
    return [helper.make_node("Concat", list(gqa.input[:3]), [packed], axis=-1), kernel]
