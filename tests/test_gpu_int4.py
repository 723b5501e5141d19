"""int4 bundles on ONNX Runtime's CUDA provider (`--quantize int4 --dtype fp16`): the same
steps on the GPU compute the CPU's float32 int4 bundle of the same weights (its logits the
rest of the suite checks against transformers on the dequantized weights), and the 4-bit
projections and embedding rows (MatMulNBits, GatherBlockQuantized) run on the GPU. Marked
`gpu`: skips without onnxruntime-gpu and a GPU.

Families: a dense transformer, a hybrid with device-resident states, and one bundle of each
kind of graph tests/test_gpu_families.py runs (experts written out one MatMulNBits each, as
fp16 bundles keep them: export/moe_op.py; Gemma 4's per-layer table, whose width is not a
whole number of blocks in the fixture), at the default accuracy level (the CUDA kernel
computes in float16 at any level: measured on an H200), and the dense one at level 0.

int8 bundles at fp16 (`--quantize int8 --dtype fp16`: MatMulNBits and GatherBlockQuantized
with bits 8) have no float32 twin (a float32 int8 bundle is DynamicQuantizeMatMul's per
channel weights): CUDA runs the very bundle the CPU runs, at level 0, whose logits
tests/test_int8_fp16.py checks against transformers on the dequantized weights. Written
before a GPU ran them (stop 49): ONNX Runtime has had an 8-bit CUDA MatMulNBits since 1.22."""

from __future__ import annotations

import pytest

from edgeprefill.engines.ort.providers import SHAPE_OPS
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig
from tests.test_gpu_families import CAPACITY, FAMILIES, cuda_against_cpu
from tests.test_gpu_providers import HAS_CUDA_EP

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAS_CUDA_EP, reason="needs onnxruntime-gpu and a GPU")]

# Gemma 3n's sparse gate (zero below mean + 1.645 std) with int4 on CUDA: 9.3e-2 of the scale
# on an H200, where its float fp16 bundle is 9.6e-3 and, sparsity off, int4 8.1e-3: a step
# that rounding near the threshold crosses, or more; not established (docs/jetson.md).
SPARSE_GATE = pytest.mark.xfail(reason="Gemma 3n's sparse gate with int4 on CUDA: open, "
                                "docs/jetson.md", strict=False)
CASES = [("llama", 0), *(pytest.param(family, 4, marks=SPARSE_GATE)
                         if family == "gemma3n_text" else (family, 4)
                         for family in ["llama", "qwen3_5_text", *FAMILIES])]
# accuracy level -> the largest difference from the CPU's float32 level-0 logits allowed, as
# a fraction of their scale: float16's rounding (the unquantized fp16 cases' 2e-2), and at
# level 4 what int8 activations may add where a kernel takes them.
LEVELS = {0: 2e-2, 4: 5e-2}


def _export(hf_dir, out, dtype: str, level: int, kind: str = "int4"):
    try:
        export(hf_dir, out, ExportOptions(dtype=dtype, chunks=(16, 32), max_context=CAPACITY,
                                          show_progress=False,
                                          quant=QuantConfig(kind, 32, accuracy_level=level)))
    except ExportError as refused:  # a bundle export does not make is not the GPU's to run
        pytest.skip(f"export refuses it: {refused}")
    return out


@pytest.mark.parametrize(("family", "level"), CASES)
def test_cuda_runs_an_fp16_int4_bundle_as_the_cpu_runs_its_float32_twin(
        hf_model, tmp_path, record_property, family, level):
    hf_dir = hf_model(family)
    gpu_dir = _export(hf_dir, tmp_path / "gpu", "fp16", level)
    cpu_dir = _export(hf_dir, tmp_path / "cpu", "fp32", 0)
    worst, off_gpu = cuda_against_cpu(gpu_dir, cpu_dir, record_property)
    print(f"{family} level {level}: {worst:.2e} of the scale; off the GPU: {dict(off_gpu)}")
    assert worst <= LEVELS[level], f"{worst:.2e} of the logits' scale"
    assert set(off_gpu) <= SHAPE_OPS, f"left the GPU: {dict(off_gpu)}"


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text", *FAMILIES])
def test_cuda_runs_an_fp16_int8_bundle_as_the_cpu_runs_it(hf_model, tmp_path,
                                                         record_property, family):
    bundle = _export(hf_model(family), tmp_path / "b", "fp16", 0, "int8")
    worst, off_gpu = cuda_against_cpu(bundle, bundle, record_property)
    print(f"{family} int8: {worst:.2e} of the scale; off the GPU: {dict(off_gpu)}")
    assert worst <= LEVELS[0], f"{worst:.2e} of the logits' scale"
    assert set(off_gpu) <= SHAPE_OPS, f"left the GPU: {dict(off_gpu)}"
