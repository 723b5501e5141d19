"""The native attention with soft-capped scores (GroupQueryAttention's softcap, Gemma 2's
attn_logit_softcapping): one layer against ONNX Runtime's GroupQueryAttention, alone and
with a sliding window (Gemma 2's local layers), prefill chunks and decode rows, and the
gemma2 bundle against transformers with the kernels switched in. Skipped, with the reason,
only where the library cannot be built."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.kernels import select
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_native_kernels import make_backend
from tests.test_prefill_kernel import HEAD_DIM, PASTS, WIDTH, layer_model, run_layer, session
from tests.test_sliding_window import SHAPE, check_chunks, stock_rows

# Scores of these tensors reach ~+-8: a cap of 2 bends most of them, so a kernel that
# ignored it would be far off.
CAP = 2.0


@pytest.mark.parametrize("window", [-1, 40])
def test_prefill_chunks_cap_their_scores(library, window):
    native = session(layer_model(True, HEAD_DIM, window=window, softcap=CAP), library, 2)
    rng = np.random.default_rng(11)
    for chunk in (2, 17, 150):
        qkv = rng.standard_normal((len(PASTS), chunk, WIDTH)).astype(np.float32)
        cache = [rng.standard_normal(SHAPE).astype(np.float32) * 2 for _ in range(2)]
        want_out = stock_rows(window, qkv, [c.copy() for c in cache], softcap=CAP)
        got_out = run_layer(native, PASTS, qkv, *[c.copy() for c in cache])
        np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5,
                                   err_msg=f"window {window}, chunk {chunk}")


@pytest.mark.parametrize("decode", [True, False])  # DecodeAttention, PrefillAttention's rows
def test_decode_rows_cap_their_scores(library, decode):
    pasts = np.array([0, 39, 40, 300])
    native = session(layer_model(True, HEAD_DIM, valid_lens=not decode, decode=decode,
                                 window=40, softcap=CAP), library, 2)
    rng = np.random.default_rng(12)
    qkv = rng.standard_normal((len(pasts), 1, WIDTH)).astype(np.float32)
    cache = [rng.standard_normal(SHAPE).astype(np.float32) * 2 for _ in range(2)]
    want_out = stock_rows(40, qkv, [c.copy() for c in cache], pasts=pasts, softcap=CAP)
    ones = None if decode else np.ones(len(pasts), np.int32)
    got_out = run_layer(native, pasts, qkv, *[c.copy() for c in cache], valid=ones)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)


def test_gemma2_with_the_kernels_matches_transformers(library, bundle, hf_model, monkeypatch):
    """Gemma 2's every layer soft-caps and every other one slides (window 8): native, one
    call per step, and transformers' logits over chunks that straddle the window."""
    monkeypatch.setenv(select.MODE_ENV, "require")
    backend = make_backend(bundle("gemma2"))
    assert backend.kernels.described == select.NATIVE
    assert backend.why_not_fused is None
    ids = prompt_ids(40)
    check_chunks(backend, ids, reference_logits(hf_model("gemma2"), ids), 6)
