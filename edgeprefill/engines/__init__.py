"""Backends that run one step of the chunk graph, chosen by name."""

from __future__ import annotations

import importlib
from pathlib import Path

from edgeprefill.bundle import Manifest
from edgeprefill.engines.base import Backend, BackendOptions, StepBatch
from edgeprefill.errors import BackendError

# name -> "module:class", imported on use so a missing GPU library only matters when asked for.
BACKENDS = {
    "onnxruntime": "edgeprefill.engines.ort.backend:OnnxRuntimeBackend",
    "tensorrt": "edgeprefill.engines.trt.backend:TensorRTBackend",
}

__all__ = ["BACKENDS", "Backend", "BackendOptions", "StepBatch", "create_backend"]


def create_backend(
    name: str, bundle_dir: Path, manifest: Manifest, options: BackendOptions
) -> Backend:
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    backend: Backend = getattr(importlib.import_module(module), cls)(bundle_dir, manifest, options)
    return backend
