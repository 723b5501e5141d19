"""At load time, where the native kernels run: a float32 bundle's projections (every MatMul
on a float32 weight, and the LM head's Gemm) run `edgeprefill.MatMulF32`
(edgeprefill/kernels/matmul_f32.cc) instead of ONNX Runtime's MatMul, on the same weights
repacked here into its panels, in float32 (the default `--compute fp32`).

Why: a decode step reads every weight once for its few rows, so it is bound by memory, and
ONNX Runtime's MatMul (MLAS) streams a one-row product at about half the bandwidth a BLAS
GEMV gets from the same two cores (25 against 48 GB/s on a Zen 3, docs/benchmarks.md).
MatMulF32's decode tiles stream whole cache lines through as many accumulators as the
registers hold, the rows of a batched step sharing each weight they read; its prefill
tiles multiply at MLAS's rate. Every output is one float32 sum over k in order, whichever
rows a call holds, so a row gets the same bits alone, beside others or inside a chunk (the
fused steps' condition, engines/ort/fusing.py). Against MLAS's, sums differ by rounding
only (a few units in the last place); both are transformers' numbers to the tests' 1e-4.

The packed weights take the original ones' place in memory (ONNX Runtime drops initializers
no node reads; MLAS kept a packed copy of its own before). `EDGEPREFILL_F32_PROJECTIONS=off`
keeps ONNX Runtime's MatMul.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from onnx import ModelProto

from edgeprefill.engines.ort.derived import Derived, hand_over
from edgeprefill.engines.ort.projections import replace_projections
from edgeprefill.env_choice import env_choice
from edgeprefill.errors import BackendError
from edgeprefill.kernels.build import cpu_has_vector_kernels
from edgeprefill.kernels.graph import declare_domain
from edgeprefill.kernels.targets import is_arm64

OP = "MatMulF32"
PREFIX = "edgeprefill.f32"  # every name this rewrite adds starts with it
MODE_ENV = "EDGEPREFILL_F32_PROJECTIONS"
MODES = ("auto", "off")
PANEL = 64  # columns per panel (kPanel in the .cc)
STRIP = 16  # columns per strip (kStrip)


class F32Projections(NamedTuple):
    rewritten: int  # projections now running MatMulF32 (0: the graph is unchanged)
    described: str  # what `--stats` says ("" when nothing changed)
    weights: tuple[object, ...] = ()  # the packed weights and their OrtValues (session-lived)


def why_not(native: bool) -> str | None:
    """Why float32 projections keep ONNX Runtime's MatMul here, or None: turned off, no
    native kernels, or a CPU whose build has no vector code for them (AVX-512, AVX2 with
    FMA, NEON: elsewhere its portable loops would be far slower than MLAS)."""
    value = env_choice(MODE_ENV, MODES)
    if value == "off":
        return f"{MODE_ENV}=off"
    if not native:
        return "no native kernels"
    if not (cpu_has_vector_kernels() or is_arm64()):
        return "this CPU has neither AVX-512, AVX2 with FMA nor NEON"
    return None


def describe(native: bool) -> str:
    """What `inspect` says runs a float32 bundle's projections here."""
    try:
        reason = why_not(native)
    except BackendError as err:
        return str(err)
    return f"{OP} (native)" if reason is None else f"ONNX Runtime's MatMul ({reason})"


def choose(graph: ModelProto, bundle_dir: Path, compute: str, native: bool,
           session_options: Any) -> F32Projections:
    """Rewrites `graph`'s float32 projections in place for MatMulF32 (weights not loaded:
    they stay in `bundle_dir` until derived) where it runs here and the compute is fp32."""
    if compute != "fp32" or why_not(native) is not None:
        return F32Projections(0, "")
    derived = Derived(graph, bundle_dir)
    rewritten = replace_projections(graph, derived, OP, PREFIX, pack)
    if not rewritten:
        return F32Projections(0, "")
    declare_domain(graph)
    weights = hand_over(graph, derived.arrays, session_options)
    return F32Projections(rewritten, f"{rewritten} float32 projections: {OP}", weights)


def pack(weight: np.ndarray) -> np.ndarray:
    """[K, N] float32 -> [ceil(N / 64), 4, K, 16]: panel p, strip s, row k holds columns
    64 p + 16 s .. + 15 of row k; zeros past N. A panel at a time: the load's extra memory
    is one panel, not a copy of the whole weight."""
    k, n = weight.shape
    panels = -(-n // PANEL)
    out = np.zeros((panels, PANEL // STRIP, k, STRIP), np.float32)
    for p in range(panels):
        columns = np.asarray(weight[:, p * PANEL:(p + 1) * PANEL], np.float32)
        padded = np.zeros((k, PANEL), np.float32)
        padded[:, :columns.shape[1]] = columns
        out[p] = padded.reshape(k, PANEL // STRIP, STRIP).transpose(1, 0, 2)
    return out
