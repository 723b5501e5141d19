"""edgeprefill.MatMulInt8 (kernels/matmul_int8.cc) and its switch into int8 bundles
(engines/ort/int8_rows.py): the op against a numpy reference of per-row quantization, and
whole bundles whose rows no longer depend on their chunk- or batch-mates."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import int4_decode, int8_rows
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.errors import BackendError
from edgeprefill.export.quantize import int8_per_channel
from edgeprefill.kernels.graph import DOMAIN

needs_int_kernels = pytest.mark.skipif(not int4_decode.cpu_has_int_kernels(),
                                       reason="no AVX512-VNNI nor AVX2 here")


def reference(a: np.ndarray, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Each row quantized by its own largest magnitude / 127 (round half to even), the
    int products summed exactly, scaled by the row's and the column's scale."""
    top = np.abs(a).max(axis=-1, keepdims=True) / 127
    top[top == 0] = 1
    q = np.rint(a / top.astype(np.float32)).astype(np.int64)
    return (q @ codes.astype(np.int64)) * top * scale


def run_op(a: np.ndarray, codes: np.ndarray, scale: np.ndarray, library, threads: int):
    packed, sums = int8_rows.pack(codes)
    node = helper.make_node(int8_rows.OP, ["a", "b", "scale", "sums"], ["y"], domain=DOMAIN,
                            N=codes.shape[1])
    graph = helper.make_graph(
        [node], "int8", [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scale, "scale"),
         numpy_helper.from_array(sums, "sums")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(library))
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a})[0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, k, n", [(1, 576, 960), (7, 33, 70), (64, 576, 1536), (130, 96, 130)])
def test_op_matches_per_row_quantization(library, m, k, n, threads):
    rng = np.random.default_rng(m + k + n)
    codes, scale = int8_per_channel(rng.standard_normal((k, n)).astype(np.float32))
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    a[0, 0] *= 1000  # a loud row must not change the others' scales
    got = run_op(a, codes, scale, library, threads)
    want = reference(a, codes, scale)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    # each row alone gives the same bits
    np.testing.assert_array_equal(run_op(a[:, 1:2], codes, scale, library, threads), got[:, 1:2])


def kernel_order(a: np.ndarray, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The op's float32 arithmetic in numpy: the row's scale (largest magnitude / 127, 1
    for a zero row), codes = rint(a x float32(1 / scale)), exact integer sums, then
    float32(sum) x (the column's scale x the row's), for bit-for-bit checks."""
    top = np.abs(a).max(axis=-1, keepdims=True) / np.float32(127)
    top[top == 0] = 1
    q = np.rint(a * (np.float32(1) / top)).astype(np.int64)
    sums = (q @ codes.astype(np.int64)).astype(np.float32)
    return sums * (scale * top)


@pytest.mark.parametrize("m, k, n", [(1, 576, 960), (5, 100, 70), (9, 576, 200)])
def test_every_path_sums_exactly(library, m, k, n):
    """VNNI, AVX2 and the portable loops all sum the int8 products exactly and scale them
    the same way: these bits on every CPU. Column 0's weights are all -128 and row 0's
    codes all -127 (then +127): AVX2's int16 pairs at their largest, 2 x 128 x 127."""
    rng = np.random.default_rng(m + k + n)
    codes, scale = int8_per_channel(rng.standard_normal((k, n)).astype(np.float32))
    codes[:, 0] = -128
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    a[0, 0] = -1.0
    got = run_op(a, codes, scale, library, 2)
    np.testing.assert_array_equal(got, kernel_order(a, codes, scale))
    a[0, 0] = 1.0
    np.testing.assert_array_equal(run_op(a, codes, scale, library, 2),
                                  kernel_order(a, codes, scale))


@pytest.mark.parametrize("m, k, n", [(1, 203, 150), (2, 37, 23), (3, 203, 150), (4, 37, 150),
                                     (5, 203, 23), (6, 203, 150), (7, 37, 150), (53, 203, 150)])
def test_odd_shapes_sum_exactly(library, m, k, n):
    """The tilings' tails: rows 1-7 and 53 (register tiles of 2, 4 or 6 rows and what is
    left of them, a second row block on two threads), K not a multiple of 4 or 32, N
    ending inside a panel's quarter (16 columns) and inside an 8-column register. Column
    0's weights are all -128 and row 0's codes all -127: AVX2's int16 pairs at their
    largest. The same bits as numpy's int64 sums, on one thread and on two."""
    rng = np.random.default_rng(m * k * n)
    codes, scale = int8_per_channel(rng.standard_normal((k, n)).astype(np.float32))
    codes[:, 0] = -128
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    a[0, 0] = -1.0
    want = kernel_order(a, codes, scale)
    for threads in (1, 2):
        np.testing.assert_array_equal(run_op(a, codes, scale, library, threads), want)


def test_pack_layout():
    codes = np.arange(5 * 70, dtype=np.int64).reshape(5, 70).astype(np.int8)
    packed, sums = int8_rows.pack(codes)
    b = packed.view(np.int8)
    assert b.shape == (2, 2, 64, 4)
    assert b[1, 0, 3, 2] == codes[2, 67] and b[0, 1, 5, 0] == codes[4, 5]
    assert not b[0, 1, :, 1:].any() and not b[1, :, 6:].any()  # past K, past N
    np.testing.assert_array_equal(sums, codes.astype(np.int32).sum(0))


def load(path, monkeypatch, **env) -> OnnxRuntimeBackend:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    backend = OnnxRuntimeBackend(path, load_manifest(path), BackendOptions(threads=2))
    backend.allocate_kv(2, 512)
    return backend


def prompt_logits(backend, ids: np.ndarray, chunk: int, row: int = 0) -> np.ndarray:
    for at in range(0, ids.size, chunk):
        piece = ids[at:at + chunk][None, :]
        out = backend.run(StepBatch(piece, np.array([at], np.int32),
                                    np.array([piece.shape[1]], np.int32), row))
    return out[0].copy()


@needs_int_kernels
def test_an_int8_bundles_rows_keep_their_own_numbers(quantized, bundle, library, monkeypatch):
    path = quantized("int8")
    graph = onnx.load(str(path / load_manifest(path).graph.file), load_external_data=False)
    stock_nodes = sum(n.op_type == "DynamicQuantizeMatMul" for n in graph.graph.node)
    rows = load(path, monkeypatch, EDGEPREFILL_KERNELS="require")
    assert rows.int8_rows.rewritten == stock_nodes > 0
    ids = np.random.default_rng(0).integers(0, 128, 100).astype(np.int64)
    one_shot = prompt_logits(rows, ids, 100, row=0)
    # a prompt's chunking does not move its numbers ...
    np.testing.assert_array_equal(prompt_logits(rows, ids, 16, row=1), one_shot)
    # ... nor does another row decoded in the same call
    step = StepBatch(np.array([[7], [9]]), np.array([100, 100], np.int32),
                     np.ones(2, np.int32), 0)
    both = rows.run(step).copy()
    alone = rows.run(StepBatch(np.array([[7]]), np.array([100], np.int32),
                               np.ones(1, np.int32), 0)).copy()
    np.testing.assert_array_equal(both[0], alone[0])
    # and the quantization error stays that of the bundle's own int8 projections (a row's
    # own scale is finer than the chunk's, so no larger), against the float32 bundle
    stock = load(path, monkeypatch, EDGEPREFILL_INT8_ROWS="off")
    assert stock.int8_rows.rewritten == 0
    exact = prompt_logits(load(bundle("llama"), monkeypatch), ids, 100)
    ours, theirs = (np.abs(x - exact).max() for x in (one_shot, prompt_logits(stock, ids, 100)))
    assert 0 < ours <= 1.1 * theirs, (ours, theirs)  # measured: 0.12 against 0.24


@needs_int_kernels
def test_inspect_says_what_an_int8_bundles_projections_run(quantized, library, monkeypatch):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    def line() -> str:
        out = CliRunner().invoke(cli, ["inspect", str(quantized("int8"))]).output
        return next(x for x in out.splitlines() if x.startswith("int8 "))

    assert "MatMulInt8 (native: each row quantized on its own)" in line()
    monkeypatch.setenv(int8_rows.MODE_ENV, "off")
    assert "DynamicQuantizeMatMul (EDGEPREFILL_INT8_ROWS=off" in line()


def test_not_without_vnni_or_avx2_or_when_turned_off(monkeypatch):
    assert "no native kernels" in int8_rows.describe(False)
    monkeypatch.setenv(int8_rows.MODE_ENV, "off")
    assert int8_rows.why_not(True) == "EDGEPREFILL_INT8_ROWS=off"
    monkeypatch.setenv(int8_rows.MODE_ENV, "of")
    with pytest.raises(BackendError, match="EDGEPREFILL_INT8_ROWS='of': choose one of auto, off"):
        int8_rows.why_not(True)
    monkeypatch.delenv(int8_rows.MODE_ENV)
    monkeypatch.setattr(int4_decode, "cpu_has_int_kernels", lambda: False)
    assert "neither AVX512-VNNI nor AVX2" in int8_rows.why_not(True)
    assert int8_rows.choose(onnx.ModelProto(), None, True, None).rewritten == 0
