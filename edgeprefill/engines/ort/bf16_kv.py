"""At load time, under `--compute bf16`: a bf16 KV cache where every attention layer runs
the native kernels.

With AVX512-BF16 the prefill attention's products already read the cache as bf16
(bf16_compute.py): each call rounded the float32 keys and values it needed to bf16 pairs,
a pass over the whole past on every chunk. Keeping the cache in bf16 makes that pass the
write (each key and value rounded to nearest even once, when it is computed), halves the
cache's memory (twice the slots in the same `kv_budget_bytes`), and halves what a decode
step's attention reads. Decode attention still multiplies in float32, on the cache's bf16
values (exact in float32). Without AVX512-BF16 (AVX2, AVX-512F, NEON) the products stay
float32 and a chunk reads a float32 copy of the cache's values, made once per call: the
cache halves all the same, and a decode step's attention reads half the bytes (0.65-0.74x
its time over a float32 cache on a Zen 3, docs/benchmarks.md, stop 59), at the price of
attending over keys and values rounded to bf16.

Each `PrefillAttention` becomes `PrefillAttentionBf16KV`, and the graph's past and present
KV become uint16 tensors of bf16 bits: numpy and ONNX Runtime's Python binding have no
bf16 type, and nothing but the kernel reads the values. The backend allocates its arena in
uint16; slot copies and swaps move bytes and do not care.

`EDGEPREFILL_BF16_KV=off` keeps the float32 cache (A/B measurements; with AVX512-BF16 the
chunk's products give the same bits either way, decode rows differ by the cache's
rounding; without it every row does).
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, ModelProto, NodeProto, TensorProto

from edgeprefill.contract import KVPair
from edgeprefill.env_choice import env_choice
from edgeprefill.kernels.graph import DOMAIN, PREFILL_BF16_KV_OP, PREFILL_OP, every_node

MODE_ENV = "EDGEPREFILL_BF16_KV"
MODES = ("auto", "off")
DTYPE = np.dtype(np.uint16)  # the arena's element type: bf16 bits


def mode() -> str:
    return env_choice(MODE_ENV, MODES)


def why_not_here() -> str | None:
    """Why no load here keeps a bf16 cache, whatever the bundle, or None: turned off.
    `inspect` asks this too."""
    if mode() == "off":
        return f"{MODE_ENV}=off"
    return None


def why_not(graph: ModelProto, pairs: list[KVPair], attention_bf16: int) -> str | None:
    """Why this load keeps a float32 cache, or None: why_not_here, no bf16 prefill
    attention, or a KV input that something other than a bf16 PrefillAttention reads."""
    here = why_not_here()
    if here is not None:
        return here
    if not attention_bf16:
        return "the attention is not the native kernels' in bf16"
    names = {name for pair in pairs for name in pair}
    for node in every_node(graph.graph):
        if any(name in names for name in node.input) and not _bf16_attention(node):
            return f"{node.op_type} reads the KV cache"
    return None


def switch(graph: ModelProto, pairs: list[KVPair]) -> None:
    """Rewrites `graph` in place: bf16-cache attention ops, uint16 KV inputs and outputs.
    Call only where why_not() is None."""
    for node in every_node(graph.graph):
        if _bf16_attention(node):
            node.op_type = PREFILL_BF16_KV_OP
    names = {name for pair in pairs for name in pair}
    # value_info: shape inference's record, if the bundle kept one
    for value in (*graph.graph.input, *graph.graph.output, *graph.graph.value_info):
        if value.name in names:
            value.type.tensor_type.elem_type = TensorProto.UINT16


def _bf16_attention(node: NodeProto) -> bool:
    attrs = {a.name: a.i for a in node.attribute if a.type == AttributeProto.INT}
    return node.domain == DOMAIN and node.op_type == PREFILL_OP and attrs.get("bf16") == 1

