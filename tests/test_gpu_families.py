"""ONNX Runtime's CUDA provider over one bundle of each kind of graph: the same steps on the
GPU and on the CPU (whose logits the rest of the suite checks against transformers) give the
same numbers, and nothing but shape arithmetic leaves the GPU. Marked `gpu`: skips without
onnxruntime-gpu and a GPU.

The families are one per graph mechanism the CUDA provider sees: soft-caps and sliding
windows, per-layer rope bases, AltUp and shared KV, per-layer KV shapes (Gemma 4, MiMo-V2-Flash's
padded value heads), routed experts, attention sinks, latent attention, ALiBi (BLOOM's, and
Falcon-RW's rounded to bfloat16), M-RoPE, fused qkv, learned positions, Beam's output gates
and depth-scaled residual adds, BitNet's int8 ternary weights, and the stateful mixers
(Mamba-1/2, gated delta, short convolution, RG-LRU) with their states in device memory.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.providers import CUDA_EP, SHAPE_OPS, placement
from edgeprefill.errors import ExportError
from tests.test_gpu_providers import HAS_CUDA_EP, _steps

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAS_CUDA_EP, reason="needs onnxruntime-gpu and a GPU")]

FAMILIES = ["gemma2", "gemma3_text", "gemma3n_text", "qwen3_moe", "gpt_oss", "deepseek_v3",
            "bloom", "qwen2_vl", "phi3", "opt", "mamba", "mamba2", "qwen3_next", "lfm2",
            "jamba", "recurrent_gemma", "falcon_h1", "bitnet",
            "falcon-rw", "beam", "mimo_v2_flash", "gemma4_text", "doge"]

# (flavor, dtype) on the GPU -> the largest difference from the CPU's float32 logits allowed,
# as a fraction of their scale. float32 without TF32 computes the CPU's numbers up to the
# order of summation; float16 rounds every activation.
CASES = {("standard", "fp32"): 1e-4, ("ort", "fp16"): 2e-2}
CAPACITY = 96


def _export(hf_model, family, out, flavor, dtype):
    from edgeprefill.export.exporter import ExportOptions, export

    try:
        export(hf_model(family), out, ExportOptions(
            flavor=flavor, dtype=dtype, chunks=(16, 32), max_context=CAPACITY,
            show_progress=False))
    except ExportError as refused:  # a bundle export does not make is not the GPU's to run
        pytest.skip(f"export refuses it: {refused}")
    return out


def cuda_against_cpu(gpu_dir, cpu_dir, record_property) -> tuple[float, Counter]:
    """The same steps (test_gpu_providers._steps) on CUDA and on the CPU: the largest
    difference of the logits as a fraction of their scale, and the nodes CUDA left to the
    CPU; both recorded as the test's properties."""
    gpu = OnnxRuntimeBackend(gpu_dir, load_manifest(gpu_dir), BackendOptions(device="cuda"))
    cpu = OnnxRuntimeBackend(cpu_dir, load_manifest(cpu_dir), BackendOptions())
    off_gpu = placement(gpu.session, CUDA_EP).elsewhere
    record_property("off_gpu", dict(off_gpu))
    for backend in (gpu, cpu):
        backend.allocate_kv(slots=2, capacity=CAPACITY)
    worst = 0.0
    for step in _steps(gpu.manifest.model.vocab_size):
        want = cpu.run(step).copy()
        got = gpu.run(step)
        scale = max(1.0, float(np.max(np.abs(want))))
        worst = max(worst, float(np.max(np.abs(got - want))) / scale)
    record_property("max_difference_of_scale", worst)
    return worst, off_gpu


@pytest.mark.parametrize(("flavor", "dtype"), list(CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_computes_the_cpus_logits(hf_model, tmp_path, record_property, family, flavor,
                                       dtype):
    gpu_dir = _export(hf_model, family, tmp_path / "gpu", flavor, dtype)
    cpu_dir = gpu_dir if dtype == "fp32" else _export(hf_model, family, tmp_path / "cpu",
                                                     flavor, "fp32")
    worst, off_gpu = cuda_against_cpu(gpu_dir, cpu_dir, record_property)
    assert worst <= CASES[flavor, dtype], f"{worst:.2e} of the logits' scale"
    assert set(off_gpu) <= SHAPE_OPS, f"left the GPU: {dict(off_gpu)}"
