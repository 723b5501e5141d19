"""edgeprefill.MatMulInt4 (edgeprefill/kernels/matmul_int4.cc) and its switch into int4
bundles' decode steps (edgeprefill/engines/ort/int4_decode.py): the op against a numpy
reference of accuracy level 4 and against ONNX Runtime's own MatMulNBits, which rows the
rewrite takes, and whole-model decode against the stock graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import int4_decode
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.int4_prefill import MODE_ENV
from edgeprefill.export import quantize
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig, int4_blockwise
from edgeprefill.kernels.graph import DOMAIN
from tests.conftest import TINY_INT4_CONTEXT, TINY_MODEL

CONTEXT = TINY_INT4_CONTEXT
needs_int_kernels = pytest.mark.skipif(not int4_decode.cpu_has_int_kernels(),
                                       reason="no AVX512-VNNI nor AVX2 here")


def layer(op: str, k: int, n: int, packed: np.ndarray, scales: np.ndarray,
          scale_type=None) -> bytes:
    """One projection; `scale_type` (MatMulInt4 only): the repacked scales cast to it."""
    if op == "MatMulNBits":
        node = helper.make_node(op, ["a", "b", "scales"], ["out"], K=k, N=n, block_size=32,
                                bits=4, accuracy_level=4, domain="com.microsoft")
    else:  # MatMulInt4 on the weights as int4_decode.py repacks them
        packed, scales = int4_decode.repack(packed, scales)
        scales = scales if scale_type is None else scales.astype(scale_type)
        node = helper.make_node(op, ["a", "b", "scales"], ["out"], K=k, N=n, domain=DOMAIN)
    graph = helper.make_graph(
        [node], "int4", [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(packed, "b"), numpy_helper.from_array(scales, "scales")])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return model.SerializeToString()


def run_op(op: str, library, a: np.ndarray, weight: np.ndarray, threads: int = 2,
           scale_type=None) -> np.ndarray:
    """`weight` [N, K] float, quantized as the exporter does; a [..., K]."""
    packed, scales = int4_blockwise(weight, 32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(str(library))
    model = layer(op, weight.shape[1], weight.shape[0], packed, scales, scale_type)
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a})[0]


def reference(a: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Accuracy level 4 in numpy: per row and block of 32, activations to int8 by their
    largest magnitude / 127 (float32, rounded to nearest even); int4 weights minus 8; exact
    integer sums per block, scaled in float64 (the kernel's float32 sums differ by rounding)."""
    packed, scales = int4_blockwise(weight, 32)
    n, k = weight.shape
    blocks = packed.shape[1]
    nibbles = np.stack([packed & 15, packed >> 4], axis=-1)  # even k in the low nibble
    codes = nibbles.reshape(n, blocks, 32).astype(np.int64) - 8
    rows = a.reshape(-1, k).astype(np.float32)
    padded = np.zeros((len(rows), blocks * 32), np.float32)
    padded[:, :k] = rows
    grouped = padded.reshape(len(rows), blocks, 32)
    scale = np.abs(grouped).max(axis=2) / np.float32(127)
    safe = np.where(scale != 0, scale, np.float32(1))
    inverse = np.where(scale != 0, np.float32(1) / safe, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(grouped * inverse[:, :, None]), -127, 127).astype(np.int64)
    sums = np.einsum("rbi,nbi->rnb", q, codes)  # [rows, N, blocks] integers
    out = (sums * scale[:, None, :].astype(np.float64)
           * scales.reshape(n, blocks)[None].astype(np.float64)).sum(axis=2)
    return out.reshape(*a.shape[:-1], n).astype(np.float32)


