"""The KV cache is written in place: no step copies the cache."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend

SENTINEL = 1234.5


def make_backend(bundle_dir, verbose: bool = False) -> OnnxRuntimeBackend:
    class Backend(OnnxRuntimeBackend):
        def _session_options(self):
            so = super()._session_options()
            if verbose:
                so.log_severity_level = 2  # warnings: ORT warns when it copies a cache
            return so

    return Backend(bundle_dir, load_manifest(bundle_dir), BackendOptions(threads=1))


@pytest.mark.parametrize("flavor", ["ort", "standard"])
def test_step_writes_only_its_rows_positions_into_the_bound_arena(bundle, flavor):
    backend = make_backend(bundle("llama", flavor))
    backend.allocate_kv(slots=3, capacity=64)
    arenas = backend.kv_arrays()
    addresses = [a.ctypes.data for a in arenas]
    for arena in arenas:
        arena[...] = SENTINEL
    # Slot 1 holds 5 tokens of (sentinel) history; a chunk of 4 lands at positions 5..8.
    backend.run(StepBatch(np.array([[3, 4, 5, 6]]), np.array([5], np.int32),
                          np.array([4], np.int32), first_slot=1))
    for arena, address in zip(arenas, addresses, strict=True):
        assert arena.ctypes.data == address, "the arena was reallocated"
        written = arena[1, :, 5:9]
        assert np.all(written != SENTINEL), "the chunk's K/V did not land in the arena"
        untouched = arena.copy()
        untouched[1, :, 5:9] = SENTINEL
        assert np.all(untouched == SENTINEL), "a step wrote outside its rows' positions"


def test_present_outputs_alias_the_past_inputs(bundle):
    """ORT reports the present outputs at the very addresses of the past inputs."""
    backend = make_backend(bundle("llama", "ort"))
    backend.allocate_kv(slots=2, capacity=32)
    backend.run(StepBatch(np.array([[3, 4]]), np.array([0], np.int32),
                          np.array([2], np.int32), first_slot=1))
    binding = backend._bindings[(1, 1)]
    outputs = binding.get_outputs()[1:]  # after the logits
    views = [a[1:2] for a in backend.kv_arrays()]
    assert [o.data_ptr() for o in outputs] == [v.ctypes.data for v in views]


def test_tensorscatter_updates_in_place_without_copying(bundle, capfd):
    """ORT's TensorScatter copies the whole cache (and warns) unless past and present are
    one buffer; the backend's binding never triggers that copy."""
    backend = make_backend(bundle("llama", "standard"), verbose=True)
    backend.allocate_kv(slots=1, capacity=32)
    capfd.readouterr()
    backend.run(StepBatch(np.array([[3, 4, 5]]), np.array([0], np.int32),
                          np.array([3], np.int32), first_slot=0))
    assert "in-place optimization not activated" not in capfd.readouterr().err

    # Control: bound to a separate output buffer, ORT does copy and says so.
    binding = backend.session.io_binding()
    binding.bind_output("logits")
    for name, value in (("input_ids", np.array([[3]])), ("past_lens", np.array([3], np.int32)),
                        ("valid_lens", np.array([1], np.int32))):
        binding.bind_cpu_input(name, value)
    graph = backend.manifest.graph
    for pair_in, pair_out, in zip(graph.kv_inputs, graph.kv_outputs, strict=True):
        for past, present in zip(pair_in, pair_out, strict=True):
            binding.bind_cpu_input(past, np.zeros((1, 2, 32, 16), np.float32))
            binding.bind_output(present)
    backend.session.run_with_iobinding(binding)
    assert "in-place optimization not activated" in capfd.readouterr().err
