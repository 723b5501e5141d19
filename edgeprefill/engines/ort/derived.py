"""Weights a load-time rewrite derives from a bundle's own (int8 from int4, packed bf16 from
fp32), handed to the ONNX Runtime session as initializers it reads in place.

The bundle on disk is never changed: the rewritten graph declares each derived weight
(`declared`) and the session gets the array itself (`hand_over`), so the serialized graph
stays small and no copy of the weights stays alive with it. What a rewrite derives goes
through `Derived.cached`: a bundle's later loads map it from the disk cache
(derived_cache.py) instead of deriving it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, external_data_helper, helper, numpy_helper

from edgeprefill.engines.ort.derived_cache import DerivedCache
from edgeprefill.errors import BackendError


class Derived:
    """The weights a variant derives, named, for the session (never the graph's bytes:
    a copy there would stay alive with the serialized model and in ONNX Runtime too)."""

    def __init__(self, graph: ModelProto, bundle_dir: Path) -> None:
        self.graph = graph
        self.bundle_dir = bundle_dir
        self.arrays: dict[str, np.ndarray] = {}
        self.cache = DerivedCache.for_bundle(bundle_dir, weight_files(graph))

    def cached(self, names: Sequence[str],
               derive: Callable[[], Sequence[np.ndarray]]) -> list[np.ndarray]:
        """The arrays `derive` makes, under `names`: those of this load when a node before
        asked for the same names (a weight two nodes share is derived once), from the disk
        cache when an earlier load of this bundle left them there, else derived now (and
        left there)."""
        if all(name in self.arrays for name in names):
            return [self.arrays[name] for name in names]
        arrays = self.cache.load(names) if self.cache is not None else None
        if arrays is None:
            arrays = list(derive())
            if self.cache is not None:
                self.cache.store(names, arrays)
        self.arrays.update(zip(names, arrays, strict=True))
        return arrays


def weight_files(graph: ModelProto) -> list[str]:
    """The files the graph's initializers point at, relative to the bundle."""
    return sorted({e.value for t in graph.graph.initializer for e in t.external_data
                   if e.key == "location"})


def hand_over(graph: ModelProto, arrays: dict[str, np.ndarray],
              session_options: Any) -> tuple[object, ...]:
    """Gives each derived weight to the session as an initializer it reads in place (no
    copy: the graph's serialized bytes, which the native kernels keep, stay small)."""
    import onnxruntime as ort

    values: list[object] = []
    for name, array in arrays.items():
        value = ort.OrtValue.ortvalue_from_numpy(array)
        session_options.add_initializer(name, value)
        graph.graph.initializer.append(declared(graph, name, array))
        values.append((array, value))
    return tuple(values)


def declared(graph: ModelProto, name: str, array: np.ndarray) -> TensorProto:
    """The graph must declare an initializer for the session's to override. ONNX Runtime
    checks an external location exists but never reads it for an overridden name, so the
    declaration points at the bundle's own weight file (an empty in-graph tensor of the
    right shape would fail the graph's checks). A graph with no weight file (none that
    edgeprefill writes) gets the weight itself."""
    data_file = next((e.value for t in graph.graph.initializer for e in t.external_data
                      if e.key == "location"), None)
    if data_file is None:
        return numpy_helper.from_array(array, name)
    tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                         dims=array.shape, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", data_file), ("offset", "0"),
                       ("length", str(array.nbytes))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def initializer(graph: ModelProto, name: str, bundle_dir: Path) -> np.ndarray:
    found = next((t for t in graph.graph.initializer if t.name == name), None)
    if found is None:
        raise BackendError(f"the graph lacks the initializer {name!r}: the bundle is corrupt")
    tensor = TensorProto()
    tensor.CopyFrom(found)  # a copy: the graph's own entry keeps pointing at the file
    if external_data_helper.uses_external_data(tensor):
        external_data_helper.load_external_data_for_tensor(tensor, str(bundle_dir))
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]
    return numpy_helper.to_array(tensor)
