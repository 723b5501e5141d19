"""float32 bundles' projections on edgeprefill.MatMulF32 (engines/ort/f32_projections.py):
the op against a float64 product, each row the same bits whatever rows share its call (the
decode tiles, the prefill tiles over blocks of K, alone or together), the load-time rewrite
of a float32 bundle (logits as ONNX Runtime's MatMul gives them to rounding, the same bits
chunked or not), and the switch that turns it off. Skipped only where the native library
cannot be built."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import f32_projections
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.engines.ort.f32_projections import MODE_ENV, OP, pack
from edgeprefill.errors import BackendError
from edgeprefill.kernels.graph import DOMAIN
from tests.test_gated_projection import run, weights


def test_pack_layout():
    """Panel p, strip s, row k: columns 64 p + 16 s .. + 15 of row k; zeros past N."""
    w = np.random.default_rng(1).standard_normal((5, 70)).astype(np.float32)
    packed = pack(w)
    assert packed.shape == (2, 4, 5, 16) and packed.dtype == np.float32
    assert packed[0, 2, 3, 7] == w[3, 39] and packed[1, 0, 4, 5] == w[4, 69]
    assert not packed[1, 0, :, 6:].any() and not packed[1, 1:].any()  # columns 70..


def product(a: np.ndarray, k: int, n: int, seed: int, library, threads: int) -> np.ndarray:
    """MatMulF32 of `a` by the seeded [k, n] weight (test_gated_projection.weights)."""
    names, initializers = weights(OP, k, n, seed)
    node = helper.make_node(OP, ["a", *names], ["y"], domain=DOMAIN, N=n)
    return run([node], initializers, {"a": a}, library, threads)[0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, k, n", [(1, 576, 960), (3, 300, 70), (4, 1536, 576),
                                      (7, 33, 130), (50, 600, 200), (130, 96, 64)])
def test_op_is_the_float_product_and_each_row_the_same_bits_alone(library, m, k, n, threads):
    seed = m * k + n
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    a = np.random.default_rng(seed + 1).standard_normal((1, m, k)).astype(np.float32)
    got = product(a, k, n, seed, library, threads)
    assert got.shape == (1, m, n)
    exact = a.astype(np.float64) @ w
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(w)
    assert np.all(np.abs(got - exact) <= 2e-6 * magnitude)
    # One float32 sum over k in order, whichever tile: a row alone (a decode tile), the
    # first rows (another decode tile, or 6-row prefill tiles) give
    # the rows' bits of the whole call.
    for r in {0, m // 2, m - 1}:
        np.testing.assert_array_equal(product(a[:, r:r + 1], k, n, seed, library, threads)[0, 0],
                                      got[0, r])
    for rows in {min(m, 4), min(m, 6)}:
        np.testing.assert_array_equal(product(a[:, :rows], k, n, seed, library, threads),
                                      got[:, :rows])


def test_op_refuses_a_weight_of_another_shape(library):
    with pytest.raises(Exception, match="do not fit K=10"):
        product(np.ones((1, 2, 10), np.float32), 8, 16, 0, library, 1)


def load(path, threads: int = 2) -> OnnxRuntimeBackend:
    backend = OnnxRuntimeBackend(path, load_manifest(path), BackendOptions(threads=threads))
    backend.allocate_kv(1, 512)
    return backend


def prompt_logits(backend: OnnxRuntimeBackend, ids: np.ndarray, chunk: int) -> np.ndarray:
    """Each chunk's last token's logits, prefilling `ids` in chunks of `chunk`."""
    out = []
    for start in range(0, ids.size, chunk):
        piece = ids[start:start + chunk][None, :]
        out.append(backend.run(StepBatch(piece, np.array([start], np.int32),
                                         np.array([piece.shape[1]], np.int32), 0))[0].copy())
    return np.stack(out)


def test_a_float_bundle_runs_its_projections_on_it_exact_and_chunk_blind(library, bundle,
                                                                         monkeypatch):
    path = bundle("llama")
    native = load(path)
    layers = load_manifest(path).model.num_layers
    # per layer qkv, o, gate/up, down; the LM head
    assert native.f32.rewritten == 4 * layers + 1
    assert native.f32.described == f"{4 * layers + 1} float32 projections: {OP}"
    monkeypatch.setenv(MODE_ENV, "off")
    stock = load(path)
    assert stock.f32.rewritten == 0
    ids = np.random.default_rng(0).integers(0, 128, 48).astype(np.int64)  # VOCAB
    # ONNX Runtime's MatMul sums in another order: the same logits to float32 rounding.
    np.testing.assert_allclose(prompt_logits(native, ids, 48), prompt_logits(stock, ids, 48),
                               rtol=1e-5, atol=1e-5)
    # Chunks of 3 tokens (decode's tiles) against 48 (the prefill tiles): the same bits
    # (one token a call would change the attention kernel too).
    np.testing.assert_array_equal(prompt_logits(native, ids, 3)[-1],
                                  prompt_logits(native, ids, 48)[0])


def test_off_keeps_onnx_runtimes_matmul_and_a_wrong_value_is_one_line(monkeypatch):
    monkeypatch.setenv(MODE_ENV, "off")
    assert f32_projections.why_not(True) == f"{MODE_ENV}=off"
    assert f32_projections.describe(True) == f"ONNX Runtime's MatMul ({MODE_ENV}=off)"
    monkeypatch.setenv(MODE_ENV, "fast")
    with pytest.raises(BackendError, match=f"{MODE_ENV}='fast': choose one of auto, off"):
        f32_projections.why_not(True)
    monkeypatch.delenv(MODE_ENV)
    assert f32_projections.why_not(False) == "no native kernels"
