"""The native projection ops where the native attention does not run: Helium's bundles with
a smooth softmax set in their attention (which the native kernels lack; every exported
attention they take) keep GroupQueryAttention, and still get MatMulInt8 (int8), MatMulInt4
(int4 decode) and MatMulBf16 (`--compute bf16`), with `inspect` saying so."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from edgeprefill.bundle import load_manifest
from edgeprefill.cli.main import cli
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import int4_decode, int8_rows
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.errors import BackendError
from edgeprefill.kernels import select
from tests.conftest import VOCAB
from tests.test_fused_steps import lacking_bundle

needs_int_kernels = pytest.mark.skipif(not int4_decode.cpu_has_int_kernels(),
                                       reason="no AVX512-VNNI nor AVX2 here")
PROMPT = [1] + [int(t) for t in np.random.default_rng(5).integers(3, VOCAB, size=19)]


@pytest.fixture(scope="module")
def helium(hf_model, tmp_path_factory):
    """quantization (None, "int8", "int4") -> the helium test model's bundle, its attention
    with a smooth softmax (tests/test_fused_steps.py's lacking_bundle)."""
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    made = {}

    def get(kind: str | None):
        if kind not in made:
            exported = tmp_path_factory.mktemp(f"helium-{kind}")
            export(hf_model("helium"), exported, ExportOptions(
                chunks=(16, 64), max_context=128, show_progress=False, overwrite=True,
                quant=QuantConfig(kind) if kind else None))
            made[kind] = lacking_bundle(exported, exported.with_name(exported.name + "-smooth"))
        return made[kind]

    return get


def load(bundle, compute: str = "fp32") -> OnnxRuntimeBackend:
    b = OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(threads=2,
                                                                         compute=compute))
    b.allocate_kv(1, 128)
    return b


def logits(b: OnnxRuntimeBackend) -> np.ndarray:
    return b.run(StepBatch(np.array([PROMPT]), np.array([0], np.int32),
                           np.array([len(PROMPT)], np.int32), 0))[0].copy()


def inspect_lines(bundle) -> list[str]:
    return CliRunner().invoke(cli, ["inspect", str(bundle)]).output.splitlines()


@needs_int_kernels
def test_int8_projections_run_natively_beside_the_stock_attention(helium, library,
                                                                 monkeypatch):
    monkeypatch.setenv(select.MODE_ENV, "auto")
    native = load(helium("int8"))
    assert native.kernels.library is None  # no attention node the kernel supports
    assert "no attention node" in native.kernels.described
    assert native.int8_rows.rewritten > 0
    exact = logits(load(helium(None)))
    monkeypatch.setenv(int8_rows.MODE_ENV, "off")
    stock = load(helium("int8"))
    assert stock.int8_rows.rewritten == 0
    ours, theirs = (np.abs(logits(b) - exact).max() for b in (native, stock))
    assert 0 < ours <= 1.1 * theirs, (ours, theirs)  # measured: 0.111 against 0.125
    monkeypatch.delenv(int8_rows.MODE_ENV)
    lines = inspect_lines(helium("int8"))
    assert any(x.startswith("kernels ") and select.NO_ATTENTION in x for x in lines), lines
    assert any(x.startswith("int8 ") and "MatMulInt8 (native" in x for x in lines), lines
    # The steps line says what the backend decided: two calls, for the stock attention.
    assert native.why_not_fused is not None
    steps = next(x for x in lines if x.startswith("steps "))
    assert native.why_not_fused in steps
    # --compute bf16 has nothing to run on it (the load refuses), and inspect says so.
    compute = next(x for x in lines if x.startswith("compute "))
    assert "--compute bf16: nothing to run in bf16 here" in compute
    with pytest.raises(BackendError, match="nothing to run in bf16"):
        load(helium("int8"), compute="bf16")


@needs_int_kernels
def test_int4_decode_projections_run_natively_beside_the_stock_attention(helium, library):
    b = load(helium("int4"))
    assert b.kernels.library is None
    assert b.int4_decode.rewritten > 0
    step = b.run(StepBatch(np.array([[PROMPT[0]]]), np.array([0], np.int32),
                           np.array([1], np.int32), 0))
    assert np.isfinite(step).all()
    assert any("int4 decode MatMulInt4 (native)" in x for x in inspect_lines(helium("int4")))


def test_bf16_compute_runs_the_projections_beside_the_stock_attention(helium, library):
    from edgeprefill.engines.ort.bf16_compute import cpu_has_bf16

    if not cpu_has_bf16():
        pytest.skip("no AVX512-BF16 here")
    exact = logits(load(helium(None)))
    b = load(helium(None), compute="bf16")
    assert b.kernels.library is None and b.compute.rewritten > 0
    said = "MatMulBf16; AVX512-BF16; the attention GroupQueryAttention, in fp32"
    assert said in b.compute.described  # --stats
    assert any(x.startswith("compute ") and said in x for x in inspect_lines(helium(None)))
    got = logits(b)
    # bf16 operands: ~3 significant digits per product, float32 sums.
    assert np.abs(got - exact).max() <= 0.05 * np.abs(exact).max()
    assert int(got.argmax()) == int(exact.argmax())


def test_a_kernel_library_the_user_may_not_read_means_the_stock_graph(monkeypatch):
    """Path.is_file raises PermissionError on a cache folder this user may not enter (a
    service account whose HOME is another user's): every command had a traceback."""
    from edgeprefill.kernels import select as kernel_select

    class Unreadable:
        def is_file(self):
            raise PermissionError(13, "Permission denied", "/root/.cache/edgeprefill/k.so")

    monkeypatch.setenv(kernel_select.MODE_ENV, "auto")
    monkeypatch.setattr(kernel_select, "library_path", Unreadable)
    assert kernel_select.why_not("ort", "float32", "cpu") == \
        "library unreadable: Permission denied (/root/.cache/edgeprefill/k.so)"
