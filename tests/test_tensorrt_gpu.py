"""`edgeprefill build` and the TensorRT backend on a real GPU (marked `gpu`; skip elsewhere)."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch, create_backend
from edgeprefill.engines.trt.build import BuildOptions, build_engine
from edgeprefill.sdk import Engine, GenerationParams

HAS_TRT = all(importlib.util.find_spec(m) is not None for m in ("tensorrt", "cuda"))

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_TRT, reason="needs TensorRT + GPU")]


@pytest.fixture(scope="module")
def built(bundle, tmp_path_factory):
    """A private copy of the standard bundle with an fp32 engine of capacity 512 built."""
    bundle_dir = tmp_path_factory.mktemp("trt") / "bundle"
    shutil.copytree(bundle("llama", "standard"), bundle_dir)
    result = build_engine(bundle_dir, BuildOptions(precision="fp32", max_batch=4), print)
    assert not result.reused and result.engine.is_file()
    return bundle_dir


def test_a_second_build_reuses_the_cached_engine(built):
    result = build_engine(built, BuildOptions(precision="fp32", max_batch=4), print)
    assert result.reused


def test_the_engine_computes_the_cpu_logits(built):
    manifest = load_manifest(built)
    trt = create_backend("tensorrt", built, manifest, BackendOptions())
    cpu = create_backend("onnxruntime", built, manifest, BackendOptions())
    steps = [
        StepBatch(np.arange(3, 73)[None], np.array([0], np.int32), np.array([70], np.int32), 0),
        StepBatch(np.arange(5, 15)[None], np.array([0], np.int32), np.array([10], np.int32), 1),
        StepBatch(np.array([[7], [8]]), np.array([70, 10], np.int32), np.ones(2, np.int32), 0),
    ]
    for backend in (trt, cpu):
        backend.allocate_kv(slots=2, capacity=manifest.max_context)
    for step in steps:
        np.testing.assert_allclose(trt.run(step), cpu.run(step), rtol=1e-3, atol=1e-3)
    trt.close()


def test_the_engine_generates_the_cpu_tokens(built):
    params = GenerationParams(max_new_tokens=16, ignore_eos=True)
    prompts = [list(range(3, 60)), list(range(10, 25))]
    outputs = []
    for backend in ("onnxruntime", "tensorrt"):
        with Engine.load(built, backend=backend, background=False, kv_slots=2) as engine:
            outputs.append([engine.generate(p, params).result().token_ids for p in prompts])
    assert outputs[0] == outputs[1]
