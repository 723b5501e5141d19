"""Where compiled TensorRT engines live in a bundle, and when one may be loaded.

An engine is only valid for the GPU model (and compute capability) and the TensorRT version
that built it, for the exact graph and weights, and for the precision and profile plan it
was built with. All of that forms its key; the engine file sits beside a small JSON record
of the key and the engine's sha256, and is loaded only when both match. A foreign engine
(another GPU or TensorRT) is left alone; a stale one (an older graph) is never loaded.

  BUNDLE/engines/<gpu>-sm<cc>-trt<version>-<precision>-<digest>.engine
  BUNDLE/engines/<gpu>-sm<cc>-trt<version>-<precision>-<digest>.json
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgeprefill.bundle import Manifest, sha256_of
from edgeprefill.engines.trt.graph import PREP_VERSION
from edgeprefill.engines.trt.plan import ProfilePlan

ENGINES_DIR = "engines"
PRECISIONS = ("fp16", "fp32", "int8")


@dataclass(frozen=True)
class DeviceInfo:
    gpu_name: str  # "Orin", "NVIDIA GeForce RTX 4090"
    compute_capability: str  # "8.7"
    tensorrt_version: str  # "10.15.1.29"


@dataclass(frozen=True)
class EngineKey:
    gpu_name: str
    compute_capability: str
    tensorrt_version: str
    precision: str
    graph_sha256: str  # the bundle's graph file, from the manifest
    weights_sha256: str  # its external data: weights are baked into the engine
    capacity: int
    max_batch: int
    buckets: tuple[int, ...]
    prep_version: int = PREP_VERSION

    @property
    def digest(self) -> str:
        canonical = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def stem(self) -> str:
        gpu = re.sub(r"[^a-z0-9]+", "-", self.gpu_name.lower()).strip("-") or "gpu"
        cc = self.compute_capability.replace(".", "")
        return f"{gpu}-sm{cc}-trt{self.tensorrt_version}-{self.precision}-{self.digest[:12]}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "buckets": list(self.buckets)}


def engine_key(
    manifest: Manifest, device: DeviceInfo, precision: str, plan: ProfilePlan
) -> EngineKey:
    files = manifest.files
    return EngineKey(
        gpu_name=device.gpu_name,
        compute_capability=device.compute_capability,
        tensorrt_version=device.tensorrt_version,
        precision=precision,
        graph_sha256=files[manifest.graph.file].sha256,
        weights_sha256=files[manifest.graph.data_file].sha256,
        capacity=plan.capacity,
        max_batch=plan.max_batch,
        buckets=plan.buckets,
    )


def engine_paths(engines_dir: Path, key: EngineKey) -> tuple[Path, Path]:
    return engines_dir / f"{key.stem}.engine", engines_dir / f"{key.stem}.json"


def find_engine(engines_dir: Path, key: EngineKey, verify: bool = True) -> Path | None:
    """The engine built for exactly this key, or None (absent, foreign, stale or corrupt).
    Its size is always checked; its sha256 (a read of the whole engine) with `verify`."""
    engine, record = engine_paths(engines_dir, key)
    meta = _read_record(record)
    if meta is None or not engine.is_file():
        return None
    if meta.get("key") != key.to_json():
        return None
    if meta.get("engine_bytes") != engine.stat().st_size:
        return None  # truncated or replaced since it was built
    if verify and meta.get("engine_sha256") != sha256_of(engine):
        return None
    return engine


def usable_records(engines_dir: Path, manifest: Manifest, device: DeviceInfo) -> list[EngineKey]:
    """Keys of the engines this device may load for this bundle, newest first (sizes
    checked; find_engine verifies the one chosen)."""
    found = []
    for record in sorted(engines_dir.glob("*.json")):
        meta = _read_record(record)
        key = _key_from(meta)
        if meta is None or key is None or not _same_source(key, manifest, device):
            continue
        if find_engine(engines_dir, key, verify=False) is not None:
            found.append((meta.get("built_at", 0.0), key))
    return [key for _, key in sorted(found, key=lambda item: -item[0])]


def save_engine(
    engines_dir: Path, key: EngineKey, blob: bytes, extra: dict[str, Any]
) -> Path:
    """Write engine and record atomically: a reader never sees a half-written engine."""
    engines_dir.mkdir(parents=True, exist_ok=True)
    engine, record = engine_paths(engines_dir, key)
    _write_atomic(engine, blob)
    meta = {"key": key.to_json(), "engine_sha256": sha256_of(engine),
            "engine_bytes": engine.stat().st_size, **extra}
    _write_atomic(record, (json.dumps(meta, indent=2) + "\n").encode())
    return engine


def prune_stale(engines_dir: Path, manifest: Manifest) -> list[Path]:
    """Remove engines built from another graph or weights of this bundle: nobody can load
    them again. Engines of other GPUs or TensorRT versions for this graph are kept."""
    removed = []
    graph = manifest.files[manifest.graph.file].sha256
    weights = manifest.files[manifest.graph.data_file].sha256
    for record in sorted(engines_dir.glob("*.json")):
        key = _key_from(_read_record(record))
        if key is None or (key.graph_sha256, key.weights_sha256) == (graph, weights):
            continue
        for path in (record.with_suffix(".engine"), record):
            if path.exists():
                path.unlink()
                removed.append(path)
    return removed


def _same_source(key: EngineKey, manifest: Manifest, device: DeviceInfo) -> bool:
    files = manifest.files
    return (
        (key.gpu_name, key.compute_capability, key.tensorrt_version)
        == (device.gpu_name, device.compute_capability, device.tensorrt_version)
        and key.graph_sha256 == files[manifest.graph.file].sha256
        and key.weights_sha256 == files[manifest.graph.data_file].sha256
        and key.prep_version == PREP_VERSION
    )


def _key_from(meta: dict[str, Any] | None) -> EngineKey | None:
    if meta is None or not isinstance(meta.get("key"), dict):
        return None
    raw = dict(meta["key"])
    try:
        raw["buckets"] = tuple(raw["buckets"])
        return EngineKey(**raw)
    except (KeyError, TypeError):
        return None


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
