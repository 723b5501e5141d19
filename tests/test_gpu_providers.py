"""ONNX Runtime's GPU providers: options, the refused TensorRT provider, kernel and node
placement checks and the device KV arena, on the CPU; end-to-end runs on a GPU are marked
`gpu` and skip elsewhere."""

from __future__ import annotations

import ctypes
import logging
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import onnxruntime as ort
import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.arena import DeviceArena
from edgeprefill.engines.ort.backend import PROVIDERS, OnnxRuntimeBackend
from edgeprefill.engines.ort.device_states import DeviceStates
from edgeprefill.engines.ort.providers import (
    ASSIGNMENT_ENTRY,
    CUDA_EP,
    MIN_ORT_GPU,
    GpuSettings,
    Placement,
    check_placement,
    configure_gpu_session,
    dimension_overrides,
    gpu_settings,
    missing_kernel,
    missing_provider,
    placement,
    provider_options,
)
from edgeprefill.errors import BackendError
from tests.trt_fakes import fake_manifest

HAS_CUDA_EP = CUDA_EP in ort.get_available_providers()


def settings(tmp_path, **changes) -> GpuSettings:
    return GpuSettings(**{"cache_dir": tmp_path / "engines" / "ort-trt", "capacity": 256,
                          **changes})


def test_cuda_provider_options_keep_the_arena_tight(tmp_path):
    options = provider_options(PROVIDERS["cuda"], fake_manifest(), settings(tmp_path))
    # A float32 bundle computes in float32, not the provider's default TF32.
    assert options == [{"device_id": "0", "arena_extend_strategy": "kSameAsRequested",
                        "use_tf32": "0"}, {}]
    fp16 = provider_options(PROVIDERS["cuda"], fake_manifest(), settings(tmp_path, fp16=True))
    assert fp16 == [{"device_id": "0", "arena_extend_strategy": "kSameAsRequested"}, {}]


def test_settings_follow_the_bundle(tmp_path):
    manifest = fake_manifest(max_context=300)
    got = gpu_settings(tmp_path, manifest, None)
    assert got.cache_dir == tmp_path / "engines" / "ort-trt"
    assert got.capacity == 300 and got.fp16 is False
    assert gpu_settings(tmp_path, manifest, tmp_path / "elsewhere").cache_dir == (
        tmp_path / "elsewhere" / "ort-trt")


def test_no_supported_provider_pins_an_axis(tmp_path):
    assert dimension_overrides("cuda", settings(tmp_path)) == {}
    assert dimension_overrides("cpu", settings(tmp_path)) == {}


def test_a_missing_gpu_provider_is_one_line_that_says_how_to_get_it():
    assert missing_provider(CUDA_EP, [CUDA_EP, "CPUExecutionProvider"]) is None
    message = missing_provider(CUDA_EP, ["CPUExecutionProvider"])
    assert "no CUDAExecutionProvider" in message and "edgeprefill[gpu]" in message
    assert "\n" not in message


@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA provider")
def test_cuda_device_on_a_cpu_onnxruntime_is_a_clear_error(bundle):
    bundle_dir = bundle("llama", "standard")
    with pytest.raises(BackendError, match=r"edgeprefill\[gpu\]"):
        OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir), BackendOptions(device="cuda"))


def test_the_onnxruntime_tensorrt_provider_is_refused_naming_what_works(bundle):
    bundle_dir = bundle("llama", "standard")
    with pytest.raises(BackendError) as err:
        OnnxRuntimeBackend(bundle_dir, load_manifest(bundle_dir),
                           BackendOptions(device="tensorrt"))
    message = str(err.value)
    assert "first optimization profile" in message and "\n" not in message
    assert "`edgeprefill build BUNDLE`, then `--backend tensorrt`" in message
    assert "--device cuda" in message