@pytest.mark.parametrize("k, n, rows", [
    (576, 960, 1),
    (1536, 70, 3),    # N not a multiple of the 16-column tiles nor of the 32-column pieces
    (1536, 70, 1),    # one row: 5 tiles, 4 streams apart in 2 pieces, the second alone
    (100, 33, 9),     # K not a multiple of 32 (zero-padded), rows past the 8 at once
    (100, 200, 1),    # 13 tiles, the last a partial one, read 4 at once where there are 4
    (64, 1, 1),
])
def test_op_matches_accuracy_level_4(library, k, n, rows):
    rng = np.random.default_rng(k + n + rows)
    weight = rng.standard_normal((n, k)).astype(np.float32)
    a = rng.standard_normal((rows, 1, k)).astype(np.float32) * 3
    a[0, 0, :32] = 0.0  # an all-zero block: scale 0, no division by it
    want = reference(a, weight)
    got = run_op(int4_decode.OP, library, a, weight)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_op_matches_onnx_runtimes_matmulnbits(library):
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((576, 1536)).astype(np.float32)
    a = rng.standard_normal((4, 1, 1536)).astype(np.float32)
    theirs = run_op("MatMulNBits", library, a, weight)
    ours = run_op(int4_decode.OP, library, a, weight)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-6 * np.abs(theirs).max())


