"""ONNX Runtime's GPU execution providers: which run, their options, and where the nodes went.

- CUDA EP: the chunk graph as exported; the arena grows only by what is asked for, since on
  a Jetson the GPU shares the board's memory with everything else.
- TensorRT EP (`--device tensorrt`): refused. It runs a session on optimization profile 0
  only, so a single profile would have to cover every chunk and decode batch the scheduler
  sends, the `standard` graph's in-place KV update needs TensorRT >= 10.15's parser under
  ONNX Runtime, and none of that can be checked without a GPU. The `tensorrt` backend
  (`edgeprefill build`, one profile per bucket, chunks padded, decode batches split) is the
  TensorRT path; the CUDA EP is the ONNX Runtime one.
- CUDA and cuDNN from pip (`onnxruntime-gpu[cuda,cudnn]`, or PyTorch's `nvidia-*` packages)
  need not be on the loader's path: ONNX Runtime's `preload_dlls` loads them before the
  first GPU session (`load_cuda_libraries`), else the provider may fail to load and the
  session quietly run on the CPU.
- ONNX Runtime falls back to the CPU per node without failing. A GPU session records which
  provider got each node: a KV write (TensorScatter, or the ort flavour's
  GroupQueryAttention, whose CUDA kernel is fp16/bf16 only) on the CPU is an error (every
  step would copy the cache across the bus); other nodes there are one line.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from edgeprefill.bundle import Manifest
from edgeprefill.engines.gpu_libs import ORT_GPU_HINT, version_tuple
from edgeprefill.engines.trt.cache import ENGINES_DIR
from edgeprefill.errors import BackendError

TRT_EP = "TensorrtExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
ORT_TRT_CACHE = "ort-trt"  # under BUNDLE/engines/ (left by earlier versions)
ASSIGNMENT_ENTRY = "session.record_ep_graph_assignment_info"
KV_WRITE_OP = "TensorScatter"  # the standard graph's in-place KV write
# The first onnxruntime-gpu with a CUDA TensorScatter kernel (PR 27446): 1.25.0's
# libonnxruntime_providers_cuda.so has onnxruntime::cuda::TensorScatter, 1.24.4's has none.
MIN_ORT_GPU = "1.25"
log = logging.getLogger("edgeprefill")
# The ops that write the KV cache in each flavour -> what to do when one is on the CPU.
KV_WRITE_OPS = {
    KV_WRITE_OP: f"install onnxruntime-gpu>={MIN_ORT_GPU}",
    # ONNX Runtime's CUDA GroupQueryAttention is float16 and bfloat16 only.
    "GroupQueryAttention": "for the CUDA provider export the ort flavour with --dtype fp16, "
                           "or the standard flavour",
}
# Shape and position arithmetic that ONNX Runtime places on the CPU on purpose.
SHAPE_OPS = frozenset({"Shape", "Size", "Squeeze", "Unsqueeze", "Slice", "Cast", "Add", "Sub",
                       "Gather", "Concat", "Reshape", "Range", "ConstantOfShape"})

# device -> why it is refused and what works instead (one line each).
REFUSED_DEVICES = {
    "tensorrt": (
        "--device tensorrt (ONNX Runtime's TensorRT provider) is not supported: it runs only "
        "its first optimization profile, which cannot cover the padded prefill chunks and "
        "decode batches edgeprefill sends; use the TensorRT backend (`edgeprefill build "
        "BUNDLE`, then `--backend tensorrt`) or ONNX Runtime's CUDA provider (`--device cuda`)"
    ),
}


@dataclass(frozen=True)
class GpuSettings:
    cache_dir: Path  # engines folder of the bundle (or --engine-dir)
    capacity: int  # KV positions per slot
    fp16: bool = False  # the bundle's weights are float16
    device_id: int = 0


def refuse_device(device: str) -> None:
    """BackendError naming what works instead when `device` is a refused provider."""
    reason = REFUSED_DEVICES.get(device)
    if reason is not None:
        raise BackendError(reason)


def gpu_settings(bundle_dir: Path, manifest: Manifest, engine_dir: Path | None) -> GpuSettings:
    """Settings for a bundle: the capacity of its max context, float16 when its weights are."""
    root = engine_dir or bundle_dir / ENGINES_DIR
    return GpuSettings(
        cache_dir=root / ORT_TRT_CACHE,
        capacity=manifest.max_context,
        fp16=manifest.graph.dtype == "float16",
    )


def provider_options(
    providers: list[str], manifest: Manifest, settings: GpuSettings
) -> list[dict[str, str]]:
    """One options dict per provider name, in order (InferenceSession's provider_options)."""
    return [cuda_options(settings) if name == CUDA_EP else {} for name in providers]


def cuda_options(settings: GpuSettings) -> dict[str, str]:
    options = {"device_id": str(settings.device_id), "arena_extend_strategy": "kSameAsRequested"}
    if not settings.fp16:
        # The CUDA provider multiplies float32 in TF32 by default (10-bit mantissas): a
        # float32 bundle's logits then differ from the CPU's by ~1e-3 of their scale (seen
        # on an H100). A float32 bundle is asked for float32 arithmetic.
        options["use_tf32"] = "0"
    return options


def dimension_overrides(device: str, settings: GpuSettings) -> dict[str, int]:
    """Symbolic axes to fix for the session. Only the TensorRT provider needed one (a static
    KV capacity for its in-place update) and it is refused, so none today."""
    refuse_device(device)
    return {}


def missing_provider(wanted: str, available: list[str]) -> str | None:
    """Why the wanted provider cannot load in this onnxruntime build, or None."""
    if wanted in available:
        return None
    return (
        f"this onnxruntime has no {wanted} (available: {', '.join(available)}); "
        f"{ORT_GPU_HINT}"
    )


_PRELOADED: list[str] = []  # what preload_dlls said, once per process


def load_cuda_libraries(ort: ModuleType) -> str:
    """Load the CUDA and cuDNN libraries that onnxruntime-gpu was built for, from the
    `nvidia` pip packages beside it or the default library path, once per process.

    Without it a pip-installed CUDA (no system CUDA on the loader's path) makes the CUDA
    provider fail to load, and ONNX Runtime runs the session on the CPU instead (which
    `_check_providers` refuses). A system CUDA on the path (JetPack) is what it loads then.
    Returns what preload_dlls printed (it prints, not logs): the refusal quotes it."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:  # onnxruntime < 1.21: the libraries must be on the loader's path
        return ""
    if not _PRELOADED:
        # onnxruntime-gpu 1.31 warns on its default logger at every CUDA session that no
        # plugin EP device is registered, then uses its built-in CUDA provider: not the
        # user's concern, like the session warnings (session options log errors only).
        ort.set_default_logger_severity(3)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            try:
                preload()
            except Exception as err:  # noqa: BLE001 - its errors are advice; the load decides
                print(f"preload_dlls failed: {err}")
        _PRELOADED.append(" ".join(printed.getvalue().split()))
        if _PRELOADED[0]:
            log.debug("onnxruntime.preload_dlls: %s", _PRELOADED[0])
    return _PRELOADED[0]


def configure_gpu_session(ort: ModuleType, options: Any) -> None:
    """Make a GPU session tell where its nodes went: recorded per node when this
    onnxruntime can (checked by `check_placement`), else ONNX Runtime's own warnings."""
    options.add_session_config_entry(ASSIGNMENT_ENTRY, "1")
    if not hasattr(ort.InferenceSession, "get_provider_graph_assignment_info"):
        options.log_severity_level = 2  # warnings: "Some nodes were not assigned to ..."


def missing_kernel(ort: ModuleType, wanted: str, op_type: str, opset: int) -> str | None:
    """Why `wanted` has no kernel for the KV write `op_type` at `opset` in this onnxruntime,
    judged by its version (the CUDA provider's TensorScatter came with 1.25), or None.

    Not by listing the kernels (`get_all_opkernel_def`): that loads every provider library
    in the build, and onnxruntime-gpu's TensorRT one kills the process where TensorRT is not
    installed (onnxruntime-gpu 1.31.1 on an H100). Once loaded, `check_placement` says where
    the write really runs."""
    if wanted != CUDA_EP or op_type != KV_WRITE_OP:
        return None
    if version_tuple(ort.__version__) >= version_tuple(MIN_ORT_GPU):
        return None
    return (
        f"onnxruntime {ort.__version__} has no {wanted} kernel for {op_type} (opset {opset}), "
        f"so the KV cache would be written on the CPU; install onnxruntime-gpu>={MIN_ORT_GPU}"
    )


class Placement(NamedTuple):
    recorded: bool  # this onnxruntime reported the assignment
    elsewhere: Counter[str]  # op type -> nodes not on the wanted provider


def placement(session: Any, wanted: str) -> Placement:
    """Which nodes the session did not give to `wanted`, by op type."""
    getter = getattr(session, "get_provider_graph_assignment_info", None)
    if getter is None:
        return Placement(False, Counter())
    try:
        subgraphs = list(getter())
    except Exception:  # noqa: BLE001 - not recorded (an older build or another EP layout)
        return Placement(False, Counter())
    elsewhere: Counter[str] = Counter()
    for subgraph in subgraphs:
        if subgraph.ep_name != wanted:
            elsewhere.update(node.op_type for node in subgraph.get_nodes())
    return Placement(bool(subgraphs), elsewhere)


def check_placement(session: Any, wanted: str) -> None:
    """BackendError when a KV write left `wanted`. Other nodes there: an info line where all
    are the small integer ops of shape and position arithmetic, which ONNX Runtime keeps on
    the CPU on purpose (on an H100: Squeeze, Slice, Cast, Add, Sub over `past_lens`), else
    a warning line."""
    found = placement(session, wanted)
    if not found.recorded:
        return
    for op, fix in KV_WRITE_OPS.items():
        if found.elsewhere[op]:
            raise BackendError(
                f"ONNX Runtime put the KV-cache write ({op}) on the CPU instead of "
                f"{wanted}: every step would copy the cache; {fix}")
    if found.elsewhere:
        level = logging.INFO if set(found.elsewhere) <= SHAPE_OPS else logging.WARNING
        log.log(level, "ONNX Runtime runs %s off %s (on the CPU): %s", _count(found.elsewhere),
                wanted, ", ".join(f"{op} x{n}" for op, n in found.elsewhere.most_common()))


def _count(ops: Counter[str]) -> str:
    total = sum(ops.values())
    return f"{total} node{'s' if total != 1 else ''}"

