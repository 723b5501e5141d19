"""The TensorRT backend's buffers and bindings, driven through the same step interface as
the ONNX Runtime backend, with a fake engine runtime (tests/trt_fakes.py) on the CPU."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from edgeprefill import engines
from edgeprefill.bundle import load_manifest
from edgeprefill.cli.main import _in_flags
from edgeprefill.cli.run_cmd import run
from edgeprefill.engines import BackendOptions, StepBatch, create_backend
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.trt.backend import TensorRTBackend
from edgeprefill.errors import BackendError, SettingError
from edgeprefill.sdk import Engine, GenerationParams
from tests.trt_fakes import HostDevice, OrtEngineRuntime

CAPACITY = 128


@pytest.fixture(scope="module")
def standard(bundle):
    return bundle("llama", "standard")


def make_trt(bundle_dir, capacity=CAPACITY, max_batch=4) -> TensorRTBackend:
    manifest = load_manifest(bundle_dir)
    runtime = OrtEngineRuntime(bundle_dir, manifest, capacity, max_batch)
    return TensorRTBackend(bundle_dir, manifest, BackendOptions(), runtime=runtime)


def make_ort(bundle_dir) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir), BackendOptions(threads=1))


def prefill(tokens: list[int], past: int, slot: int) -> StepBatch:
    return StepBatch(np.array([tokens], np.int64), np.array([past], np.int32),
                     np.array([len(tokens)], np.int32), first_slot=slot)


def decode(tokens: list[int], pasts: list[int], first_slot: int) -> StepBatch:
    return StepBatch(np.array(tokens, np.int64)[:, None], np.array(pasts, np.int32),
                     np.ones(len(tokens), np.int32), first_slot=first_slot)


def ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 100, size=n)]


def test_steps_give_the_onnxruntime_backends_logits_and_kv(standard):
    trt, ref = make_trt(standard), make_ort(standard)
    steps = [
        prefill(ids(20, 0), 0, slot=1),  # one piece, padded to the 64 bucket
        prefill(ids(70, 1), 0, slot=0),  # 64 + 6 (padded to 16)
        decode([5, 6], [70, 20], first_slot=0),
        prefill(ids(9, 2), 21, slot=1),
        decode([7, 8], [71, 30], first_slot=0),
    ]
    for backend in (trt, ref):
        backend.allocate_kv(slots=3, capacity=CAPACITY)
    for step in steps:
        np.testing.assert_allclose(trt.run(step), ref.run(step), rtol=1e-4, atol=1e-4)
    lengths = {0: 72, 1: 31}
    for got, want in zip(trt.kv_arrays(), ref.kv_arrays(), strict=True):
        for slot, length in lengths.items():
            np.testing.assert_allclose(got[slot, :, :length], want[slot, :, :length], atol=1e-5)
        assert not got[2].any(), "a slot no step touched stays zero"


def test_kv_inputs_and_outputs_share_the_slot_address_of_the_arena(standard):
    trt = make_trt(standard)
    trt.allocate_kv(slots=4, capacity=CAPACITY)
    trt.run(decode([5, 6], [3, 4], first_slot=2))
    (call,) = trt.runtime.calls
    graph = trt.manifest.graph
    m = trt.manifest.model
    assert call.profile == trt.plan.decode_index
    for index, (past, present) in enumerate(zip(
        [n for pair in graph.kv_inputs for n in pair],
        [n for pair in graph.kv_outputs for n in pair], strict=True,
    )):
        expected = trt._arenas[index] + 2 * trt.slot_bytes
        assert call.bindings[past] == call.bindings[present] == (
            expected, (2, m.num_kv_heads, CAPACITY, m.head_dim)
        )
    assert call.bindings["input_ids"].shape == (2, 1)
    assert call.bindings["logits"].shape == (2, m.vocab_size)


def test_a_short_chunk_is_padded_to_its_bucket_and_masked_by_valid_lens(standard):
    trt, ref = make_trt(standard), make_ort(standard)
    for backend in (trt, ref):
        backend.allocate_kv(slots=1, capacity=CAPACITY)
    step = prefill(ids(10, 3), 0, slot=0)
    np.testing.assert_allclose(trt.run(step), ref.run(step), rtol=1e-4, atol=1e-4)
    (call,) = trt.runtime.calls
    assert trt.plan.profiles[call.profile].name == "prefill-16"
    assert call.bindings["input_ids"].shape == (1, 16)
    staged = np.empty(16, np.int64)
    trt.device.download(staged, call.bindings["input_ids"].address)
    assert list(staged[:10]) == list(step.input_ids[0]) and not staged[10:].any()
    valid = np.empty(1, np.int32)
    trt.device.download(valid, call.bindings["valid_lens"].address)
    assert valid[0] == 10


def test_the_tail_of_a_nearly_full_slot_goes_through_the_decode_profile(standard):
    trt, ref = make_trt(standard), make_ort(standard)
    for backend in (trt, ref):
        backend.allocate_kv(slots=1, capacity=CAPACITY)
        backend.run(prefill(ids(120, 4), 0, slot=0))
    trt.runtime.calls.clear()
    step = prefill(ids(5, 5), 120, slot=0)  # 120 + 16 > 128: no bucket fits
    np.testing.assert_allclose(trt.run(step), ref.run(step), rtol=1e-4, atol=1e-4)
    assert [c.profile for c in trt.runtime.calls] == [trt.plan.decode_index] * 5


def test_a_decode_batch_wider_than_the_profile_runs_in_groups(standard):
    trt, ref = make_trt(standard, max_batch=2), make_ort(standard)
    for backend in (trt, ref):
        backend.allocate_kv(slots=3, capacity=CAPACITY)
        for slot in range(3):
            backend.run(prefill(ids(5, 10 + slot), 0, slot=slot))
    trt.runtime.calls.clear()
    step = decode([5, 6, 7], [5, 5, 5], first_slot=0)
    np.testing.assert_allclose(trt.run(step), ref.run(step), rtol=1e-4, atol=1e-4)
    assert [c.bindings["input_ids"].shape for c in trt.runtime.calls] == [(2, 1), (1, 1)]


def test_copy_and_swap_move_slot_prefixes_like_the_onnxruntime_backend(standard):
    trt, ref = make_trt(standard), make_ort(standard)
    for backend in (trt, ref):
        backend.allocate_kv(slots=3, capacity=CAPACITY)
        backend.run(prefill(ids(30, 6), 0, slot=0))
        backend.run(prefill(ids(12, 7), 0, slot=1))
        backend.copy_kv(0, 2, 16)
        backend.swap_kv(0, 1, 30)
    # Padded positions past a slot's tokens differ (TensorRT pads chunks): compare tokens.
    lengths = {0: 12, 1: 30, 2: 16}
    for got, want in zip(trt.kv_arrays(), ref.kv_arrays(), strict=True):
        for slot, length in lengths.items():
            np.testing.assert_allclose(got[slot, :, :length], want[slot, :, :length], atol=1e-5)


def test_bad_slots_and_capacity_are_refused(standard):
    trt = make_trt(standard)
    with pytest.raises(BackendError, match="capacity of 128"):
        trt.allocate_kv(slots=2, capacity=64)
    trt.allocate_kv(slots=2, capacity=CAPACITY)
    with pytest.raises(BackendError, match="not allocated"):
        trt.run(decode([5, 6], [1, 1], first_slot=1))
    with pytest.raises(BackendError, match="slots"):
        trt.copy_kv(0, 2, 4)


def test_close_frees_every_device_buffer(standard):
    trt = make_trt(standard)
    trt.allocate_kv(slots=2, capacity=CAPACITY)
    trt.allocate_kv(slots=3, capacity=CAPACITY)  # the first arena is freed, not leaked
    trt.close()
    assert trt.device.buffers == {} and trt.runtime.closed


def test_engine_generates_the_same_tokens_on_both_backends(standard, monkeypatch):
    monkeypatch.setattr(
        "edgeprefill.engines.trt.backend.open_runtime",
        lambda bundle_dir, manifest, options: OrtEngineRuntime(
            bundle_dir, manifest, manifest.max_context, max_batch=4),
    )
    params = GenerationParams(max_new_tokens=12, ignore_eos=True)
    prompts = [ids(40, 20), ids(90, 21), ids(7, 22)]
    outputs = {}
    for name in ("onnxruntime", "tensorrt"):
        with Engine.load(standard, backend=name, background=False, kv_slots=3,
                         chunk_size=32) as engine:
            streams = [engine.generate(p, params) for p in prompts]
            outputs[name] = [s.result().token_ids for s in streams]
    assert outputs["tensorrt"] == outputs["onnxruntime"]
    assert all(len(tokens) == 12 for tokens in outputs["tensorrt"])


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None,
                    reason="TensorRT is installed here")
def test_without_tensorrt_the_backend_says_what_to_install(standard):
    with pytest.raises(BackendError) as err:
        create_backend("tensorrt", standard, load_manifest(standard), BackendOptions())
    message = str(err.value)
    assert "TensorRT is not installed" in message and "pypi.nvidia.com" in message
    assert "JetPack" in message and "\n" not in message
    assert "tensorrt" in engines.BACKENDS


class FullDevice(HostDevice):
    """Host memory that runs out after `room` bytes, failing as CudaDevice does."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def alloc(self, nbytes: int) -> int:
        if nbytes > self.room:
            raise BackendError("CUDA cudaMalloc failed: out of memory")
        self.room -= nbytes
        return super().alloc(nbytes)