def kernel_order(a: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The vector code's float32 arithmetic in numpy, for bit-for-bit checks: per block,
    value = float32(exact int sum - 8 x the codes' sum) x the row's scale, then
    sum = fma(value, the weight's scale, sum). The fma is a float64 product (exact: 24 +
    24 bits) plus sum, rounded to float32."""
    packed, scales = int4_blockwise(weight, 32)
    n, k = weight.shape
    blocks = packed.shape[1]
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, blocks, 32)
    rows = np.zeros((a.size // k, blocks * 32), np.float32)
    rows[:, :k] = a.reshape(-1, k)
    grouped = rows.reshape(len(rows), blocks, 32)
    scale = np.abs(grouped).max(axis=2) / np.float32(127)
    inverse = np.where(scale != 0, np.float32(1) / np.where(scale != 0, scale, 1), 0)
    q = np.clip(np.rint(grouped * inverse[:, :, None].astype(np.float32)), -127, 127)
    dots = np.einsum("rbi,nbi->rnb", q.astype(np.int64), codes.astype(np.int64) - 8)
    column_scales = scales.reshape(n, blocks).astype(np.float64)
    out = np.zeros((len(rows), n), np.float32)
    for b in range(blocks):
        value = dots[:, :, b].astype(np.float32) * scale[:, b:b + 1]
        out = (value.astype(np.float64) * column_scales[:, b] + out).astype(np.float32)
    return out.reshape(*a.shape[:-1], n)


@needs_int_kernels
@pytest.mark.parametrize("k, n, rows", [(576, 960, 1), (1536, 70, 3), (100, 33, 9),
                                        (1536, 70, 1), (100, 200, 1), (64, 1, 1)])
def test_vector_code_gives_the_same_bits_on_every_cpu(library, k, n, rows):
    """AVX512-VNNI and AVX2 both sum the int4 x int8 products exactly in int32 (AVX2's
    int16 pair sums cannot saturate on 4-bit weights) and scale them in the same float32
    order, so either gives these bits; the extreme rows (every code 15 and +-127) are the
    int16 lanes' largest sums."""
    rng = np.random.default_rng(k + n)
    weight = rng.standard_normal((n, k)).astype(np.float32)
    weight[0] = 1.0  # column 0: every code 15 (the block's largest magnitude, positive)
    a = (rng.standard_normal((rows, 1, k)) * 3).astype(np.float32)
    a[0, 0] = 2.0  # row 0: every activation 127
    np.testing.assert_array_equal(run_op(int4_decode.OP, library, a, weight),
                                  kernel_order(a, weight))


@pytest.mark.parametrize("flags, native", [
    ("avx2 fma avx512f avx512bw avx512_vnni", True),  # Zen 4/5, Ice Lake and later servers
    ("avx2 fma", True),                                # Zen 1-3, Intel client CPUs
    ("avx2 fma avx512f avx512bw", False),              # Skylake-SP: the portable loops
    ("sse4_2 avx", False),
])
def test_the_op_runs_where_the_kernels_have_integer_vector_code(monkeypatch, flags, native):
    monkeypatch.setattr(int4_decode, "cpu_identity", lambda: f"model name\t: x\nflags\t: {flags}")
    assert int4_decode.cpu_has_int_kernels() == native
    assert (int4_decode.why_not(True) is None) == native


def test_rows_do_not_depend_on_each_other(library):
    """Batched decode rows give each row's numbers alone, bit for bit (per-row quantization
    and sums): what the engine's batch-invariance rests on."""
    rng = np.random.default_rng(4)
    weight = rng.standard_normal((200, 576)).astype(np.float32)
    a = rng.standard_normal((5, 1, 576)).astype(np.float32)
    together = run_op(int4_decode.OP, library, a, weight)
    for r in range(5):
        np.testing.assert_array_equal(run_op(int4_decode.OP, library, a[r:r + 1], weight, 1),
                                      together[r:r + 1])


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_float16_scales_give_the_float32_scales_bits(library, rows):
    """The exporter's scales are float16 values (half_exact), so the load hands the op
    float16 scales: the same numbers as the float32 ones, hence the same output bits."""
    rng = np.random.default_rng(rows)
    weight = rng.standard_normal((70, 300)).astype(np.float32)
    a = rng.standard_normal((rows, 1, 300)).astype(np.float32)
    assert int4_decode.repack(*int4_blockwise(weight, 32))[1].dtype == np.float16
    half = run_op(int4_decode.OP, library, a, weight)
    single = run_op(int4_decode.OP, library, a, weight, scale_type=np.float32)
    np.testing.assert_array_equal(half, single)


def test_scales_stay_float32_where_float16_would_change_them():
    """Bundles exported before half_exact have float32 scales: the op keeps reading those."""
    scales = np.array([0.1, 0.2, 0.3], np.float32)  # not float16 values
    assert int4_decode.half_if_exact(scales).dtype == np.float32
    exact = scales.astype(np.float16).astype(np.float32)
    assert int4_decode.half_if_exact(exact).dtype == np.float16


def test_op_refuses_scales_of_another_type(library):
    rng = np.random.default_rng(6)
    weight = rng.standard_normal((16, 32)).astype(np.float32)
    with pytest.raises(Exception, match="float or float16 scales"):
        run_op(int4_decode.OP, library, np.ones((1, 1, 32), np.float32), weight,
               scale_type=np.float64)


def load(bundle, monkeypatch, **env) -> OnnxRuntimeBackend:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    b = OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(threads=2))
    b.allocate_kv(2, CONTEXT)
    return b


def nbits_count(bundle) -> int:
    graph = onnx.load(str(bundle / load_manifest(bundle).graph.file), load_external_data=False)
    return sum(n.op_type == "MatMulNBits" for n in graph.graph.node)


@needs_int_kernels
def test_every_decode_projection_and_the_head_switch(library, tiny_int4_bundle, monkeypatch):
    b = load(tiny_int4_bundle, monkeypatch, EDGEPREFILL_KERNELS="require")
    assert b.int4_decode.rewritten == nbits_count(tiny_int4_bundle)  # every layer's and the head
    # Without int4 prefill's decode branches only the head and the last layer's projections
    # after its attention (o, the packed gate/up, down) have one row per sequence.
    b = load(tiny_int4_bundle, monkeypatch, EDGEPREFILL_KERNELS="require", **{MODE_ENV: "off"})
    assert b.int4_decode.rewritten == 4


@needs_int_kernels
def test_decode_mode_gives_every_row_decodes_projection(library, tiny_int4_bundle, monkeypatch):
    """EDGEPREFILL_INT4_PREFILL=decode: no switch, every projection MatMulInt4, so a
    prompt's numbers do not depend on how it was chunked: 48 tokens in one call or three
    of 16 leave the same logits bit for bit (the default int8 prefill scales each call's
    rows together)."""
    b = load(tiny_int4_bundle, monkeypatch, EDGEPREFILL_KERNELS="require", **{MODE_ENV: "decode"})
    assert b.int4_decode.rewritten == nbits_count(tiny_int4_bundle)
    assert not b.int4_prefill.rewritten
    prompt = np.random.default_rng(3).integers(3, 200, 48)

    def logits(row: int, chunk: int) -> np.ndarray:
        for at in range(0, prompt.size, chunk):
            piece = prompt[at:at + chunk][None, :]
            out = b.run(StepBatch(piece, np.array([at], np.int32),
                                  np.array([piece.shape[1]], np.int32), row))
        return out[0].copy()

    np.testing.assert_array_equal(logits(0, 48), logits(1, 16))


@needs_int_kernels
def test_bundles_with_float32_scales_still_decode_natively(library, tiny_int4_bundle, tmp_path,
                                                           monkeypatch):
    """A bundle exported before half_exact (float32 scales, here made by skipping it) keeps
    its float32 scales and the native op, decoding as the stock graph does; `--stats` says
    which scales each load reads."""
    assert "float16 scales" in load(tiny_int4_bundle, monkeypatch,
                                    EDGEPREFILL_KERNELS="require").int4_decode.described
    monkeypatch.setattr(quantize, "half_exact", lambda scale: scale)
    old = tmp_path / "old"
    export(TINY_MODEL, old, ExportOptions(chunks=(16,), max_context=CONTEXT,
                                          show_progress=False, quant=QuantConfig("int4")))
    native = load(old, monkeypatch, EDGEPREFILL_KERNELS="require")
    assert native.int4_decode.rewritten and "float32 scales" in native.int4_decode.described
    stock = load(old, monkeypatch, EDGEPREFILL_KERNELS="off")
    prompt = StepBatch(np.array([[5, 17, 42, 7]]), np.array([0], np.int32),
                       np.array([4], np.int32), 0)
    stock.run(prompt)
    for theirs, ours in zip(stock.kv_arrays(), native.kv_arrays(), strict=True):
        ours[...] = theirs
    step = StepBatch(np.array([[8]]), np.array([4], np.int32), np.ones(1, np.int32), 0)
    want, got = stock.run(step).copy(), native.run(step).copy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_not_without_the_native_kernels_or_their_integer_vector_code(tiny_int4_bundle,
                                                                     monkeypatch):
    assert load(tiny_int4_bundle, monkeypatch, EDGEPREFILL_KERNELS="off").int4_decode.rewritten == 0
    monkeypatch.setattr(int4_decode, "cpu_has_int_kernels", lambda: False)
    assert "neither AVX512-VNNI nor AVX2" in int4_decode.describe(onnx.ModelProto(), True)
    assert int4_decode.choose(onnx.ModelProto(), tiny_int4_bundle, True, None).rewritten == 0


@needs_int_kernels
def test_decode_steps_stay_with_the_stock_graph(library, tiny_int4_bundle, monkeypatch):
    """The same prompt prefilled by the stock graph into both caches, then decode steps of
    two rows at once: logits equal to float32 rounding, the same greedy tokens."""
    stock = load(tiny_int4_bundle, monkeypatch, EDGEPREFILL_KERNELS="off")
    native = load(tiny_int4_bundle, monkeypatch, EDGEPREFILL_KERNELS="require")
    prompt = [5, 17, 42, 7, 99, 3, 12, 64]
    for row in range(2):
        stock.run(StepBatch(np.array([prompt[row:]]), np.array([0], np.int32),
                            np.array([len(prompt) - row], np.int32), row))
    for theirs, ours in zip(stock.kv_arrays(), native.kv_arrays(), strict=True):
        ours[...] = theirs
    tokens = np.array([[8], [21]])
    past = np.array([len(prompt), len(prompt) - 1], np.int32)
    for _ in range(6):
        step = StepBatch(tokens, past, np.ones(2, np.int32), 0)
        want, got = stock.run(step).copy(), native.run(step).copy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
        assert (got.argmax(-1) == want.argmax(-1)).all()
        tokens, past = want.argmax(-1)[:, None], past + 1


def test_repack_puts_each_weight_where_the_kernel_reads_it():
    """Column c, weight k of tile t, block b: part h = (k % 32) // 8, byte 4 c + k % 4, low
    nibble when k % 8 < 4; codes 8 and scales 0 past N."""
    rng = np.random.default_rng(5)
    n, k = 21, 70
    packed, scales = int4_blockwise(rng.standard_normal((n, k)).astype(np.float32), 32)
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, -1)  # [N, blocks * 32]
    weight, tile_scales = int4_decode.repack(packed, scales)
    assert weight.shape == (2, 3, 4, 64) and tile_scales.shape == (2, 3, 16)
    for column in range(32):
        t, c = divmod(column, 16)
        for kk in range(96):
            b, h, i, high = kk // 32, kk % 32 // 8, kk % 4, kk % 8 >= 4
            byte = weight[t, b, h, 4 * c + i]
            got = byte >> 4 if high else byte & 15
            assert got == (codes[column, kk] if column < n else 8)
        for b in range(3):
            assert tile_scales[t, b, c] == (scales[column * 3 + b] if column < n else 0)
