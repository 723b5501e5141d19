"""The native attention under a sliding window (GroupQueryAttention's local_window_size):
one layer against ONNX Runtime's GroupQueryAttention at and around the window's edge
(decode rows, chunks that straddle it, padded rows), and whole windowed bundles (Gemma 3's
local layers, Mistral's every layer) against transformers with the kernels switched in.
Skipped, with the reason, only where the library cannot be built."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.engines import StepBatch
from edgeprefill.kernels import select
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_native_kernels import decode_rows, make_backend
from tests.test_prefill_kernel import (
    CAPACITY,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    PASTS,
    WIDTH,
    layer_model,
    run_layer,
    session,
)

SHAPE = (len(PASTS), KV_HEADS, CAPACITY, HEAD_DIM)


@pytest.fixture
def mode(monkeypatch):
    """Sets EDGEPREFILL_KERNELS for the test."""
    return lambda value: monkeypatch.setenv(select.MODE_ENV, value)


def stock_rows(window: int, qkv: np.ndarray, cache: list[np.ndarray], valid=None,
               pasts: np.ndarray = PASTS, softcap: float = 0.0) -> np.ndarray:
    """GroupQueryAttention's output, each row run alone over its valid tokens (it takes
    several rows of a chunk only when all start at 0); `cache` is updated in place."""
    stock = session(layer_model(False, HEAD_DIM, window=window, softcap=softcap), None, 2)
    valid = np.full(len(pasts), qkv.shape[1]) if valid is None else valid
    out = np.zeros((len(pasts), qkv.shape[1], HEADS * HEAD_DIM), np.float32)
    for r, n in enumerate(valid):
        if n:
            out[r, :n] = run_layer(stock, pasts[r:r + 1], qkv[r:r + 1, :n],
                                   cache[0][r:r + 1], cache[1][r:r + 1])[0]
    return out


# window 1: a query sees its own key only; 40 and 64 around the key blocks (64 keys) and a
# piece's 32 queries; 100: a chunk of 256 past 300 straddles it everywhere.
@pytest.mark.parametrize("window", [1, 40, 64, 100])
def test_prefill_chunks_see_only_the_window(library, window):
    native = session(layer_model(True, HEAD_DIM, window=window), library, 2)
    rng = np.random.default_rng(window)
    for chunk in (2, 17, 64, 256):
        qkv = rng.standard_normal((len(PASTS), chunk, WIDTH)).astype(np.float32)
        cache = [rng.standard_normal(SHAPE).astype(np.float32) * 2 for _ in range(2)]
        want = [c.copy() for c in cache]
        want_out = stock_rows(window, qkv, want)
        got = [c.copy() for c in cache]
        got_out = run_layer(native, PASTS, qkv, *got)
        np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5,
                                   err_msg=f"window {window}, chunk {chunk}")
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("decode", [True, False])  # DecodeAttention, PrefillAttention's rows
def test_decode_rows_see_only_the_window(library, decode):
    """One token per row at positions on both sides of the window's edge (a row whose
    window just covers its whole past, one whose first key just left it) and far past it."""
    window = 40
    pasts = np.array([0, window - 2, window - 1, window, window + 1, 300, CAPACITY - 1])
    native = session(layer_model(True, HEAD_DIM, valid_lens=not decode, decode=decode,
                                 window=window), library, 2)
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((len(pasts), 1, WIDTH)).astype(np.float32)
    shape = (len(pasts), KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) * 2 for _ in range(2)]
    want = [c.copy() for c in cache]
    want_out = stock_rows(window, qkv, want, pasts=pasts)
    got = [c.copy() for c in cache]
    ones = None if decode else np.ones(len(pasts), np.int32)
    got_out = run_layer(native, pasts, qkv, *got, valid=ones)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_padded_rows_beside_decode_rows_see_only_the_window(library):
    """A fused step's rows (a chunk, a decode row, a short chunk, an empty row) under a
    window: each valid token's output and cache entry is GroupQueryAttention's for the row
    alone; padding is neither computed nor written."""
    window = 24
    native = session(layer_model(True, HEAD_DIM, valid_lens=True, window=window), library, 2)
    rng = np.random.default_rng(6)
    valid = np.array([40, 1, 17, 0])
    qkv = rng.standard_normal((len(PASTS), 40, WIDTH)).astype(np.float32)
    cache = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2)]
    want = [c.copy() for c in cache]
    want_out = stock_rows(window, qkv, want, valid)
    got = [c.copy() for c in cache]
    got_out = run_layer(native, PASTS, qkv, *got, valid)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


# (family, window of its fixture, chunk): chunks shorter and longer than the window, so
# that chunks straddle it and later ones see none of the first.
WINDOWED = [("gemma3_text", 8, 5), ("gemma3_text", 8, 13), ("mistral", 24, 16)]


@pytest.mark.parametrize(("family", "window", "chunk"), WINDOWED)
def test_windowed_bundle_with_the_kernels_matches_transformers(
        library, bundle, hf_model, mode, family, window, chunk):
    mode("require")
    backend = make_backend(bundle(family))
    assert backend.kernels.described == select.NATIVE  # every layer native, windowed too
    assert backend.why_not_fused is None  # so a step's chunk and decode rows are one call
    ids = prompt_ids(4 * window + 3)
    check_chunks(backend, ids, reference_logits(hf_model(family), ids), chunk)


def check_chunks(backend, ids: list[int], expected: np.ndarray, chunk: int) -> None:
    """Runs `ids` in `chunk`-token chunks, its last `chunk` tokens one at a time (decode
    steps), each call's last logits against `expected` (transformers')."""
    backend.allocate_kv(1, 256)
    tail = len(ids) - chunk
    starts = list(range(0, tail, chunk)) + list(range(tail, len(ids)))
    for start, end in zip(starts, starts[1:] + [len(ids)], strict=True):
        part = ids[start:min(end, start + chunk)]
        logits = backend.run(StepBatch(np.array([part]), np.array([start], np.int32),
                                       np.array([len(part)], np.int32), 0))
        np.testing.assert_allclose(logits[0], expected[start + len(part) - 1],
                                   rtol=1e-4, atol=1e-4, err_msg=f"chunk at {start}")


def test_rows_past_the_window_decode_as_the_stock_graph(library, bundle, mode):
    """Rows of different lengths (one inside the window, two past it) decoded together for
    longer than the window: the same tokens, logits and cache as GroupQueryAttention."""
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 128, n) for n in (3, 150, 37)]
    mode("off")
    stock = make_backend(bundle("mistral"))
    mode("require")
    native = make_backend(bundle("mistral"))
    assert native.kernels.described == select.NATIVE
    want, got = decode_rows(stock, prompts, 30), decode_rows(native, prompts, 30)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(stock.kv_arrays(), native.kv_arrays(), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
