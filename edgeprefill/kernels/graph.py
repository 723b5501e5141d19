"""Switches the native attention into an `ort`-flavour chunk graph, in memory.

Each `com.microsoft.GroupQueryAttention` node the kernels take becomes one
`edgeprefill.PrefillAttention` on the same inputs (and the graph's `valid_lens`). It serves
every call: a chunk's rows flash-style (query blocks of a whole KV group, online softmax),
and each row of one valid token, a decode step's rows included, with `DecodeAttention`'s
own code (`decode_rows.h`: each row's positions split over the pool), bit for bit. So
no `If` on the chunk length is needed: an `If` costs ONNX Runtime ~14 us whichever branch
runs, and 30 of them were 1-3% of an fp32 bundle's decode step (docs/benchmarks.md). The
KV buffers bound to the graph's present outputs are written in place.

Where the graph packs a call's valid tokens (export/tokens.py: the layers run on [1, T, ...],
and each attention gets its qkv spread to [B, C, ...] by a Gather and its output gathered
back), the node takes the packed tokens itself (attribute packed=1, with the graph's
past_lens): the two copies per layer and the Squeeze and Reshape around them go, 4 of the
12 nodes a layer ran per decode step (fold_packing). The last layer's attention also takes
in the gather of each row's last valid token that follows it (fold_last: last=1), and
computes only that token's query block: the other outputs are never read.

The bundle on disk is never changed: it stays loadable by a stock ONNX Runtime, and the
switch happens at load time only where the library is present (kernels.select).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator

import numpy as np
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    helper,
    numpy_helper,
)

from edgeprefill.contract import PAST_LENS, VALID_LENS

DOMAIN = "edgeprefill"
LAST = "last"  # PrefillAttention's attribute: only each row's last valid token out
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
ROTARY_INPUTS = (7, 8)  # cos, sin: with do_rotary=0 the kernel nodes get "" (no rotation)
MAX_GROUP = 96  # query heads per KV head the prefill kernel takes (kColumns in the .cc)
HEAD_SINK = 11  # GroupQueryAttention's head_sink input (gpt-oss's attention sinks)
# its attention_bias input: ALiBi's per-head distance bias (BLOOM, MPT), Doge's dynamic mask,
# DeepSeek sparse attention's selection, Inkling's relative bias
ATTENTION_BIAS = 10
# Where the kernel nodes take it: DecodeAttention's input 6, PrefillAttention's 9 (after
# valid_lens and past_lens, "" where the node has none).
KERNEL_SINK, PREFILL_SINK = 6, 9
# Attributes whose non-default values change the math; the kernel has none of them.
UNSUPPORTED = {"smooth_softmax": 0, "qk_output": 0}
# GroupQueryAttention's rotary of pairs (2i, 2i + 1) (Cohere, GLM, Helium), which the
# kernels take (kernel_common.h's Rotate); 0 is halves.
INTERLEAVED = "rotary_interleaved"
# GroupQueryAttention's sliding window, which the kernels take as it is (kernel_common.h's
# FirstKey: a query sees the last `local_window_size` keys, its own included); -1 is none.
WINDOW = "local_window_size"
# Its soft-capped scores (Gemma 2: c tanh(score / c), soft_cap.h), which they take too; 0 is none.
SOFTCAP = "softcap"


# What a GroupQueryAttention attribute that is not its default means to a user.
UNSUPPORTED_WHY = {"smooth_softmax": "a smooth softmax", "qk_output": "q.k outputs"}


# Why a GroupQueryAttention with an attention_bias input stays stock, in a user's words
ATTENTION_BIAS_WHY = ("an attention_bias input (ALiBi, Doge's dynamic mask, DeepSeek's or "
                      "MiniMax-M3's sparse attention, Inkling's relative bias)")


def eligible(node: NodeProto) -> bool:
    """A GroupQueryAttention (packed qkv or q, k, v apart; rotary inside or none) with
    nothing the kernel lacks."""
    return node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft" and \
        why_not_eligible(node) is None


def why_not_eligible(node: NodeProto) -> str | None:
    """Why the kernels do not take this GroupQueryAttention, in a user's words; None if
    they do."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input) + [""] * (9 - len(node.input))
    packed_or_split = (not inputs[1] and not inputs[2]) or (inputs[1] and inputs[2])
    heads, kv_heads = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
    rotary = attrs.get("do_rotary", 0) == 1
    # Without rotary (NoPE layers: Granite-4.0-H, Nemotron-H, SmolLM3's and EXAONE 4's every
    # fourth, Cohere 2's global layers) the kernels rotate nothing: kernel_node gives them
    # no rotary tables.
    for key, default in UNSUPPORTED.items():
        if attrs.get(key, default) != default:
            return UNSUPPORTED_WHY[key]
    # PrefillAttention's pieces hold at most 96 (query, head) columns: one query of a group.
    if not (kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP):
        return f"{heads} query heads over {kv_heads} KV heads"
    # ALiBi's scores are biased by distance, Doge's by each key's values (its dynamic mask),
    # DeepSeek's and MiniMax-M3's sparse attention's mask the keys their indexers do not
    # keep, which the kernels' softmax does not add.
    if len(inputs) > ATTENTION_BIAS and inputs[ATTENTION_BIAS]:
        return ATTENTION_BIAS_WHY
    # Inputs 9 and 10 (position_ids, attention_bias) the kernels lack; 11, head_sink, they take.
    if not ("scale" in attrs and not any(node.input[9:HEAD_SINK]) and packed_or_split
            and all(inputs[i] for i in PREFILL_INPUTS if rotary or i not in ROTARY_INPUTS)
            and len(node.output) == 3):
        return "inputs or outputs the kernel does not take"
    return None


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
    fold_packing(graph)
    fold_last(graph)
    declare_domain(model)
    return len(targets)


