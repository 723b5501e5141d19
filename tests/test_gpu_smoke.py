"""scripts/gpu_smoke.py: it skips cleanly without a GPU, and its checks (scenarios, in-place
proof, odd capacity, fp16) run on the CPU against the TensorRT backend over a stand-in
engine (tests/trt_fakes.py), so what it asserts on a GPU is known to pass where it should
and to fail where it should."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions
from edgeprefill.engines.trt.backend import TensorRTBackend
from edgeprefill.engines.trt.plan import aligned_capacity
from tests.trt_fakes import OrtEngineRuntime

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_smoke.py"
HAS_GPU_LIBS = (importlib.util.find_spec("tensorrt") is not None
                or "CUDAExecutionProvider" in ort.get_available_providers())


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


smoke = load_script()


@pytest.mark.skipif(HAS_GPU_LIBS, reason="TensorRT or onnxruntime-gpu is installed here")
def test_without_a_gpu_every_part_skips_in_one_line_and_it_exits_0(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--keep", str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("ok    versions: Python ") and "onnxruntime" in lines[0]
    assert [line.split(":")[0] for line in lines[1:]] == [
        f"SKIP  {part}" for part in smoke.PARTS[1:]]
    assert "TensorRT is not installed" in lines[1]
    assert "no CUDAExecutionProvider" in lines[-1]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "b").exists(), "nothing is exported when nothing can run"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return smoke.Bundles(tmp_path_factory.mktemp("smoke"))


def fake_engine(max_batch: int):
    """TrtSmoke.engine over the stand-in runtime: the capacity rounded as the build does."""

    def engine(self, bundle, capacity=None, precision=None):
        manifest = load_manifest(bundle)
        capacity = aligned_capacity(manifest, capacity or manifest.max_context)
        runtime = OrtEngineRuntime(bundle, manifest, capacity, max_batch)
        return TensorRTBackend(bundle, manifest, BackendOptions(), runtime=runtime), "fake"

    return engine


@pytest.fixture
def trt_smoke(bundles, monkeypatch):
    monkeypatch.setattr(smoke.TrtSmoke, "engine", fake_engine(max_batch=2))
    return smoke.TrtSmoke(None, bundles, max_batch=2)


def test_the_scenarios_pass_on_the_tensorrt_backend_and_plan_what_they_say(trt_smoke):
    line = trt_smoke.logits()
    assert line.startswith("5 scenarios match")
    backend, _ = trt_smoke.engine(trt_smoke.bundles.get())
    backend.allocate_kv(slots=3, capacity=backend.plan.capacity)
    plans = smoke.scenarios(backend.plan.capacity, 2, backend.manifest.model.vocab_size,
                            smoke.CHUNKS)
    calls, profiles = {}, {}
    for scenario in plans:
        backend.runtime.calls.clear()
        backend.allocate_kv(slots=3, capacity=backend.plan.capacity)
        scenario.run(backend)
        calls[scenario.name] = list(backend.runtime.calls)
        profiles[scenario.name] = [backend.plan.profiles[c.profile].name
                                   for c in backend.runtime.calls]
    decode = "decode"
    assert profiles["padded 70-token prefill"] == ["prefill-64", "prefill-16", decode]
    assert profiles["nearly full slot (251+4 of 256)"][-5:] == [decode] * 5  # no bucket fits
    wide = calls["decode of 3 rows (max batch 2)"][-2:]
    assert [c.bindings["input_ids"].shape for c in wide] == [(2, 1), (1, 1)]
    assert set(profiles["alternating profiles"]) == {"prefill-16", "prefill-64", decode}


class Shifted:
    """A backend whose logits are off by `by` from step `after` on."""

    def __init__(self, inner, by: float, after: int) -> None:
        self.inner, self.by, self.after, self.steps = inner, by, after, 0
        self.manifest = inner.manifest

    def run(self, step):
        self.steps += 1
        logits = self.inner.run(step)
        return logits + self.by if self.steps > self.after else logits

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_logit_difference_fails_naming_the_scenario_and_step(bundles):
    bundle = bundles.get()
    with pytest.raises(AssertionError, match=r"padded 70-token prefill: step 1 logits differ"):
        smoke.compare(Shifted(smoke.cpu_backend(bundle), 0.5, after=1),
                      smoke.cpu_backend(bundle), 256, 2, smoke.TOLERANCE["fp32"])
    with pytest.raises(AssertionError, match="differ by nan"):
        smoke.compare(Shifted(smoke.cpu_backend(bundle), np.nan, after=0),
                      smoke.cpu_backend(bundle), 256, 2, smoke.TOLERANCE["fp32"])


def test_the_in_place_proof_passes_and_notices_a_write_elsewhere(trt_smoke, monkeypatch):
    assert "wrote slot 1 positions 0..19" in trt_smoke.in_place()

    original = TensorRTBackend.run

    def also_scribble(self, step):  # a write into another slot, as a wrong address would do
        out = original(self, step)
        self.device.upload(self._arenas[0] + 2 * self.slot_bytes, np.ones(4, np.float32))
        return out

    monkeypatch.setattr(TensorRTBackend, "run", also_scribble)
    with pytest.raises(AssertionError, match="another slot changed"):
        trt_smoke.in_place()


def test_an_odd_capacity_is_rounded_aligned_and_computes_the_cpu_logits(trt_smoke):
    line = trt_smoke.odd_capacity()
    assert line.startswith("--capacity 201 built as 202 (25856 B slots)"), line


def test_the_fp16_part_refuses_float32_at_fp16_and_compares_an_fp16_bundle(trt_smoke):
    line = trt_smoke.fp16()
    assert "5 scenarios match" in line and line.endswith("a float32 bundle at fp16 is refused")
