"""int4 bundles' prefill projections switched at load (engines/ort/int4_prefill.py):
decode runs the bundle's own MatMulNBits bit for bit, prefill stays close to it, and
chunking does not change greedy text."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from tokenizers import Tokenizer

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.int4_prefill import MODE_ENV, prefill_targets
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig
from tests.conftest import TINY_MODEL

# The shipped trained model: its logits have real margins, which a random tiny model's
# lack (there int4 alone flips greedy tokens, so nothing could be said about prefill).
PROMPT = Tokenizer.from_file(str(TINY_MODEL / "tokenizer.json")).encode(
    (TINY_MODEL / "demo_prompt.txt").read_text()).ids
CONTEXT = len(PROMPT) + 16


@pytest.fixture(scope="module")
def int4_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("int4") / "b"
    export(TINY_MODEL, out, ExportOptions(
        chunks=(16, 256), max_context=CONTEXT, show_progress=False, quant=QuantConfig("int4")))
    return out


def backend(bundle, monkeypatch, variant: str) -> OnnxRuntimeBackend:
    monkeypatch.setenv(MODE_ENV, variant)
    loaded = OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(threads=2))
    loaded.allocate_kv(1, CONTEXT)
    return loaded


def run(b: OnnxRuntimeBackend, ids: list[int], past: int) -> np.ndarray:
    return b.run(StepBatch(np.array([ids]), np.array([past], np.int32),
                           np.array([len(ids)], np.int32), 0))[0].copy()


def rows_here() -> bool:
    """Whether `int8` runs the native MatMulInt8 here (the kernels build, VNNI)."""
    from edgeprefill.engines.ort import int8_rows
    from edgeprefill.kernels import select

    return int8_rows.why_not(select.why_not("ort", "float32", "cpu") is None) is None


def test_the_rewrite_switches_every_chunk_row_projection(int4_bundle, monkeypatch):
    b = backend(int4_bundle, monkeypatch, "int8")
    kernel = "MatMulInt8" if rows_here() else "DynamicQuantizeMatMul"
    assert kernel in b.int4_prefill.projections
    graph = onnx.load(str(int4_bundle / load_manifest(int4_bundle).graph.file),
                      load_external_data=False)
    nbits = [n for n in graph.graph.node if n.op_type == "MatMulNBits"]
    # All but those on one row per sequence: the logits head and the last layer's
    # projections after its attention (o, the packed gate/up, down).
    assert len(prefill_targets(graph)) == len(nbits) - 4


@pytest.mark.parametrize("variant, max_rel_error", [("int8", 0.01), ("level0", 0.01)])
def test_prefill_logits_stay_close_to_the_stock_int4_graph(int4_bundle, monkeypatch,
                                                          variant, max_rel_error):
    # The stock graph quantizes activations to int8 per row and block of 32; `int8` per
    # row too where MatMulInt8 runs (VNNI), else per tensor (DynamicQuantizeMatMul), on
    # weights requantized to a grid 18x finer than int4's; `level0` keeps them float. Each
    # differs from the stock graph by an activation quantization error: measured 0.36%
    # (int8 per row) and 0.26% (level0) of the logits' range, against the int4 weights'
    # own 5.0% from fp32 on this model; int8 per tensor 1.35% on a Zen 3 (no VNNI, uint8
    # weights: engines/ort/int8_unsigned.py; 1.8% with its saturating int8 ones).
    stock = run(backend(int4_bundle, monkeypatch, "off"), PROMPT, 0)
    switched = backend(int4_bundle, monkeypatch, variant)
    if "DynamicQuantizeMatMul" in switched.int4_prefill.projections:
        max_rel_error = 0.02  # one scale for the whole chunk
    got = run(switched, PROMPT, 0)
    assert np.abs(got - stock).max() / np.abs(stock).max() < max_rel_error


@pytest.mark.parametrize("kernels", ["auto", "off"])  # with the native decode kernels or not
def test_decode_logits_are_the_stock_graphs(int4_bundle, monkeypatch, kernels):
    """Decode keeps the bundle's own MatMulNBits, bit for bit; where the native kernels run
    on a CPU with VNNI it runs MatMulInt4 instead (engines/ort/int4_decode.py: the same
    quantization, its float32 sums in another order), equal to float32 rounding."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    stock, switched = (backend(int4_bundle, monkeypatch, v) for v in ("off", "int8"))
    run(stock, PROMPT, 0)
    for theirs, ours in zip(stock.kv_arrays(), switched.kv_arrays(), strict=True):
        ours[...] = theirs  # the same cache, so only the decode step's own math differs
    for past, token in enumerate([8, 21, 55], start=len(PROMPT)):
        want, got = run(stock, [token], past), run(switched, [token], past)
        if switched.int4_decode.rewritten:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
        else:
            np.testing.assert_array_equal(got, want)


