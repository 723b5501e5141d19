"""JetMoE's mixture of attention heads (JetMoeMoA): per-token routed experts for the query
and output projections, over keys and values every expert shares.

Each token's router (the MLP experts' own kind: the top k logits, softmax over those k,
export/moe.py) picks k experts. Expert e's query projection gives the token KV heads of
queries, so a token has k * KV query heads; query head (slot s, head j) attends over KV
head j (transformers repeats the keys k times: head s * KV + j reads KV head j). Each
slot's attention output [KV*D] goes through its expert's output projection, times the
slot's weight; the k slots are summed and the block's bias added.

How it maps onto the contract: the cache is the KV heads transformers caches, and the
attention is the flavours' grouped-query attention with k * KV query heads in groups of
k, the queries ordered KV head first ([KV, k, D]: head j * k + s reads KV head j, which is
the slot's head j above). Both projections are the unrolled dispatch of export/moe.py
(each expert's MatMul on the slots that chose it), so quantized bundles quantize them as
any projection.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeprefill.export.checkpoint import Checkpoint
from edgeprefill.export.experts import MoaNames
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.moe import MixtureOfExperts
from edgeprefill.export.weights import GraphWeights


class MixtureOfAttention:
    """The routed query and output projections of a layer; the router is `router`'s (a
    MixtureOfExperts over the attention experts' router, width KV*D)."""

    def __init__(self, router: MixtureOfExperts, names: MoaNames, kv_heads: int,
                 head_dim: int) -> None:
        self.router, self.names = router, names
        self.g: GraphBuilder = router.g
        self.w: GraphWeights = router.w
        self.ckpt: Checkpoint = router.ckpt
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.hidden, self.dtype = router.hidden, router.dtype
        self.experts, self.top_k = router.moe.experts, router.moe.top_k

    @property
    def width(self) -> int:
        """One expert's query projection: KV heads of head_dim."""
        return self.kv_heads * self.head_dim

    def queries(self, p: str, h: str) -> str:
        """h [..., H] -> its k * KV query heads [..., KV*k*D], KV head first."""
        g, k = self.g, self.top_k
        x = g.op("Reshape", [h, g.const([-1, self.hidden])])  # [N, H]
        chosen, _ = self.router.route(p, x)
        slots = g.op("Reshape", [self._project(p, x, chosen, self.names.queries, self.width,
                                               self.hidden, of_tokens=True),
                                 g.const([-1, k, self.kv_heads, self.head_dim])])
        grouped = g.op("Transpose", [slots], perm=[0, 2, 1, 3])  # [N, KV, k, D]
        return g.op("Reshape", [grouped, self._shape(h, k * self.width)])

    def output(self, p: str, h: str, attn: str) -> str:
        """The block's output [..., H] of attention's attn [..., KV*k*D] (queries' order) of
        the tokens h [..., H] (the same tokens: routed again, as they were for their
        queries)."""
        g, k = self.g, self.top_k
        x = g.op("Reshape", [h, g.const([-1, self.hidden])])  # [N, H]
        chosen, weights = self.router.route(p, x)
        heads = g.op("Reshape", [attn, g.const([-1, self.kv_heads, k, self.head_dim])])
        slots = g.op("Reshape", [g.op("Transpose", [heads], perm=[0, 2, 1, 3]),
                                 g.const([-1, self.width])])  # [N k, KV*D], slot order
        out = self._project(p, slots, chosen, self.names.outputs, self.hidden, self.width,
                            of_tokens=False)  # [N k, H]
        weighed = g.op("Mul", [out, g.op("Reshape", [weights, g.const([-1, 1])])])
        summed = g.op("ReduceSum", [g.op("Reshape", [weighed, g.const([-1, k, self.hidden])]),
                                    g.const([1])], keepdims=0)
        bias = p + self.names.bias
        self.w.check_shapes([(bias, (self.hidden,))], f"hidden_size {self.hidden}")
        return g.op("Reshape", [g.op("Add", [summed, self.w.tensor(bias)]),
                                g.op("Shape", [h])])

    def keys_values(self, p: str, h: str) -> tuple[str, str]:
        """The shared keys and values [..., KV*D] of h (kv_proj: keys first)."""
        name = p + self.names.kv
        self.w.check_shapes([(name, (2 * self.width, self.hidden))],
                            f"{self.kv_heads} KV heads of {self.head_dim}, hidden "
                            f"{self.hidden}")
        kv = self.w.linear(h, [name], None)
        k, v = self.g.op("Split", [kv], 2, axis=-1, num_outputs=2)
        return k, v

    def _project(self, p: str, x: str, chosen: str, name: str, rows: int, cols: int,
                 of_tokens: bool) -> str:
        """[N k, rows]: each slot's expert's [rows, cols] projection (of the fused [E, rows,
        cols] tensor `name`) of its input: the slot's token's row of x [N, cols], or
        (of_tokens False) the slot's own row of x [N k, cols]."""
        g, fused = self.g, p + name
        self.w.check_shapes([(fused, (self.experts, rows, cols))],
                            f"{self.experts} experts, {self.kv_heads} KV heads of "
                            f"{self.head_dim}, hidden {self.hidden}")
        slots = self.router.expert_slots(chosen)
        outputs = []
        for e, slot in enumerate(slots):
            index = g.op("Div", [slot, g.const(self.top_k)]) if of_tokens else slot
            rows_e = g.op("Gather", [x, index], axis=0)  # [n_e, cols]
            outputs.append(self.w.project(rows_e, f"{fused}.{e}", cols, rows,
                                          self._reader(fused, e)))
        flat = g.op("Reshape", [chosen, g.const([-1])])  # [N k]
        return self.router.at_slots(slots, outputs, flat, rows)

    def _reader(self, fused: str, e: int) -> Callable[[], np.ndarray]:
        return lambda: self.ckpt.get_index(fused, e)

    def _shape(self, h: str, width: int) -> str:
        """h's leading dims with a last one of `width`."""
        g = self.g
        lead = g.op("Slice", [g.op("Shape", [h]), g.const([0]), g.const([-1])])
        return g.op("Concat", [lead, g.const([width])], axis=0)
