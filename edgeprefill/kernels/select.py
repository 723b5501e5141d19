"""At load time: the native kernels (attention, SwiGLU, RMS norm, and the Gated DeltaNet
and Mamba-2 recurrences where a model has them) or the stock graph, and which.

`EDGEPREFILL_KERNELS` picks: `auto` (the default: native when the library is built, the
bundle qualifies and the CPU has AVX-512 or AVX2 with FMA), `off` (always the stock graph)
or `require` (native wherever the library is built and the bundle qualifies; fail to load
rather than run without it). The bundle qualifies when it is an `ort`-flavour float32
graph run on the CPU; the library when `python -m edgeprefill.kernels.build` has built it
for the current sources. The CPU matters to `auto` because the kernels' vector code is
AVX-512 or AVX2 + FMA: built for a CPU with neither (Arm, older x86) the library runs
portable loops, correct but slower than ONNX Runtime's own attention (a 2,048-token
prefill took 1.6x as long on a Zen 3 before its AVX2 path, docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import NamedTuple

from edgeprefill.env_choice import env_choice
from edgeprefill.errors import BackendError
from edgeprefill.kernels.build import cpu_has_vector_kernels, library_damage, library_path
from edgeprefill.kernels.gated_delta import OP as DELTA_OP
from edgeprefill.kernels.gated_delta import fuse_gated_delta
from edgeprefill.kernels.graph import (
    OP,
    PREFILL_OP,
    add_native_attention,
    eligible,
    every_node,
    why_not_eligible,
)
from edgeprefill.kernels.mamba2_scan import OP as MAMBA2_OP
from edgeprefill.kernels.mamba2_scan import fuse_mamba2
from edgeprefill.kernels.rms_norm import OP as NORM_OP
from edgeprefill.kernels.rms_norm import fuse_skip_rms_norm
from edgeprefill.kernels.swiglu import OP as SWIGLU_OP
from edgeprefill.kernels.swiglu import fuse_swiglu

log = logging.getLogger(__name__)

MODE_ENV = "EDGEPREFILL_KERNELS"
MODES = ("auto", "off", "require")
STOCK = "GroupQueryAttention"
# Every call runs PREFILL_OP, whose rows of one token (decode) run OP's code; SiLU-gated
# MLPs (most families) run SWIGLU_OP, the residual adds with their RMS norms NORM_OP.
NO_ATTENTION = "no attention node the kernel supports"
ATTENTIONLESS = "no layer attends"
NATIVE = f"native ({PREFILL_OP} + {OP}, {SWIGLU_OP}, {NORM_OP})"


def native_described(delta_layers: int, mamba2_layers: int = 0) -> str:
    """NATIVE, naming DELTA_OP where it runs the recurrence of `delta_layers` layers and
    MAMBA2_OP where it runs that of `mamba2_layers`."""
    recurrences = _recurrences(delta_layers, mamba2_layers)
    return f"{NATIVE[:-1]}, {recurrences})" if recurrences else NATIVE


def stock_described(reason: str, delta_layers: int = 0, mamba2_layers: int = 0) -> str:
    """STOCK with `reason`, and the recurrences the native ops run all the same."""
    recurrences = _recurrences(delta_layers, mamba2_layers)
    return f"{STOCK} ({reason}){'; native ' + recurrences if recurrences else ''}"


def _recurrences(delta_layers: int, mamba2_layers: int) -> str:
    return ", ".join(f"{op} in {n} {kind} layers" for op, n, kind in (
        (DELTA_OP, delta_layers, "DeltaNet"), (MAMBA2_OP, mamba2_layers, "Mamba-2")) if n)


class KernelChoice(NamedTuple):
    described: str  # NATIVE, or STOCK with the reason: what `--stats` and `inspect` print
    library: Path | None  # when native: the backend registers it and loads the rewritten graph


def mode() -> str:
    return env_choice(MODE_ENV, MODES)


def why_not(flavor: str, dtype: str, device: str) -> str | None:
    """Why this bundle and device cannot use the native kernels, or None if they can."""
    if mode() == "off":
        return f"{MODE_ENV}=off"
    if device != "cpu":
        return f"device {device}"
    if flavor != "ort" or dtype != "float32":
        return f"needs an ort-flavour float32 bundle, this one is {flavor} {dtype}"
    try:
        path = library_path()
        built = path.is_file()
    except OSError as err:  # a cache folder this user may not enter
        return f"library unreadable: {err.strerror} ({err.filename})"
    if not built:
        return "library not built: python -m edgeprefill.kernels.build"
    damage = library_damage(path)
    if damage is not None:  # loaded, it would kill the process (SIGBUS) or raise
        reason = (f"library damaged ({damage}): python -m edgeprefill.kernels.build "
                  "builds it again")
        _warn_once(f"native kernels off: {path.name} {reason}")
        return reason
    if mode() == "auto" and not cpu_has_vector_kernels():
        return (f"this CPU has neither AVX-512 nor AVX2 with FMA: the kernels' portable loops "
                f"are slower here than ONNX Runtime's; {MODE_ENV}=require runs them")
    return None


@functools.cache
def _warn_once(line: str) -> None:
    """A damaged library slows every load down without it: said once a process."""
    log.warning(line)


def choose(graph, flavor: str, dtype: str, device: str) -> KernelChoice:
    """Native or stock, and why. `graph` is the bundle's ModelProto without weights,
    rewritten in place if native (the backend registers the library and loads it, once,
    after its other rewrites)."""
    reason = why_not(flavor, dtype, device)
    if not attends(graph):
        return without_attention(graph, reason)
    left = stock_layers(graph)  # before the rewrite, which takes the other nodes
    if reason is None and add_native_attention(graph) == 0:
        reason = no_attention_reason(graph)  # no node was rewritten: the same nodes
        if mode() != "require":
            return recurrences_only(graph, reason)
    if reason is not None:
        if mode() == "require":
            raise BackendError(f"{MODE_ENV}=require but the native kernels cannot run: {reason}")
        return KernelChoice(f"{STOCK} ({reason})", None)
    fuse_swiglu(graph)
    fuse_skip_rms_norm(graph)
    return KernelChoice(native_described(*fuse_recurrences(graph)) + left, library_path())


def attends(graph) -> bool:
    """Whether any layer of `graph` (a ModelProto) attends: a Mamba-2 model's none does."""
    return any(node.op_type == STOCK for node in every_node(graph.graph))