def greedy(b: OnnxRuntimeBackend, chunk: int, new: int = 12) -> list[int]:
    for at in range(0, len(PROMPT), chunk):
        logits = run(b, PROMPT[at:at + chunk], at)
    out = [int(logits.argmax())]
    for past in range(len(PROMPT), len(PROMPT) + new - 1):
        out.append(int(run(b, [out[-1]], past).argmax()))
    return out


def test_int8_prefill_rows_do_not_depend_on_the_chunking(library, int4_bundle, monkeypatch):
    """Where MatMulInt8 runs, each row is quantized on its own: a prompt prefilled in one
    call or in chunks of 16 leaves the same logits, bit for bit; DynamicQuantizeMatMul
    (EDGEPREFILL_INT8_ROWS=off) scales each call's rows together."""
    if not rows_here():
        pytest.skip("MatMulInt8 needs the native kernels on a CPU with AVX512-VNNI")
    b = backend(int4_bundle, monkeypatch, "int8")
    assert "MatMulInt8" in b.int4_prefill.projections
    whole = run(b, PROMPT, 0)
    for at in range(0, len(PROMPT), 16):
        chunked = run(b, PROMPT[at:at + 16], at)
    np.testing.assert_array_equal(chunked, whole)
    monkeypatch.setenv("EDGEPREFILL_INT8_ROWS", "off")
    stock = backend(int4_bundle, monkeypatch, "int8")
    assert "DynamicQuantizeMatMul" in stock.int4_prefill.projections


@pytest.mark.parametrize("rows", ["auto", "off"])
def test_inspect_names_the_prefill_projections_the_backend_runs(library, int4_bundle,
                                                                monkeypatch, rows):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    monkeypatch.setenv("EDGEPREFILL_INT8_ROWS", rows)
    ran = backend(int4_bundle, monkeypatch, "int8").int4_prefill.projections
    out = CliRunner().invoke(cli, ["inspect", str(int4_bundle)]).output
    line = next(x for x in out.splitlines() if x.startswith("int4 prefill "))
    assert line.startswith(f"int4 prefill {ran}, ")


def test_greedy_text_is_the_same_chunked_and_unchunked(int4_bundle, monkeypatch):
    # Where DynamicQuantizeMatMul runs, a chunk's rows share one scale: the chunking
    # changes the numbers slightly, never the text here (MatMulInt8: not at all).
    expected = greedy(backend(int4_bundle, monkeypatch, "off"), len(PROMPT))
    b = backend(int4_bundle, monkeypatch, "int8")
    assert greedy(b, 16) == greedy(b, 256) == greedy(b, len(PROMPT)) == expected


def test_a_level0_bundle_keeps_its_float_projections(tmp_path, monkeypatch):
    export(TINY_MODEL, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", accuracy_level=0)))
    assert backend(tmp_path / "b", monkeypatch, "int8").int4_prefill.projections == ""


def test_an_unknown_mode_is_a_one_line_error(int4_bundle, monkeypatch):
    from edgeprefill.errors import BackendError

    with pytest.raises(BackendError, match=f"{MODE_ENV}='fast': choose one of int8, level0"):
        backend(int4_bundle, monkeypatch, "fast")
