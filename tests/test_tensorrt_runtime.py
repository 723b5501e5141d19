"""The direct TensorRT and CUDA calls, against stand-ins that record them (tests/trt_fakes.py):
which calls, in which order, with which arguments, and the one-line error for each failure a
user can cause. Also the 256-byte alignment of every KV slot."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgeprefill.engines.trt import cuda as trt_cuda
from edgeprefill.engines.trt.build import BuildInputs, BuildOptions, NetworkTyping, compile_engine
from edgeprefill.engines.trt.cuda import CudaDevice, cuda_mismatch
from edgeprefill.engines.trt.logger import Captured
from edgeprefill.engines.trt.plan import (
    aligned_capacity,
    capacity_step,
    position_bytes,
    profile_plan,
)
from edgeprefill.engines.trt.runtime import TrtRuntime
from edgeprefill.engines.trt.steps import TensorBinding
from edgeprefill.errors import BackendError
from tests.trt_fakes import FakeTensorRT, HostDevice, fake_manifest

A = 0x10000  # an aligned fake device address


@pytest.fixture
def engine_file(tmp_path) -> Path:
    path = tmp_path / "x.engine"
    path.write_bytes(b"engine bytes")
    return path


def open_runtime(engine_file, manifest=None, **knobs):
    manifest = manifest or fake_manifest()
    plan = profile_plan(manifest, 256, 4)
    trt = FakeTensorRT(manifest, profiles=len(plan.profiles), **knobs)
    return trt, TrtRuntime(trt, engine_file, plan, HostDevice(), manifest)


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# ---- alignment


@pytest.mark.parametrize("kv_heads,head_dim,dtype,step", [
    (3, 64, "float16", 2),  # SmolLM2 fp16: 384 B per position
    (3, 64, "float32", 1),  # 768 B: every capacity
    (2, 32, "float32", 1),  # the tiny model
    (1, 8, "float16", 16),  # 16 B per position
    (5, 24, "float16", 16),  # 240 B = 16 x 15
])
def test_every_slot_of_a_rounded_capacity_starts_256_byte_aligned(kv_heads, head_dim, dtype, step):
    manifest = fake_manifest(max_context=2047, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
    assert capacity_step(manifest) == step
    for capacity in (2, 3, 127, 1001, 2047):
        rounded = aligned_capacity(manifest, capacity)
        assert rounded % step == 0 and 2 <= rounded <= 2047
        assert abs(rounded - capacity) < step
        slot_bytes = rounded * position_bytes(manifest)
        assert all(slot * slot_bytes % 256 == 0 for slot in range(64))


def test_an_odd_capacity_rounds_up_unless_that_passes_the_max_context():
    smol = fake_manifest(max_context=2048, kv_heads=3, head_dim=64, dtype="float16")
    assert aligned_capacity(smol, 2047) == 2048
    short = fake_manifest(max_context=2047, kv_heads=3, head_dim=64, dtype="float16")
    assert aligned_capacity(short, 2047) == 2046
    with pytest.raises(BackendError, match="256-byte alignment; use a multiple of 2"):
        profile_plan(short, 2047, 4)


# ---- loading and running an engine


def test_loading_maps_the_file_creates_one_context_per_profile_sharing_one_scratch(engine_file):
    trt, runtime = open_runtime(engine_file)
    assert trt.loaded == [b"engine bytes"]
    scratch = runtime._scratch
    assert trt.calls == [("runtime", "deserialize_cuda_engine", ("mmap",))] + [
        call
        for i in range(3)
        for call in [
            ("engine", "create_execution_context", ("user",)),
            (f"context{i}", "set_device_memory", (scratch, 4096)),
            (f"context{i}", "set_optimization_profile_async", (i, 0)),
        ]
    ]


def test_a_call_sets_input_shapes_then_every_address_then_runs_on_the_stream(engine_file):
    trt, runtime = open_runtime(engine_file)
    trt.calls.clear()
    bindings = {
        "input_ids": TensorBinding(A, (2, 1)),
        "past_lens": TensorBinding(2 * A, (2,)),
        "logits": TensorBinding(3 * A, (2, 50)),
        "past_key.0": TensorBinding(4 * A + 512, (2, 2, 256, 8)),
        "present_key.0": TensorBinding(4 * A + 512, (2, 2, 256, 8)),
    }
    runtime.execute(2, bindings)
    assert trt.calls == [
        ("context2", "set_input_shape", ("input_ids", (2, 1))),
        ("context2", "set_tensor_address", ("input_ids", A)),
        ("context2", "set_input_shape", ("past_lens", (2,))),
        ("context2", "set_tensor_address", ("past_lens", 2 * A)),
        ("context2", "set_tensor_address", ("logits", 3 * A)),  # outputs: no shape
        ("context2", "set_input_shape", ("past_key.0", (2, 2, 256, 8))),
        ("context2", "set_tensor_address", ("past_key.0", 4 * A + 512)),
        ("context2", "set_tensor_address", ("present_key.0", 4 * A + 512)),
        ("context2", "execute_async_v3", (0,)),
    ]


def test_a_rejected_address_is_one_line_and_nothing_runs(engine_file):
    trt, runtime = open_runtime(engine_file, rejected={2 * A})
    trt.calls.clear()
    with pytest.raises(BackendError) as err:
        runtime.execute(2, {"input_ids": TensorBinding(A, (1, 1)),
                            "past_key.0": TensorBinding(2 * A, (1, 2, 256, 8))})
    assert one_line(err) == (
        f"TensorRT rejected the address {2 * A:#x} of past_key.0 (TensorRT gave no reason)")
    assert not any(method == "execute_async_v3" for _, method, _ in trt.calls)


def test_a_misaligned_address_never_reaches_tensorrt(engine_file):
    trt, runtime = open_runtime(engine_file)
    trt.calls.clear()
    with pytest.raises(BackendError) as err:
        runtime.execute(2, {"logits": TensorBinding(A + 128, (1, 50))})
    assert "0x10080 of logits is not 256-byte aligned" in one_line(err)
    assert trt.calls == []


def test_an_engine_tensorrt_cannot_load_says_what_tensorrt_logged(engine_file):
    with pytest.raises(BackendError) as err:
        open_runtime(engine_file, load_error="Serialization assertion\n version tag failed")
    assert one_line(err) == ("TensorRT could not load x.engine; rebuild it with `edgeprefill "
                             "build --force`: Serialization assertion version tag failed")


def test_an_empty_engine_file_is_one_line(tmp_path):
    empty = tmp_path / "x.engine"
    empty.write_bytes(b"")
    with pytest.raises(BackendError, match="cannot read the engine .*x.engine"):
        open_runtime(empty)


@pytest.mark.parametrize("knobs,message", [
    ({"aliases": {}}, "x.engine does not update past_key.0 in place (present_key.0 aliases None)"),
    ({"profiles": 2}, "x.engine has 2 optimization profiles, expected 3"),
])
def test_an_engine_without_in_place_kv_or_with_other_profiles_is_refused(engine_file, knobs,
                                                                           message):
    manifest = fake_manifest()
    plan = profile_plan(manifest, 256, 4)
    trt = FakeTensorRT(manifest, **{"profiles": len(plan.profiles), **knobs})
    with pytest.raises(BackendError) as err:
        TrtRuntime(trt, engine_file, plan, HostDevice(), manifest)
    assert message in one_line(err)


def test_close_frees_the_scratch_and_destroys_the_stream(engine_file):
    _, runtime = open_runtime(engine_file)
    device = runtime.device
    runtime.close()
    assert device.buffers == {} and device.closed and runtime.contexts == []


# ---- building


def build_inputs(tmp_path, manifest=None) -> BuildInputs:
    manifest = manifest or fake_manifest(layers=2)
    plan = profile_plan(manifest, 256, 4)
    return BuildInputs(manifest, plan, "fp32", 256, b"graph", tmp_path / "model.onnx", False,
                       NetworkTyping(True, ()))


def test_a_build_sets_every_profile_then_loads_the_engine_back_to_check_it(tmp_path):
    inputs = build_inputs(tmp_path)
    trt = FakeTensorRT(inputs.manifest)
    blob = compile_engine(trt, inputs, BuildOptions(workspace_mib=64), print)
    assert blob == b"serialized engine" and trt.loaded == [blob]
    shapes = [args for who, method, args in trt.calls if method == "set_shape"]
    expected = [(name, r.min, r.opt, r.max) for profile in inputs.plan.profiles
                for name, r in profile.shapes.items()]
    assert shapes == expected
    order = [method for _, method, _ in trt.calls if method != "set_shape"]
    assert order == ["create_network", "parse", "set_memory_pool_limit",
                     "build_serialized_network", "deserialize_cuda_engine"]
    assert trt.calls[0] == ("builder", "create_network", (1,))  # STRONGLY_TYPED
    assert ("config", "set_memory_pool_limit", ("workspace", 64 << 20)) in trt.calls
    assert ("builder", "build_serialized_network", (3,)) in trt.calls


def test_a_build_expects_kv_updates_of_the_layers_with_kv_only(tmp_path):
    """Llama-Nemotron's layers without attention hold no KV: the parser creates no update
    layer for them, and the build must not take that for a missing write."""
    inputs = build_inputs(tmp_path, fake_manifest(layers=3, attention_free=(1,)))
    trt = FakeTensorRT(inputs.manifest)
    assert trt.kv_layers == 4
    assert compile_engine(trt, inputs, BuildOptions(), print) == b"serialized engine"


def test_a_failed_build_says_what_the_builder_logged_in_one_line(tmp_path):
    inputs = build_inputs(tmp_path)
    trt = FakeTensorRT(inputs.manifest, build_error="[myelin] out of memory:\nneeds 9 GiB")
    with pytest.raises(BackendError) as err:
        compile_engine(trt, inputs, BuildOptions(), print)
    assert one_line(err) == (
        "TensorRT failed to build the engine: [myelin] out of memory: needs 9 GiB")


@pytest.mark.parametrize("knobs,message", [
    ({"kv_layers": 3}, "TensorRT imported 3 KV-cache update layers, expected 4"),
    ({"aliases": {"present_key.0": "past_key.0"}},
     "the built engine does not update past_value.0 in place"),
    ({"profiles": 1}, "the built engine has 1 optimization profiles, expected 3"),
])
def test_a_build_that_would_not_update_the_cache_in_place_fails(tmp_path, knobs, message):
    inputs = build_inputs(tmp_path)
    trt = FakeTensorRT(inputs.manifest, **knobs)
    with pytest.raises(BackendError) as err:
        compile_engine(trt, inputs, BuildOptions(), print)
    assert message in one_line(err)


def test_captured_errors_are_the_last_few_on_one_line_and_warnings_log_once(caplog):
    captured = Captured()
    assert captured.explain("it failed") == "it failed (TensorRT gave no reason)"
    for i in range(5):
        captured.error(f"error {i}\n  detail")
    assert captured.explain("it failed") == (
        "it failed: error 2 detail; error 3 detail; error 4 detail")
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        captured.warning("weights\nare fp32")
        captured.warning("weights are fp32")
    assert [r.getMessage() for r in caplog.records] == ["TensorRT: weights are fp32"]


# ---- CUDA


class FakeCudart(SimpleNamespace):
    def __init__(self, driver: int = 12060, fail: str | None = None) -> None:
        super().__init__(calls=[], cudaError_t=SimpleNamespace(cudaSuccess=0))
        self.driver, self.fail = driver, fail

    def _ok(self, name: str, *values):
        self.calls.append(name)
        return (1 if name == self.fail else 0, *values)

    def cudaDriverGetVersion(self):  # noqa: N802 - CUDA's spelling
        return self._ok("cudaDriverGetVersion", self.driver)

    def cudaStreamCreate(self):  # noqa: N802
        return self._ok("cudaStreamCreate", 77)

    def cudaStreamDestroy(self, stream):  # noqa: N802
        assert stream == 77
        return self._ok("cudaStreamDestroy")

    def cudaGetErrorString(self, err):  # noqa: N802
        return 0, b"invalid resource handle"


def test_cuda_python_must_not_be_newer_than_the_driver_nor_another_major_than_tensorrt():
    assert cuda_mismatch(12, 12060, None) is None
    assert cuda_mismatch(12, 13000, 12) is None  # an older runtime on a newer driver
    assert cuda_mismatch(None, 12060, 13) is None  # cuda-python absent: its import says so
    assert cuda_mismatch(13, 12060, None) == (
        "cuda-python 13.x needs a driver for CUDA 13, and this driver supports CUDA 12.6: "
        "pip install 'cuda-python>=12,<13' (or edgeprefill[tensorrt-cu12])")
    assert cuda_mismatch(12, 13000, 13) == (
        "TensorRT is built for CUDA 13 but cuda-python is 12.x: "
        "pip install 'cuda-python>=13,<14' (or edgeprefill[tensorrt-cu13])")


def test_the_device_checks_versions_before_its_stream_and_destroys_it_once(monkeypatch):
    monkeypatch.setattr(trt_cuda, "bindings_major", lambda: 12)
    monkeypatch.setattr(trt_cuda, "tensorrt_cuda_major", lambda: None)
    rt = FakeCudart()
    device = CudaDevice(rt)
    assert device.stream == 77
    device.close()
    device.close()
    assert rt.calls == ["cudaDriverGetVersion", "cudaStreamCreate", "cudaStreamDestroy"]
    monkeypatch.setattr(trt_cuda, "bindings_major", lambda: 13)
    rt = FakeCudart(driver=12060)
    with pytest.raises(BackendError, match="cuda-python 13.x needs a driver for CUDA 13"):
        CudaDevice(rt)
    assert rt.calls == ["cudaDriverGetVersion"]  # no stream was created


def test_a_failing_cuda_call_is_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(trt_cuda, "bindings_major", lambda: 12)
    with pytest.raises(BackendError) as err:
        CudaDevice(FakeCudart(fail="cudaStreamCreate"))
    assert one_line(err) == "CUDA cudaStreamCreate failed: invalid resource handle"