def fold_packing(graph: GraphProto) -> int:
    """Gives each PrefillAttention of a packed-token graph its packed qkv and output: from
    Squeeze(Gather(x, spread_index, axis=1), [0]) -> attention -> Reshape([1, -1, W]) ->
    Gather(index, axis=1) to attention(x, packed=1) with past_lens as input 8. Only that
    exact chain, with the indices export/tokens.py's PackedTokens computes and values
    nothing else reads, is folded; returns how many attention nodes were."""
    names = {i.name for i in graph.input}
    if VALID_LENS not in names or PAST_LENS not in names:
        return 0
    producer = {o: n for n in graph.node for o in n.output}
    only_user, constant = _readers(graph), _int64_constants(graph)

    def made_by(value: str, op: str) -> NodeProto | None:
        node = producer.get(value)
        return node if node is not None and node.op_type == op else None

    def chain(att: NodeProto) -> tuple[NodeProto, ...] | None:
        """(Squeeze, Gather) before `att` and (Reshape, Gather) after it, or None."""
        if (att.op_type != PREFILL_OP or att.domain != DOMAIN or att.input[7:8] != [VALID_LENS]
                or any(att.input[8:PREFILL_SINK])):
            return None
        squeeze = made_by(att.input[0], "Squeeze")
        if squeeze is None or only_user(att.input[0], PREFILL_OP) is not att:
            return None
        spread = made_by(squeeze.input[0], "Gather")
        if spread is None or only_user(squeeze.input[0], "Squeeze") is not squeeze:
            return None
        reshape = only_user(att.output[0], "Reshape")
        gather = only_user(reshape.output[0], "Gather") if reshape is not None else None
        if reshape is None or gather is None:
            return None
        shapes_fit = (len(squeeze.input) == 2 and constant(squeeze.input[1]) == [0]
                      and (constant(reshape.input[1]) or [])[:2] == [1, -1])
        indices_fit = (axis(spread) == 1 and axis(gather) == 1
                       and _spread_index(producer, spread.input[1])
                       and _packed_index(producer, gather.input[1]))
        return (squeeze, spread, reshape, gather) if shapes_fit and indices_fit else None

    dropped: set[int] = set()
    count = 0
    for att in graph.node:
        found = chain(att)
        if found is None:
            continue
        squeeze, spread, reshape, gather = found
        att.input[0] = spread.input[0]
        if len(att.input) > 8:  # a head_sink after it
            att.input[8] = PAST_LENS
        else:
            att.input.append(PAST_LENS)
        att.output[0] = gather.output[0]
        att.attribute.append(helper.make_attribute("packed", 1))
        dropped.update(id(n) for n in found)
        count += 1
    rewrite_nodes(graph, dropped=dropped)
    return count