def test_a_kv_cache_too_big_for_the_gpu_is_one_line_and_frees_what_it_took(standard):
    manifest = load_manifest(standard)
    runtime = OrtEngineRuntime(standard, manifest, CAPACITY, 4, device=FullDevice(3 << 20))
    trt = TensorRTBackend(standard, manifest, BackendOptions(), runtime=runtime)
    staged = dict(trt.device.buffers)
    with pytest.raises(SettingError) as err:
        trt.allocate_kv(slots=64, capacity=CAPACITY)
    message = str(err.value)
    assert message.startswith("cannot allocate the KV cache: 64 slots x 4 arenas")
    assert "out of memory" in message and "\n" not in message
    # The advice in real keywords (the SDK's), and in run's flags on the command line.
    assert message.endswith("; lower kv_slots or max_context, or give a smaller "
                            "kv_budget_bytes")
    assert _in_flags(err.value, run).endswith("(CUDA cudaMalloc failed: out of memory); "
                                              "lower --kv-slots or --max-context")
    assert trt.device.buffers == staged  # the arenas it did get were freed


def test_staging_buffers_the_gpu_cannot_hold_release_the_engine_too(standard):
    manifest = load_manifest(standard)
    runtime = OrtEngineRuntime(standard, manifest, CAPACITY, 4, device=FullDevice(1000))
    with pytest.raises(BackendError, match="out of memory"):
        TensorRTBackend(standard, manifest, BackendOptions(), runtime=runtime)
    assert runtime.device.buffers == {} and runtime.closed


def test_compute_bf16_is_refused_with_where_trt_takes_its_precision(standard):
    """--compute is the onnxruntime backend's; a TensorRT engine's precision comes from
    `edgeprefill build`, and silently running fp32 would mislead."""
    manifest = load_manifest(standard)
    with pytest.raises(BackendError, match="edgeprefill build --precision bf16"):
        TensorRTBackend(standard, manifest, BackendOptions(compute="bf16"),
                        runtime=OrtEngineRuntime(standard, manifest, CAPACITY, 4))
