"""At load time, when the user asks for it (`--compute bf16`): a float32 bundle's
projections and every bundle's prefill attention run in bf16.

Every MatMul on a weight (and the LM head's Gemm) becomes `edgeprefill.MatMulBf16`
(edgeprefill/kernels/matmul_bf16.cc): the weight is rounded to bf16 here, once, and packed
into the kernel's panels; the activations are rounded on each call; the products are summed
in float32. The prefill attention's two products (scores, and probabilities times values)
take bf16 operands the same way (`PrefillAttention` with bf16=1, rounding the float32
cache's blocks as it reads them). That is what OpenVINO does by default on CPUs with bf16
instructions. With AVX512-BF16 a prefill chunk multiplies at twice the fp32 rate and a
decode step reads half the weight bytes. Without it (AVX2, AVX-512F, NEON: widens_bf16) the
projections widen their bf16 weights to fp32 as they read them, the same numbers at the
fp32 rate, a decode step still reading half the bytes; the attention's products stay
float32. Either way, where every attention layer runs the native kernels, the KV cache is
bf16 (bf16_kv.py). The softmax, norms and decode attention's products stay float32
everywhere.

Not exact: logits move by about bf16's rounding (8 bits of mantissa), so greedy text can
part from the fp32 run's after some tokens. fp32 stays the default. The bundle on disk is
never changed; the packed weights live in memory instead of the fp32 ones (ONNX Runtime
drops initializers no node uses). An int8 or int4 bundle keeps its quantized projections
(they already compute below fp32) and gets the bf16 prefill attention only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from onnx import GraphProto, ModelProto, helper

from edgeprefill.contract import KVPair
from edgeprefill.engines.base import COMPUTES
from edgeprefill.engines.ort import bf16_kv
from edgeprefill.engines.ort.derived import Derived, hand_over
from edgeprefill.engines.ort.projections import replace_projections
from edgeprefill.errors import BackendError
from edgeprefill.kernels.build import cpu_has_bf16, cpu_has_vector_kernels
from edgeprefill.kernels.graph import DOMAIN, PREFILL_OP, declare_domain, every_node
from edgeprefill.kernels.select import STOCK
from edgeprefill.kernels.targets import is_arm64

OP = "MatMulBf16"
PANEL = 64  # columns per packed panel (kPanel in the .cc)
PREFIX = "edgeprefill.bf16"


class Bf16Compute(NamedTuple):
    rewritten: int  # nodes now computing in bf16 (0: the graph is unchanged)
    described: str  # what `--stats` says: "fp32" or how bf16 runs here
    weights: tuple[object, ...] = ()  # the packed weights and their OrtValues (session-lived)
    kv_dtype: np.dtype | None = None  # the arena's element type where the cache is bf16


def widens_bf16() -> bool:
    """Whether MatMulBf16 runs vector code without AVX512-BF16: AVX-512F, AVX2 with FMA
    or NEON widen each bf16 weight to fp32 and multiply with fp32 FMAs (matmul_bf16.cc):
    a prefill chunk at the fp32 rate, a decode step reading half the weight bytes.
    Elsewhere its portable loops run far slower than fp32."""
    return not cpu_has_bf16() and (cpu_has_vector_kernels() or is_arm64())


def describe_bf16(projections: bool = True, attention: bool = True,
                  kv_cache: bool = False, attends: bool = True) -> str:
    """What runs in bf16 here: the float32 projections (if the bundle has them), with
    AVX512-BF16 the prefill attention's products (`attention`: the native kernels take
    the bundle's attention; else it stays GroupQueryAttention, in fp32, where any layer
    `attends`), and the KV cache (`kv_cache`: bf16_kv.why_not found nothing else reading
    it)."""
    fast, widened = cpu_has_bf16(), widens_bf16()
    how = "" if fast else " on fp32 FMAs" if widened else " in portable loops"
    ran = [OP + how] if projections else []
    if fast and attention:
        ran.append(f"{PREFILL_OP}'s products")
    if attention and kv_cache:
        ran.append("the KV cache")
    notes = ["AVX512-BF16" if fast else "this CPU has no AVX512-BF16" + (
        "" if not projections else
        ": prefill no faster than fp32, decode reads half the weight bytes" if widened else
        ": slower than fp32")]
    if not attention:
        if attends:
            notes.append(f"the attention {STOCK}, in fp32")
    elif not fast:
        notes.append(f"{PREFILL_OP} in fp32")
    if not projections:
        notes.append("the quantized projections as exported")
    return f"bf16 ({' and '.join(ran) or 'nothing'}; {'; '.join(notes)})"


def choose(graph: ModelProto, bundle_dir: Path, compute: str, kernels_described: str,
           native: bool, session_options: Any, pairs: list[KVPair]) -> Bf16Compute:
    """Rewrites `graph` in place for bf16 compute, or leaves it for fp32. A quantized
    bundle's projections keep their int8/int4 kernels; its prefill attention goes bf16, and
    its KV cache (the arena's `pairs`) too where nothing else reads it."""
    if compute not in COMPUTES:
        raise BackendError(f"compute {compute!r}: choose one of {', '.join(COMPUTES)}")
    if compute == "fp32":
        return Bf16Compute(0, "fp32")
    if not native:
        raise BackendError(f"--compute bf16 needs the native kernels, and this load runs "
                           f"{kernels_described}")
    derived = Derived(graph, bundle_dir)
    targets = replace_projections(graph, derived, OP, PREFIX, pack)
    attention = _attention_in_bf16(graph.graph)
    if not targets and not attention:
        raise BackendError("--compute bf16 found nothing to run in bf16: no float32 "
                           "projection and no native prefill attention in this bundle")
    kv_cache = bf16_kv.why_not(graph, pairs, attention) is None
    if kv_cache:
        bf16_kv.switch(graph, pairs)
    declare_domain(graph)
    weights = hand_over(graph, derived.arrays, session_options) if derived.arrays else ()
    described = describe_bf16(bool(targets), bool(attention), kv_cache, bool(pairs))
    return Bf16Compute(targets + attention, described, weights,
                       bf16_kv.DTYPE if kv_cache else None)


def _attention_in_bf16(graph: GraphProto) -> int:
    """Sets bf16=1 on every PrefillAttention: its two products then run on bf16 operands too
    (prefill_attention.cc). Its rows of one token (decode) keep float32 products: they are
    bound by reading the cache, not by multiplying (which bf16_kv.py halves). Returns how
    many."""
    attention = [n for n in every_node(graph) if n.op_type == PREFILL_OP and n.domain == DOMAIN]
    for node in attention:
        node.attribute.append(helper.make_attribute("bf16", 1))
    return len(attention)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> its bf16 rounding (to nearest even) as uint32 values below 2**16."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16


def pack(weight: np.ndarray) -> np.ndarray:
    """[K, N] float32 -> [ceil(N/64), ceil(K/2), 64] int32: each int32 the bf16 pair
    (row 2i, row 2i+1) of one column, low half first; zeros past K and N. Packed a panel at a
    time: the load's extra memory is one panel, not copies of the whole weight (the LM head
    of a 49k vocabulary is 113 MB in fp32)."""
    k, n = weight.shape
    k2, panels = -(-k // 2), -(-n // PANEL)
    out = np.empty((panels, k2, PANEL), np.uint32)
    padded = np.zeros((2 * k2, PANEL), np.float32)
    for p in range(panels):
        columns = weight[:, p * PANEL:(p + 1) * PANEL]
        padded[:k, :columns.shape[1]] = columns
        padded[:k, columns.shape[1]:] = 0.0
        bits = bf16_bits(padded)
        out[p] = bits[0::2] | (bits[1::2] << 16)
    return out.view(np.int32)