def fold_last(graph: GraphProto) -> int:
    """Gives the last layer's attention only each row's last valid token to compute: from
    attention(packed=1) -> Squeeze([0]) -> GatherND(last_index), the gather export/tokens.py's
    PackedTokens.last puts after it, to attention(packed=1, last=1) -> Squeeze([0]). The op
    then computes one query block per row instead of all of them (its output: [1, B, H*D],
    the same bits). Only that exact chain, with that index and nothing else reading the
    attention's or the Squeeze's output, is folded; returns how many attention nodes were."""
    producer = {o: n for n in graph.node for o in n.output}
    only_user, constant = _readers(graph), _int64_constants(graph)

    def squeezes_axis_0(node: NodeProto) -> bool:
        return len(node.input) == 2 and constant(node.input[1]) == [0]

    dropped: list[NodeProto] = []
    for att in graph.node:
        if att.op_type != PREFILL_OP or att.domain != DOMAIN or int_attribute(att, "packed") != 1:
            continue
        squeeze = only_user(att.output[0], "Squeeze")
        gather = only_user(squeeze.output[0], "GatherND") if squeeze is not None else None
        if (squeeze is None or gather is None or not squeezes_axis_0(squeeze)
                or gather.input[0] != squeeze.output[0] or int_attribute(gather, "batch_dims")
                or not _last_index(producer, gather.input[1])):
            continue
        att.attribute.append(helper.make_attribute(LAST, 1))
        squeeze.output[0] = gather.output[0]
        dropped.append(gather)
    rewrite_nodes(graph, dropped={id(n) for n in dropped})
    return len(dropped)


def takes_last_rows(node: NodeProto) -> bool:
    """Whether `node` is an attention fold_last gave the last-token gather: its output 0 has
    one row per sequence (what int4_prefill.after_gather looks for after the GatherND).
    Any op of this library's domain with last=1: PrefillAttention, or the
    PrefillAttentionBf16KV bf16_kv makes of it."""
    return node.domain == DOMAIN and int_attribute(node, LAST) == 1