def test_run_with_device_tensorrt_prints_the_refusal_in_one_line(bundle):
    done = subprocess.run(
        [sys.executable, "-m", "edgeprefill", "run", str(bundle("llama", "standard")),
         "--device", "tensorrt", "--prompt", "hi", "--max-new-tokens", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--backend tensorrt" in lines[0], done.stderr


def test_a_provider_without_the_kv_write_kernel_is_named_with_the_version_to_install():
    """Judged by the version: listing the kernels loads every provider library, and
    onnxruntime-gpu's TensorRT one kills the process where TensorRT is missing."""

    class Capi:
        def __getattr__(self, name):
            raise AssertionError(f"the kernel table was read ({name})")

    def build(version):
        return SimpleNamespace(__version__=version, capi=Capi())

    assert missing_kernel(build("1.25.0"), CUDA_EP, "TensorScatter", 24) is None
    assert missing_kernel(build("1.31.1"), CUDA_EP, "TensorScatter", 24) is None
    message = missing_kernel(build("1.24.4"), CUDA_EP, "TensorScatter", 24)
    assert "onnxruntime 1.24.4 has no CUDAExecutionProvider kernel for TensorScatter" in message
    assert f"onnxruntime-gpu>={MIN_ORT_GPU}" in message and "\n" not in message
    # Other providers and ops are not judged here (check_placement does after loading).
    assert missing_kernel(build("1.20.0"), "CPUExecutionProvider", "TensorScatter", 24) is None
    assert missing_kernel(build("1.20.0"), CUDA_EP, "GroupQueryAttention", 24) is None


class FakeSubgraph(NamedTuple):
    ep_name: str
    ops: tuple[str, ...]

    def get_nodes(self):
        return [SimpleNamespace(op_type=op, name=f"n{i}", domain="")
                for i, op in enumerate(self.ops)]


class FakeSession:
    def __init__(self, subgraphs) -> None:
        self.subgraphs = subgraphs

    def get_provider_graph_assignment_info(self):
        return self.subgraphs


def test_a_kv_write_on_the_cpu_fails_and_other_cpu_nodes_are_one_line(caplog):
    on_gpu = FakeSubgraph(CUDA_EP, ("MatMul", "TensorScatter"))
    check_placement(FakeSession([on_gpu]), CUDA_EP)
    assert not caplog.records
    # What onnxruntime-gpu 1.31.1 kept on the CPU on an H100: position arithmetic, info only.
    shapes = FakeSubgraph("CPUExecutionProvider", ("Squeeze", "Squeeze", "Slice", "Cast",
                                                   "Add", "Sub"))
    with caplog.at_level(logging.INFO, logger="edgeprefill"):
        check_placement(FakeSession([on_gpu, shapes]), CUDA_EP)
    (record,) = caplog.records
    assert record.levelno == logging.INFO and record.getMessage() == (
        "ONNX Runtime runs 6 nodes off CUDAExecutionProvider (on the CPU): Squeeze x2, "
        "Slice x1, Cast x1, Add x1, Sub x1")
    caplog.clear()
    heavy = FakeSubgraph("CPUExecutionProvider", ("Shape", "Shape", "MatMul"))
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        check_placement(FakeSession([on_gpu, heavy]), CUDA_EP)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.getMessage() == (
        "ONNX Runtime runs 3 nodes off CUDAExecutionProvider (on the CPU): Shape x2, MatMul x1")
    scatter = FakeSubgraph("CPUExecutionProvider", ("TensorScatter",))
    with pytest.raises(BackendError, match=r"KV-cache write \(TensorScatter\) on the CPU"):
        check_placement(FakeSession([on_gpu, scatter]), CUDA_EP)
    gqa = FakeSubgraph("CPUExecutionProvider", ("GroupQueryAttention",))
    with pytest.raises(BackendError, match=r"\(GroupQueryAttention\) on the CPU .*--dtype fp16"):
        check_placement(FakeSession([on_gpu, gqa]), CUDA_EP)


def test_placement_is_read_only_where_onnxruntime_recorded_it(bundle):
    assert placement(object(), CUDA_EP) == Placement(False, Counter())
    bundle_dir = bundle("llama", "standard")
    plain = ort.InferenceSession(str(bundle_dir / "model.onnx"),
                                 providers=["CPUExecutionProvider"])
    assert not placement(plain, CUDA_EP).recorded  # not asked for: ORT raises, we read none
    options = ort.SessionOptions()
    options.log_severity_level = 3
    configure_gpu_session(ort, options)
    assert options.get_session_config_entry(ASSIGNMENT_ENTRY) == "1"
    assert options.log_severity_level == 3  # this onnxruntime records the placement itself
    older = SimpleNamespace(InferenceSession=object)  # no assignment API: ORT's warnings show
    configure_gpu_session(older, options)
    assert options.log_severity_level == 2


class RecordingBinding:
    def __init__(self) -> None:
        self.bound: dict[str, tuple] = {}

    def bind_input(self, name, device, device_id, dtype, shape, address):
        self.bound[name] = (device, device_id, np.dtype(dtype), tuple(shape), address)

    bind_output = bind_input


def test_device_arena_binds_each_pair_at_its_slot_pointer():
    arena = DeviceArena(ort, [(3, 2, 8, 4)] * 2, np.float32, 3, ["CPUExecutionProvider"],
                        "cpu")
    binding = RecordingBinding()
    arena.bind(binding, [[("past_key.0", "present_key.0")],
                         [("past_value.0", "present_value.0")]], first=1, rows=2)
    slot_bytes = 2 * 8 * 4 * 4
    for index, (past, present) in enumerate([("past_key.0", "present_key.0"),
                                             ("past_value.0", "present_value.0")]):
        address = arena.values[index].data_ptr() + slot_bytes
        assert binding.bound[past] == binding.bound[present] == (
            "cpu", 0, np.dtype(np.float32), (2, 2, 8, 4), address)
    assert all(not a.any() for a in arena.host_arrays()), "zero-filled"


def test_a_device_arena_binds_a_layer_whose_value_is_its_key_to_one_buffer():
    """Multi-head latent attention (contract.kv_buffers): both caches at one address."""
    arena = DeviceArena(ort, [(3, 1, 8, 48)], np.float32, 3, ["CPUExecutionProvider"], "cpu")
    binding = RecordingBinding()
    arena.bind(binding, [[("past_key.0", "present_key.0"),
                          ("past_value.0", "present_value.0")]], first=2, rows=1)
    address = arena.values[0].data_ptr() + 2 * 8 * 48 * 4
    assert {binding.bound[name][4] for name in ("past_key.0", "present_key.0", "past_value.0",
                                                "present_value.0")} == {address}


def test_device_arena_copies_and_swaps_whole_slots():
    arena = DeviceArena(ort, [(3, 2, 8, 4)], np.float32, 3, ["CPUExecutionProvider"], "cpu")
    data = np.arange(3 * 2 * 8 * 4, dtype=np.float32).reshape(3, 2, 8, 4)
    arena.values[0].update_inplace(data)
    arena.copy(1, 2)
    arena.swap(0, 1)
    (got,) = arena.host_arrays()
    np.testing.assert_array_equal(got, data[[1, 0, 1]])


def test_device_arena_buffers_of_different_shapes_bind_copy_and_swap_each_its_own():
    """Gemma 4: a full-attention layer's KV is wider than a sliding one's."""
    shapes = [(3, 2, 8, 4), (3, 1, 8, 16)]
    arena = DeviceArena(ort, shapes, np.float32, 3, ["CPUExecutionProvider"], "cpu")
    data = [np.arange(np.prod(s), dtype=np.float32).reshape(s) for s in shapes]
    for value, array in zip(arena.values, data, strict=True):
        value.update_inplace(array)
    binding = RecordingBinding()
    arena.bind(binding, [[("past_key.0", "present_key.0")], [("past_key.1", "present_key.1")]],
               first=1, rows=2)
    assert binding.bound["past_key.1"][3:] == (
        (2, 1, 8, 16), arena.values[1].data_ptr() + 1 * 8 * 16 * 4)
    arena.copy(1, 2)
    arena.swap(0, 1)
    for got, array in zip(arena.host_arrays(), data, strict=True):
        np.testing.assert_array_equal(got, array[[1, 0, 1]])


def test_a_device_arena_without_buffers_keeps_its_slots():
    """A bundle in which no layer attends (Mamba) has no KV: its slots hold states alone."""
    arena = DeviceArena(ort, [], np.float32, 4, ["CPUExecutionProvider"], "cpu")
    binding = RecordingBinding()
    arena.bind(binding, [], first=1, rows=3)
    arena.copy(0, 1)
    arena.swap(0, 1)
    assert (arena.slots, arena.host_arrays(), binding.bound) == (4, [], {})


class CpuArenaBackend(OnnxRuntimeBackend):
    """The GPU code path of the ONNX Runtime backend with its arena in CPU OrtValues."""

    def __init__(self, bundle_dir, manifest, options) -> None:
        super().__init__(bundle_dir, manifest, options)
        self._gpu = gpu_settings(bundle_dir, manifest, None)

    def _device_arena(self, shapes, slots):
        return DeviceArena(self._ort, shapes, self.kv_dtype, slots, ["CPUExecutionProvider"],
                           "cpu")

    def _device_states(self, pairs, slots):
        return DeviceStates(self._ort, pairs, self.manifest.graph.inputs, slots,
                            ["CPUExecutionProvider"], "cpu")


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
    # Each slot's valid positions: the GPU path pads a chunk to a bucket (gpu_shapes.py),
    # whose K/V past the valid tokens is garbage no step reads (slot 1's 9 + 1 here).
    for got, want in zip(device.kv_arrays(), host.kv_arrays(), strict=True):
        for slot, valid in enumerate((21, 10, 21)):
            np.testing.assert_allclose(got[slot, :, :valid], want[slot, :, :valid], atol=1e-6)



class CopiedAtBind:
    """An IOBinding as ONNX Runtime's behaves on a GPU provider: an input in host memory is
    copied to the device when it is bound (IOBinding::BindInput), so a step reads it as it
    was then; device memory is read where it is. `device` holds the (start, end) address
    ranges that stand for device memory here."""

    def __init__(self, binding, device: list[tuple[int, int]]) -> None:
        self._binding, self._device, self._kept = binding, device, []

    def bind_input(self, name, device, device_id, dtype, shape, pointer):
        if not any(start <= pointer < end for start, end in self._device):
            size = int(np.prod(shape)) * np.dtype(dtype).itemsize
            self._kept.append(np.frombuffer(ctypes.string_at(pointer, size), np.uint8).copy())
            pointer = self._kept[-1].ctypes.data
        self._binding.bind_input(name, device, device_id, dtype, shape, pointer)

    def __getattr__(self, name):
        return getattr(self._binding, name)


def _device_ranges(backend) -> list[tuple[int, int]]:
    """The address ranges of a CpuArenaBackend's device buffers (KV and states)."""
    values = [*backend.arena.values]
    if isinstance(backend.state, DeviceStates):
        values += [*backend.state.values, *backend.state.scratch]
    return [(value.data_ptr(), value.data_ptr() + value.numpy().nbytes) for value in values]


@pytest.mark.parametrize("family", ["lfm2", "mamba2", "qwen3_next"])
def test_a_gpu_providers_states_stay_on_the_device_and_compute_the_cpus_logits(bundle, family):
    """Seen on an H100: with the states in host memory every stateful bundle's logits went
    wrong from its second step, the cached bindings having copied them to the GPU once.
    In device memory (DeviceStates) they are read where the last step left them; slot
    copies, swaps and snapshots move them there."""
    bundle_dir = bundle(family, "standard")
    manifest = load_manifest(bundle_dir)
    options = BackendOptions(threads=1)
    device, host = CpuArenaBackend(bundle_dir, manifest, options), OnnxRuntimeBackend(
        bundle_dir, manifest, options)
    for backend in (device, host):
        backend.allocate_kv(slots=3, capacity=64)
    assert isinstance(device.state, DeviceStates)
    made = device.session.io_binding
    device.session.io_binding = lambda: CopiedAtBind(made(), _device_ranges(device))
    steps = _steps(manifest.model.vocab_size)
    for step in steps:
        np.testing.assert_allclose(device.run(step), host.run(step), rtol=1e-5, atol=1e-5)
    for backend in (device, host):  # slot 0 holds 28 tokens, slot 1 one
        saved = backend.save_state(0)
        backend.copy_kv(0, 2, 28)
        backend.swap_kv(0, 1, 28)
        backend.restore_state(saved, 1)  # undoes the swap's state half for slot 1
    again = StepBatch(steps[2].input_ids, np.array([28, 28], np.int32), np.ones(2, np.int32), 1)
    np.testing.assert_allclose(device.run(again), host.run(again), rtol=1e-5, atol=1e-5)
    for got, want in zip(device.state.values, host.state.arrays, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)

def _steps(vocab: int) -> list[StepBatch]:
    """A first chunk, a second one after it, and a decode step of two rows."""
    rng = np.random.default_rng(0)
    return [StepBatch(rng.integers(3, vocab, (1, 20)), np.array([0], np.int32),
                      np.array([20], np.int32), 0),
            StepBatch(rng.integers(3, vocab, (1, 7)), np.array([20], np.int32),
                      np.array([7], np.int32), 0),
            StepBatch(rng.integers(3, vocab, (2, 1)), np.array([27, 0], np.int32),
                      np.array([1, 1], np.int32), 0)]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA_EP, reason="needs onnxruntime-gpu and a GPU")
@pytest.mark.parametrize(("flavor", "dtype", "tolerance"), [
    ("standard", "fp32", 1e-5), ("standard", "fp16", 3e-2), ("ort", "fp16", 3e-2)])
def test_cuda_provider_matches_the_cpu(hf_model, tmp_path, flavor, dtype, tolerance):
    """On an H100 (onnxruntime-gpu 1.31.1): standard fp32 1.3e-6 of the logits' scale (TF32
    off), fp16 5e-3; the ort flavour at fp16 5e-4 with the total length fed from the host."""
    from edgeprefill.export.exporter import ExportOptions, export

    bundles = {}
    for kind in {dtype, "fp32"}:  # fp16 is compared with the same weights in float32
        bundles[kind] = tmp_path / kind
        export(hf_model("llama"), bundles[kind], ExportOptions(
            flavor=flavor, dtype=kind, chunks=(16, 64), max_context=128, show_progress=False))
    gpu = OnnxRuntimeBackend(bundles[dtype], load_manifest(bundles[dtype]),
                             BackendOptions(device="cuda"))
    cpu = OnnxRuntimeBackend(bundles["fp32"], load_manifest(bundles["fp32"]), BackendOptions())
    for backend in (gpu, cpu):
        backend.allocate_kv(slots=2, capacity=128)
    for step in _steps(gpu.manifest.model.vocab_size):
        want = cpu.run(step).copy()
        scale = max(1.0, float(np.max(np.abs(want))))
        assert float(np.max(np.abs(gpu.run(step) - want))) / scale <= tolerance


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA_EP, reason="needs onnxruntime-gpu and a GPU")
def test_a_float32_ort_bundle_is_refused_on_the_cuda_provider(bundle):
    """ONNX Runtime's CUDA GroupQueryAttention is float16/bfloat16 only: a float32 ort
    bundle would run its attention and KV write on the CPU (seen on an H100)."""
    path = bundle("llama", "ort")
    with pytest.raises(BackendError, match=r"\(GroupQueryAttention\) on the CPU .*--dtype fp16"):
        OnnxRuntimeBackend(path, load_manifest(path), BackendOptions(device="cuda"))


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_a_cuda_onnxruntime_without_the_kv_write_kernel_is_refused_before_loading(
    bundle, monkeypatch
):
    from edgeprefill.engines.ort import backend as ort_backend

    asked = []

    def no_kernel(module, wanted, op_type, opset):
        asked.append((wanted, op_type, opset))
        return f"no {wanted} kernel for {op_type}; install onnxruntime-gpu>={MIN_ORT_GPU}"

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_EP, "CPUExecutionProvider"])
    monkeypatch.setattr(ort_backend, "missing_kernel", no_kernel)
    standard = bundle("llama", "standard")
    with pytest.raises(BackendError, match=r"onnxruntime-gpu>=1\.25"):
        OnnxRuntimeBackend(standard, load_manifest(standard), BackendOptions(device="cuda"))
    assert asked == [(CUDA_EP, "TensorScatter", 24)]
    # The ort flavour writes its cache through GroupQueryAttention: no TensorScatter to ask
    # about; this CPU build then falls back, which is refused in one line too.
    asked.clear()
    flavour = bundle("llama", "ort")
    with pytest.raises(BackendError, match="could not use CUDAExecutionProvider"):
        OnnxRuntimeBackend(flavour, load_manifest(flavour), BackendOptions(device="cuda"))
    assert asked == []


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_the_cuda_libraries_are_preloaded_once_and_a_fallback_quotes_what_failed(
    bundle, monkeypatch
):
    """A pip-installed CUDA is not on the loader's path: onnxruntime's preload_dlls loads it
    before the first GPU session. When the provider still fails, the one-line refusal says
    which library did not load (preload_dlls prints it; this CPU build then falls back)."""
    from edgeprefill.engines.ort import providers

    calls = []

    def preload():
        calls.append(1)
        print("Failed to load libcublasLt.so.13: cannot open shared object file")

    monkeypatch.setattr(providers, "_PRELOADED", [])
    monkeypatch.setattr(ort, "preload_dlls", preload, raising=False)
    severities = []  # onnxruntime-gpu 1.31's plugin-EP warning at every session is silenced
    monkeypatch.setattr(ort, "set_default_logger_severity", severities.append)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_EP, "CPUExecutionProvider"])
    flavour = bundle("llama", "ort")
    for _ in range(2):
        with pytest.raises(BackendError, match=r"could not use CUDAExecutionProvider .*"
                           r"\(loading them: Failed to load libcublasLt\.so\.13: cannot open"):
            OnnxRuntimeBackend(flavour, load_manifest(flavour), BackendOptions(device="cuda"))
    assert calls == [1] and severities == [3], "loaded once per process"
    # On the CPU nothing is preloaded.
    OnnxRuntimeBackend(flavour, load_manifest(flavour), BackendOptions()).close()
    assert calls == [1]


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_the_total_length_fed_from_the_host_gives_the_graphs_numbers(bundle, monkeypatch, family):
    """On a GPU provider GroupQueryAttention's total length is bound from the host (the
    in-graph one gave wrong logits on an H100, engines/ort/host_total.py). Run here with the
    rewrite forced on the CPU: every step's logits equal the graph's own, for chunked
    prefills, a window smaller than the chunks (gemma2) and rows at different positions."""
    from edgeprefill.engines.ort import backend as ort_backend
    from edgeprefill.engines.ort.host_total import HOST_TOTAL

    path = bundle(family, "ort")
    manifest = load_manifest(path)
    monkeypatch.setenv("EDGEPREFILL_KERNELS", "off")  # the GPU keeps GroupQueryAttention too
    stock = OnnxRuntimeBackend(path, manifest, BackendOptions(threads=1))
    monkeypatch.setattr(ort_backend, "feeds_total", lambda device: True)
    fed = OnnxRuntimeBackend(path, manifest, BackendOptions(threads=1))
    assert not stock.host_total and fed.host_total
    assert HOST_TOTAL in [i.name for i in fed.session.get_inputs()]
    rng = np.random.default_rng(3)
    vocab = manifest.model.vocab_size
    steps = [StepBatch(rng.integers(3, vocab, (1, 16)), np.array([0], np.int32),
                       np.array([16], np.int32), 0),
             StepBatch(rng.integers(3, vocab, (1, 16)), np.array([0], np.int32),
                       np.array([11], np.int32), 1),
             StepBatch(rng.integers(3, vocab, (1, 16)), np.array([16], np.int32),
                       np.array([16], np.int32), 0),
             StepBatch(rng.integers(3, vocab, (2, 1)), np.array([32, 11], np.int32),
                       np.array([1, 1], np.int32), 0)]
    for backend in (stock, fed):
        backend.allocate_kv(slots=2, capacity=64)
    for step in steps:
        want = stock.run(step).copy()
        np.testing.assert_array_equal(fed.run(step), want)


def test_the_host_total_is_the_graphs_formula():
    """max(past_lens) + the chunk's (padded) width, as export/flavors.py computes it: the
    CPU kernel reads only each row's seqlens_k, so only this pins the longest row."""
    from edgeprefill.engines.ort.host_total import host_total

    step = StepBatch(np.zeros((2, 5), np.int64), np.array([32, 11], np.int32),
                     np.array([5, 2], np.int32), 0)
    total = host_total(step)
    assert total.dtype == np.int32 and total.shape == () and int(total) == 37
