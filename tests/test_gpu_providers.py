"""ONNX Runtime's GPU providers: option construction and the device KV arena, on the CPU;
end-to-end runs on a GPU are marked `gpu` and skip elsewhere."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.arena import DeviceArena
from edgeprefill.engines.ort.backend import PROVIDERS, OnnxRuntimeBackend
from edgeprefill.engines.ort.providers import (
    CUDA_EP,
    TRT_EP,
    GpuSettings,
    dimension_overrides,
    gpu_settings,
    missing_provider,
    provider_options,
)
from edgeprefill.errors import BackendError
from tests.trt_fakes import fake_manifest

HAS_CUDA_EP = CUDA_EP in ort.get_available_providers()
HAS_TRT_EP = TRT_EP in ort.get_available_providers()


def settings(tmp_path, **changes) -> GpuSettings:
    return GpuSettings(**{"cache_dir": tmp_path / "engines" / "ort-trt", "capacity": 256,
                          **changes})


def profiles_of(option: str) -> list[dict[str, str]]:
    """Split a trt_profile_*_shapes string into profiles (a repeated name starts one)."""
    profiles: list[dict[str, str]] = [{}]
    for item in option.split(","):
        name, shape = item.split(":")
        if name in profiles[-1]:
            profiles.append({})
        profiles[-1][name] = shape
    return profiles


def test_cuda_provider_options_keep_the_arena_tight(tmp_path):
    options = provider_options(PROVIDERS["cuda"], fake_manifest(), settings(tmp_path))
    assert options == [{"device_id": "0", "arena_extend_strategy": "kSameAsRequested"}, {}]


def test_tensorrt_provider_gets_explicit_profiles_per_bucket_and_for_decode(tmp_path):
    trt, cuda, cpu = provider_options(
        PROVIDERS["tensorrt"], fake_manifest(), settings(tmp_path, max_batch=8)
    )
    assert cuda["device_id"] == "0" and cpu == {}
    assert trt["trt_engine_cache_enable"] == "True" and trt["trt_timing_cache_enable"] == "True"
    assert trt["trt_engine_cache_path"] == str(tmp_path / "engines" / "ort-trt")
    assert trt["trt_fp16_enable"] == "False"
    low, opt, high = (profiles_of(trt[f"trt_profile_{e}_shapes"]) for e in ("min", "opt", "max"))
    assert len(low) == len(opt) == len(high) == 3  # prefill-16, prefill-64, decode
    assert [p["input_ids"] for p in low] == ["1x16", "1x64", "1x1"]
    assert [p["input_ids"] for p in high] == ["1x16", "1x64", "8x1"]
    assert [p["past_lens"] for p in opt] == ["1", "1", "8"]
    assert high[2]["past_key.0"] == "8x2x256x8" and low[2]["past_value.0"] == "1x2x256x8"
    assert set(low[0]) == set(fake_manifest().graph.inputs)  # every input, every profile


def test_settings_follow_the_bundle(tmp_path):
    manifest = fake_manifest(max_context=300)
    got = gpu_settings(tmp_path, manifest, None)
    assert got.cache_dir == tmp_path / "engines" / "ort-trt"
    assert got.capacity == 300 and got.fp16 is False
    assert gpu_settings(tmp_path, manifest, tmp_path / "elsewhere").cache_dir == (
        tmp_path / "elsewhere" / "ort-trt")


def test_only_the_tensorrt_provider_pins_the_kv_capacity(tmp_path):
    assert dimension_overrides("tensorrt", settings(tmp_path)) == {"capacity": 256}
    assert dimension_overrides("cuda", settings(tmp_path)) == {}


def test_a_missing_gpu_provider_is_one_line_that_says_how_to_get_it():
    assert missing_provider(CUDA_EP, [CUDA_EP, "CPUExecutionProvider"]) is None
    message = missing_provider(CUDA_EP, ["CPUExecutionProvider"])
    assert "no CUDAExecutionProvider" in message and "edgeprefill[gpu]" in message
    assert "\n" not in message


@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA provider")
@pytest.mark.parametrize("device", ["cuda", "tensorrt"])
def test_gpu_device_on_a_cpu_onnxruntime_is_a_clear_error(bundle, device):
    bundle_dir = bundle("llama", "standard")
    with pytest.raises(BackendError, match=r"edgeprefill\[gpu\]"):
        OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir), BackendOptions(device=device))


class RecordingBinding:
    def __init__(self) -> None:
        self.bound: dict[str, tuple] = {}

    def bind_input(self, name, device, device_id, dtype, shape, address):
        self.bound[name] = (device, device_id, np.dtype(dtype), tuple(shape), address)

    bind_output = bind_input


def test_device_arena_binds_each_pair_at_its_slot_pointer():
    arena = DeviceArena(ort, (3, 2, 8, 4), np.float32, 2, ["CPUExecutionProvider"], "cpu")
    binding = RecordingBinding()
    arena.bind(binding, [("past_key.0", "present_key.0"), ("past_value.0", "present_value.0")],
               first=1, rows=2)
    slot_bytes = 2 * 8 * 4 * 4
    for index, (past, present) in enumerate([("past_key.0", "present_key.0"),
                                             ("past_value.0", "present_value.0")]):
        address = arena.values[index].data_ptr() + slot_bytes
        assert binding.bound[past] == binding.bound[present] == (
            "cpu", 0, np.dtype(np.float32), (2, 2, 8, 4), address)
    assert all(not a.any() for a in arena.host_arrays()), "zero-filled"


def test_device_arena_copies_and_swaps_whole_slots():
    arena = DeviceArena(ort, (3, 2, 8, 4), np.float32, 1, ["CPUExecutionProvider"], "cpu")
    data = np.arange(3 * 2 * 8 * 4, dtype=np.float32).reshape(3, 2, 8, 4)
    arena.values[0].update_inplace(data)
    arena.copy(1, 2)
    arena.swap(0, 1)
    (got,) = arena.host_arrays()
    np.testing.assert_array_equal(got, data[[1, 0, 1]])


class CpuArenaBackend(OnnxRuntimeBackend):
    """The GPU code path of the ONNX Runtime backend with its arena in CPU OrtValues."""

    def __init__(self, bundle_dir, manifest, options) -> None:
        super().__init__(bundle_dir, manifest, options)
        self._gpu = gpu_settings(bundle_dir, manifest, None)

    def _device_arena(self, shape):
        count = 2 * self.manifest.model.num_layers
        return DeviceArena(self._ort, shape, self.kv_dtype, count, ["CPUExecutionProvider"], "cpu")


def test_the_device_arena_path_computes_what_the_numpy_arena_computes(bundle):
    bundle_dir = bundle("llama", "standard")
    manifest = load_manifest(bundle_dir)
    options = BackendOptions(threads=1)
    device, host = CpuArenaBackend(bundle_dir, manifest, options), OnnxRuntimeBackend(
        bundle_dir, manifest, options)
    rng = np.random.default_rng(0)
    steps = [
        StepBatch(rng.integers(3, 100, (1, 20)), np.array([0], np.int32),
                  np.array([20], np.int32), 1),
        StepBatch(rng.integers(3, 100, (1, 9)), np.array([0], np.int32),
                  np.array([9], np.int32), 0),
        StepBatch(rng.integers(3, 100, (2, 1)), np.array([9, 20], np.int32),
                  np.ones(2, np.int32), 0),
    ]
    for backend in (device, host):
        backend.allocate_kv(slots=3, capacity=64)
    for step in steps:
        np.testing.assert_allclose(device.run(step), host.run(step), rtol=1e-5, atol=1e-5)
    for backend in (device, host):
        backend.copy_kv(1, 2, 21)
        backend.swap_kv(0, 1, 21)
    for got, want in zip(device.kv_arrays(), host.kv_arrays(), strict=True):
        np.testing.assert_allclose(got[:, :, :21], want[:, :, :21], atol=1e-6)


def _gpu_logits_match_cpu(bundle_dir, device: str) -> None:
    manifest = load_manifest(bundle_dir)
    gpu = OnnxRuntimeBackend(bundle_dir, manifest, BackendOptions(device=device))
    cpu = OnnxRuntimeBackend(bundle_dir, manifest, BackendOptions())
    step = StepBatch(np.arange(3, 23)[None], np.array([0], np.int32), np.array([20], np.int32), 0)
    for backend in (gpu, cpu):
        backend.allocate_kv(slots=2, capacity=manifest.max_context)
    np.testing.assert_allclose(gpu.run(step), cpu.run(step), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA_EP, reason="needs onnxruntime-gpu and a GPU")
@pytest.mark.parametrize("flavor", ["ort", "standard"])
def test_cuda_provider_matches_the_cpu(bundle, flavor):
    _gpu_logits_match_cpu(bundle("llama", flavor), "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRT_EP, reason="needs onnxruntime-gpu with TensorRT and a GPU")
def test_tensorrt_provider_matches_the_cpu(bundle):
    _gpu_logits_match_cpu(bundle("llama", "standard"), "tensorrt")
