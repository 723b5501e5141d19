"""At load time, on an x86 CPU without VNNI: int8 GEMM weights handed over as uint8.

An int8 bundle's projections, and an int4 bundle's prefill projections on derived int8
weights (engines/ort/int4_prefill.py), are `com.microsoft.DynamicQuantizeMatMul`: uint8
activations times int8 weights. Without VNNI (AVX2, or AVX-512 without VNNI: AMD Zen 1-3,
Intel before Ice Lake and Alder Lake) ONNX Runtime's x86 GEMM multiplies those with
`vpmaddubsw`, which adds two products into a *saturating* int16: 2 x 255 x 127 does not
fit, so large products are clipped. On a Zen 3 one 576 x 1536 projection came out 8.3% of
its scale off the float product of the same codes (1.2% is the activations' own rounding),
and an int8 bundle's logits 22% off fp32's, against under 5% on a CPU with VNNI.

The same weights as uint8 (each code + 128) with a zero point of 128 are the same numbers,
and ONNX Runtime multiplies uint8 by uint8 with operands widened to int16 first, which
never saturates. So on such a CPU the rewrite hands the session those weights instead: no
precision is lost, and where VNNI is present nothing changes. `EDGEPREFILL_INT8_UNSIGNED`
= `auto` (default) / `on` / `off` overrides the CPU check. The bundle on disk is unchanged.
"""

from __future__ import annotations

import importlib
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto

from edgeprefill.engines.ort.derived import Derived, hand_over, initializer
from edgeprefill.engines.ort.fusing import lm_head
from edgeprefill.env_choice import env_choice
from edgeprefill.kernels.build import cpu_identity

MODE_ENV = "EDGEPREFILL_INT8_UNSIGNED"
MODES = ("auto", "on", "off")
ZERO_POINT = 128  # uint8 code - 128 = the int8 code
# Flags of the instructions that multiply uint8 by int8 without saturating.
NON_SATURATING = ("avx512_vnni", "avx_vnni", "amx_int8")
PREFIX = "edgeprefill.u8"  # every name this rewrite adds starts with it


class Int8Unsigned(NamedTuple):
    rewritten: int  # DynamicQuantizeMatMul nodes now on uint8 weights
    described: str  # what `--stats` says ("" when nothing changed)
    weights: tuple[object, ...] = ()  # the uint8 weights and their OrtValues (session-lived)


def mode() -> str:
    return env_choice(MODE_ENV, MODES)


def saturates() -> bool:
    """Whether ONNX Runtime's uint8 x int8 GEMM saturates here: an x86 CPU without VNNI
    (`EDGEPREFILL_INT8_UNSIGNED` decides when set to on or off)."""
    chosen = mode()
    if chosen != "auto":
        return chosen == "on"
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return False  # Arm's dot products widen first
    flags = cpu_flags()
    return "avx2" in flags and not any(flag in flags for flag in NON_SATURATING)


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux names them: /proc/cpuinfo's, else (Windows, macOS)
    what numpy detected. numpy knows AVX512-VNNI but not AVX-VNNI or AMX, so there a CPU
    with only those counts as saturating: uint8 weights, the same numbers, a little slower."""
    identity = cpu_identity()
    if "flags" in identity:
        return set(identity.split())
    features: dict[str, bool] = {}
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # 2, 1
        try:
            features = importlib.import_module(module).__cpu_features__
            break
        except (ImportError, AttributeError):
            continue
    names = {"AVX2": "avx2", "AVX512VNNI": "avx512_vnni"}
    return {linux for ours, linux in names.items() if features.get(ours)}


def reason() -> str:
    """Why the rewrite runs here, for `inspect` and `--stats`."""
    if mode() == "on":
        return f"({MODE_ENV}=on)"
    return "(int8 ones would saturate: this CPU has no VNNI)"


def describe() -> str:
    """What `inspect` and `--stats` say where the rewrite runs."""
    return f"uint8 weights {reason()}"


def unsigned(codes: np.ndarray) -> np.ndarray:
    """int8 codes -> the uint8 codes that are the same numbers at a zero point of 128
    (C-contiguous: the session reads them in place)."""
    return np.ascontiguousarray((codes.astype(np.int16) + ZERO_POINT).astype(np.uint8))


def zero_points(columns: int) -> np.ndarray:
    return np.full(columns, ZERO_POINT, np.uint8)


def choose(graph: ModelProto, bundle_dir: Path, session_options: Any) -> Int8Unsigned:
    """Rewrites `graph`'s DynamicQuantizeMatMul nodes on int8 initializers (per-column
    scales, no zero point) to uint8 weights with zero points, where `saturates()`."""
    initializers = {t.name: t for t in graph.graph.initializer}
    targets = [n for n in graph.graph.node if int8_projection(n, initializers)]
    if not targets or not saturates():
        return Int8Unsigned(0, "")
    derived = Derived(graph, bundle_dir)
    for node in targets:
        weight = node.input[1]
        names = [f"{PREFIX}.{weight}", f"{PREFIX}.{weight}.zero_point"]
        derived.cached(names, _deriver(graph, weight, bundle_dir))
        node.input[1] = names[0]
        while len(node.input) < 4:
            node.input.append("")
        node.input[3] = names[1]
    weights = hand_over(graph, derived.arrays, session_options)
    count = len(targets)
    return Int8Unsigned(count, f"{counted(graph, targets)} on {describe()}", weights)


def counted(graph: ModelProto, targets: list[NodeProto]) -> str:
    """"N int8 projections", naming the LM head where it is one of them (an int4 bundle
    exported with `--lm-head int8` has it alone)."""
    head = lm_head(graph.graph)
    if not any(node is head for node in targets):
        return f"{len(targets)} int8 projection{'s' if len(targets) != 1 else ''}"
    if len(targets) == 1:
        return "the LM head's int8 projection"
    return f"{len(targets)} int8 projections (the LM head among them)"


def _deriver(graph: ModelProto, weight: str,
             bundle_dir: Path) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    def derive() -> tuple[np.ndarray, np.ndarray]:
        codes = initializer(graph, weight, bundle_dir)
        return unsigned(codes), zero_points(codes.shape[1])
    return derive


def int8_projection(node: NodeProto, initializers: dict[str, TensorProto]) -> bool:
    """DynamicQuantizeMatMul(a, B int8 [K, N], scale [N]) without zero points or bias."""
    if node.op_type != "DynamicQuantizeMatMul" or node.domain != "com.microsoft":
        return False
    if len(node.input) < 3 or any(node.input[3:]):
        return False
    weight, scale = initializers.get(node.input[1]), initializers.get(node.input[2])
    return (weight is not None and scale is not None and weight.data_type == TensorProto.INT8
            and len(weight.dims) == 2 and list(scale.dims) == [weight.dims[1]])
