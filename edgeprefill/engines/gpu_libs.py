"""Import guards for the GPU libraries: a missing one is one clear line, never a traceback.

TensorRT and cuda-python are optional (`pip install edgeprefill[tensorrt]`); the CPU install
never imports them. Each guard says what is missing and how to get it on a Jetson and on a
desktop.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from edgeprefill.engines.trt.ops import MIN_TENSORRT
from edgeprefill.errors import BackendError

MIN_TRT_TEXT = ".".join(map(str, MIN_TENSORRT))
TENSORRT_HINT = (
    f"TensorRT >= {MIN_TRT_TEXT} is needed: on a Jetson use the TensorRT Python bindings "
    "that JetPack installs (python3-libnvinfer; see docs/jetson.md); on a desktop "
    "`pip install \"edgeprefill[tensorrt-cu12]\" --extra-index-url https://pypi.nvidia.com` "
    "(or tensorrt-cu13: TensorRT and cuda-python for your CUDA)"
)
CUDA_HINT = (
    "cuda-python of your CUDA's major is needed to allocate GPU buffers for TensorRT: "
    "`pip install 'cuda-python>=12.6,<13'` for CUDA 12, `'cuda-python>=13,<14'` for CUDA 13 "
    "(or edgeprefill[tensorrt-cu12] / edgeprefill[tensorrt-cu13])"
)
ORT_GPU_HINT = (
    "install onnxruntime-gpu (`pip install edgeprefill[gpu]`; on a Jetson the onnxruntime-gpu "
    "wheel built for your JetPack, see docs/jetson.md)"
)


def require_tensorrt() -> ModuleType:
    """The `tensorrt` module, at least MIN_TENSORRT; BackendError otherwise."""
    try:
        trt = importlib.import_module("tensorrt")
    except ImportError:
        raise BackendError(f"TensorRT is not installed. {TENSORRT_HINT}") from None
    except Exception as err:  # noqa: BLE001 - PyPI stub packages raise odd errors on import
        raise BackendError(f"TensorRT failed to import ({err}). {TENSORRT_HINT}") from None
    version = getattr(trt, "__version__", "0")
    if version_tuple(version) < MIN_TENSORRT:
        raise BackendError(
            f"TensorRT {version} is too old: the chunk graph's in-place KV update "
            f"(TensorScatter as IKVCacheUpdateLayer) needs {MIN_TRT_TEXT} or newer. "
            f"{TENSORRT_HINT}"
        )
    return trt


def require_cudart() -> ModuleType:
    """cuda-python's runtime API module (`cuda.bindings.runtime`, or `cuda.cudart` before
    cuda-python 12.6)."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
        except Exception as err:  # noqa: BLE001 - a broken CUDA install fails in many ways
            raise BackendError(f"cuda-python failed to import ({err}). {CUDA_HINT}") from None
    raise BackendError(f"cuda-python is not installed. {CUDA_HINT}")


def version_tuple(version: str) -> tuple[int, ...]:
    """"10.15.1.29" -> (10, 15, 1, 29); stops at the first part that is not a number."""
    parts = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)
