"""Provider options for ONNX Runtime's GPU execution providers (plain functions, unit-tested).

- CUDA EP: the chunk graph as exported; the arena grows only by what is asked for, since on
  a Jetson the GPU shares the board's memory with everything else.
- TensorRT EP: explicit optimization profiles, the same plan as `edgeprefill build` (one per
  chunk bucket, B=1, plus the decode profile, B=1..max_batch), with the KV capacity pinned
  through a free-dimension override so that TensorRT sees a static cache axis. Engines and
  timing caches go to BUNDLE/engines/ort-trt/ and are reused across runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeprefill.bundle import Manifest
from edgeprefill.contract import CAPACITY
from edgeprefill.engines.gpu_libs import ORT_GPU_HINT
from edgeprefill.engines.trt.cache import ENGINES_DIR
from edgeprefill.engines.trt.plan import ProfilePlan, profile_plan

TRT_EP = "TensorrtExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
ORT_TRT_CACHE = "ort-trt"  # under BUNDLE/engines/
DEFAULT_MAX_BATCH = 8  # decode rows per call the TensorRT EP's decode profile covers


@dataclass(frozen=True)
class GpuSettings:
    cache_dir: Path  # TensorRT EP engine and timing cache folder
    capacity: int  # KV positions per slot, static for the TensorRT EP
    max_batch: int = DEFAULT_MAX_BATCH
    fp16: bool = False  # let TensorRT pick fp16 kernels (trt_fp16_enable)
    device_id: int = 0


def gpu_settings(bundle_dir: Path, manifest: Manifest, engine_dir: Path | None) -> GpuSettings:
    """Settings for a bundle: fp16 kernels when its weights are float16, the capacity of its
    max context, the cache under its engines/ folder (or `engine_dir`)."""
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
    return [_options_for(name, manifest, settings) for name in providers]


def _options_for(name: str, manifest: Manifest, settings: GpuSettings) -> dict[str, str]:
    if name == TRT_EP:
        return tensorrt_options(manifest, settings)
    if name == CUDA_EP:
        return cuda_options(settings)
    return {}


def cuda_options(settings: GpuSettings) -> dict[str, str]:
    return {"device_id": str(settings.device_id), "arena_extend_strategy": "kSameAsRequested"}


def tensorrt_options(manifest: Manifest, settings: GpuSettings) -> dict[str, str]:
    plan = profile_plan(manifest, settings.capacity, settings.max_batch)
    cache = str(settings.cache_dir)
    return {
        "device_id": str(settings.device_id),
        "trt_fp16_enable": _flag(settings.fp16),
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": cache,
        **profile_shape_options(plan),
    }


def profile_shape_options(plan: ProfilePlan) -> dict[str, str]:
    """`trt_profile_{min,opt,max}_shapes`: "name:AxB,..." for every input of every profile;
    a name repeated later in the list starts the next profile (ORT's TensorRT EP format)."""
    options = {}
    for end in ("min", "opt", "max"):
        parts = [
            f"{name}:{'x'.join(str(d) for d in getattr(shapes, end))}"
            for profile in plan.profiles
            for name, shapes in profile.shapes.items()
        ]
        options[f"trt_profile_{end}_shapes"] = ",".join(parts)
    return options


def dimension_overrides(device: str, settings: GpuSettings) -> dict[str, int]:
    """Symbolic axes to fix for the session: TensorRT imports TensorScatter as its in-place
    KV-cache update only over a static cache axis."""
    return {CAPACITY: settings.capacity} if device == "tensorrt" else {}


def missing_provider(wanted: str, available: list[str]) -> str | None:
    """Why the wanted provider cannot load in this onnxruntime build, or None."""
    if wanted in available:
        return None
    return (
        f"this onnxruntime has no {wanted} (available: {', '.join(available)}); "
        f"{ORT_GPU_HINT}"
    )


def _flag(value: bool) -> str:
    return "True" if value else "False"