def without_attention(graph, reason: str | None) -> KernelChoice:
    """A graph in which no layer attends (Mamba-2): no attention to choose, the recurrences'
    and the RMS norms' ops where the library runs (`reason` None), else the stock graph."""
    if reason is not None:
        if mode() == "require":
            raise BackendError(f"{MODE_ENV}=require but the native kernels cannot run: {reason}")
        return KernelChoice(attentionless_described(reason), None)
    fuse_skip_rms_norm(graph)
    return KernelChoice(attentionless_described(None, *fuse_recurrences(graph)), library_path())


def attentionless_described(reason: str | None, delta_layers: int = 0,
                            mamba2_layers: int = 0) -> str:
    """What `--stats` and `inspect` say of a graph without attention: the native ops that
    run, or the stock graph and `reason`."""
    if reason is not None:
        return f"{ATTENTIONLESS}; stock ONNX Runtime ops ({reason})"
    recurrences = _recurrences(delta_layers, mamba2_layers)
    return f"{ATTENTIONLESS}; native ({NORM_OP}{', ' + recurrences if recurrences else ''})"


def recurrences_only(graph, reason: str) -> KernelChoice:
    """The library runs here but takes no attention node of `graph` (`reason`): the
    recurrent mixers' ops run all the same, as they read no KV cache (a hybrid whose
    attention has what the attention kernels lack, as a smooth softmax)."""
    layers = fuse_recurrences(graph)
    return KernelChoice(stock_described(reason, *layers), library_path() if any(layers) else None)


def fuse_recurrences(graph) -> tuple[int, int]:
    """Switches `graph`'s DeltaNet and Mamba-2 Scans to their ops: how many of each."""
    return fuse_gated_delta(graph), fuse_mamba2(graph)


def no_attention_reason(graph) -> str:
    """NO_ATTENTION with why the kernels take none of `graph`'s attention nodes (the
    distinct reasons of its GroupQueryAttention nodes)."""
    reasons = dict.fromkeys(why_not_eligible(n) for n in graph.graph.node
                            if n.op_type == STOCK and n.domain == "com.microsoft")
    known = [r for r in reasons if r is not None]
    return f"{NO_ATTENTION}: {'; '.join(known)}" if known else NO_ATTENTION


def stock_layers(graph) -> str:
    """Where the kernels take some but not all of `graph`'s attention nodes (a ModelProto
    not yet rewritten): "; N of M attention layers stay GroupQueryAttention (why)", what
    `--stats` and `inspect` add to NATIVE; else ""."""
    nodes = [n for n in graph.graph.node if n.op_type == STOCK and n.domain == "com.microsoft"]
    kept = [n for n in nodes if not eligible(n)]
    if not kept or len(kept) == len(nodes):
        return ""
    reasons = "; ".join(dict.fromkeys(str(why_not_eligible(n)) for n in kept))
    return f"; {len(kept)} of {len(nodes)} attention layers stay {STOCK} ({reasons})"


def takes_attention(graph) -> bool:
    """Whether any attention node of `graph` (a ModelProto) is one the kernels take."""
    return any(eligible(node) for node in graph.graph.node)


def takes_every_attention(graph) -> bool:
    """Whether the kernels take every attention node of `graph`: then nothing else reads
    the KV cache, which may then be bf16 under --compute bf16 (engines/ort/bf16_kv.py)."""
    stock = [n for n in graph.graph.node if n.op_type == STOCK and n.domain == "com.microsoft"]
    return bool(stock) and all(eligible(node) for node in stock)


def describe(flavor: str, dtype: str, device: str = "cpu") -> str:
    """What `inspect` says: the attention this bundle would run with here."""
    try:
        reason = why_not(flavor, dtype, device)
    except BackendError as err:
        return str(err)
    return NATIVE if reason is None else f"{STOCK} ({reason})"