def every_node(graph: GraphProto) -> Iterator[NodeProto]:
    """Every node of `graph`, those in subgraphs (the load-time switches' If branches, any
    Loop or Scan body) too, each before its subgraphs' nodes."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from every_node(sub)


def subgraphs(node: NodeProto) -> list[GraphProto]:
    """The node's own subgraphs (an If's two branches, a Loop's or Scan's body)."""
    return [a.g for a in node.attribute if a.type == AttributeProto.GRAPH] + [
        g for a in node.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]


def readers_with_subgraphs(graph: GraphProto) -> Counter[str]:
    """How many nodes read each value of `graph`: its own nodes, and any node of their
    subgraphs (which read the graph's values by name, not as inputs)."""
    readers: Counter[str] = Counter()
    for node in graph.node:
        readers.update(node.input)
        for sub in subgraphs(node):
            for inner in every_node(sub):
                readers.update(inner.input)
    return readers


def rewrite_nodes(graph: GraphProto, replaced: dict[int, NodeProto] | None = None,
                  dropped: set[int] | None = None) -> None:
    """Rebuilds graph.node in place, in order: a node whose id() is in `replaced` becomes its
    replacement, one in `dropped` goes (the folds' last step)."""
    swap, drop = replaced or {}, dropped or set()
    if not swap and not drop:
        return
    kept = [swap.get(id(n), n) for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(kept)


def forget_values(graph: GraphProto, names: set[str]) -> None:
    """Drops the shapes `graph` records for values no node makes any more (a fold's)."""
    kept = [v for v in graph.value_info if v.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(kept)


def consumers_of(graph: GraphProto) -> dict[str, list[NodeProto]]:
    """Each value's reading nodes, in graph order (a value nothing reads: an empty list)."""
    consumers: dict[str, list[NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    return consumers


def int_attribute(node: NodeProto, name: str, default: int = 0) -> int:
    """An int attribute of `node` (its `i` field), `default` where it has none."""
    return next((a.i for a in node.attribute if a.name == name), default)


def float_attribute(node: NodeProto, name: str, default: float) -> float:
    """A float attribute of `node` (its `f` field), `default` where it has none."""
    return next((a.f for a in node.attribute if a.name == name), default)


def axis(node: NodeProto) -> int:
    """The node's `axis` attribute, 0 where it has none (ONNX's default for Split and Gather)."""
    return int_attribute(node, "axis")


def _readers(graph: GraphProto) -> Callable[[str, str], NodeProto | None]:
    """only_user(value, op): the one node reading `value` where it is an `op` and `value` is
    no graph output, else None (the folds' test that a chain is theirs alone)."""
    consumers = consumers_of(graph)
    outputs = {o.name for o in graph.output}

    def only_user(value: str, op: str) -> NodeProto | None:
        users = consumers[value]
        ok = len(users) == 1 and users[0].op_type == op and value not in outputs
        return users[0] if ok else None

    return only_user


def _int64_constants(graph: GraphProto) -> Callable[[str], list[int] | None]:
    """constant(value): an int64 initializer's values as a list, None for any other value."""
    constants = {t.name: t for t in graph.initializer
                 if t.data_location != TensorProto.EXTERNAL and t.data_type == TensorProto.INT64}

    def constant(value: str) -> list[int] | None:
        t = constants.get(value)
        return None if t is None else np.atleast_1d(numpy_helper.to_array(t)).tolist()

    return constant


def _spread_index(producer: dict[str, NodeProto], value: str) -> bool:
    """PackedTokens.spread_index: Add(Unsqueeze(starts), clamped positions)."""
    node = producer.get(value)
    return node is not None and node.op_type == "Add" and any(
        (producer.get(i) is not None and producer[i].op_type == "Unsqueeze") for i in node.input)


def _packed_index(producer: dict[str, NodeProto], value: str) -> bool:
    """PackedTokens.index: Squeeze(NonZero(the flattened valid-token mask))."""
    node = producer.get(value)
    inner = producer.get(node.input[0]) if node is not None and node.op_type == "Squeeze" else None
    return inner is not None and inner.op_type == "NonZero"


def _last_index(producer: dict[str, NodeProto], value: str) -> bool:
    """PackedTokens.last_index: Unsqueeze(Sub(CumSum(the valid lengths), 1))."""
    node = producer.get(value)
    sub = producer.get(node.input[0]) if node is not None and node.op_type == "Unsqueeze" else None
    ends = producer.get(sub.input[0]) if sub is not None and sub.op_type == "Sub" else None
    return ends is not None and ends.op_type == "CumSum"


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
    and gives rows of one token the decode rows' code). A sliding window, a softcap and
    interleaved rotary go along; without rotary (do_rotary=0) the rotary tables are "",
    which the ops take as no rotation; attention sinks (head_sink) go to input KERNEL_SINK
    or PREFILL_SINK."""
    attrs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
    op, inputs = (PREFILL_OP, PREFILL_INPUTS) if prefill else (OP, KERNEL_INPUTS)
    given = list(gqa.input) + [""] * (9 - len(gqa.input))
    if attrs.get("do_rotary", 0) != 1:
        for i in ROTARY_INPUTS:
            given[i] = ""
    extra = [valid_lens] if prefill and valid_lens else []
    sink = gqa.input[HEAD_SINK] if len(gqa.input) > HEAD_SINK else ""
    if sink:
        at = PREFILL_SINK if prefill else KERNEL_SINK
        extra += [""] * (at - len(inputs) - len(extra)) + [sink]
    math = {WINDOW: attrs[WINDOW]} if attrs.get(WINDOW, -1) > 0 else {}
    if attrs.get(SOFTCAP, 0.0) > 0.0:
        math[SOFTCAP] = attrs[SOFTCAP]
    if attrs.get(INTERLEAVED, 0) == 1 and attrs.get("do_rotary", 0) == 1:
        math[INTERLEAVED] = 1
    return helper.make_node(
        op, [given[i] for i in inputs] + extra, [o + suffix for o in gqa.output],
        domain=DOMAIN, name=gqa.name + suffix, num_heads=attrs["num_heads"],
        kv_num_heads=attrs["kv_num_heads"], scale=attrs["scale"], **math,
    )


def _packed(gqa: NodeProto, kernel: NodeProto) -> list[NodeProto]:
    """`kernel`, after a Concat of q, k and v where the node has them apart (q/k norms)."""
    if not (len(gqa.input) > 2 and gqa.input[1]):
        return [kernel]
    packed = f"{gqa.name}.qkv"
    kernel.input[0] = packed
    return [helper.make_node("Concat", list(gqa.input[:3]), [packed], axis=-1), kernel]
