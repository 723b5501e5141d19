"""The native attention with interleaved rotary (GroupQueryAttention's rotary_interleaved=1:
Cohere, Cohere 2, GLM, Helium, ERNIE 4.5 rotate pairs (2i, 2i + 1), not halves): one layer
against ONNX Runtime's GroupQueryAttention (chunks, decode rows of both ops, a fused step's
mixed rows; full and partial rotary), and Cohere 2's fixture (an interleaved sliding layer
and a global one without rope) against transformers with the kernels switched in. Skipped,
with the reason, only where the library cannot be built."""

from __future__ import annotations

import numpy as np
import pytest

from edgeprefill.kernels import select
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_native_kernels import make_backend
from tests.test_prefill_kernel import (
    CAPACITY,
    HEAD_DIM,
    PASTS,
    WIDTH,
    check_against_stock,
    layer_model,
    session,
)
from tests.test_sliding_window import check_chunks

ROTARY = [HEAD_DIM, HEAD_DIM // 2]  # full, and partial (GLM's half)


@pytest.fixture
def mode(monkeypatch):
    """Sets EDGEPREFILL_KERNELS for the test."""
    return lambda value: monkeypatch.setenv(select.MODE_ENV, value)


def sessions(rotary_dim: int, library, **layer):
    """(native, stock) sessions of one interleaved layer."""
    return (session(layer_model(True, rotary_dim, interleaved=True, **layer), library, 2),
            session(layer_model(False, rotary_dim, interleaved=True), None, 2))


@pytest.mark.parametrize("rotary_dim", ROTARY)
@pytest.mark.parametrize("chunk", [2, 17, 256])
def test_prefill_chunks_rotate_interleaved_pairs(library, rotary_dim, chunk):
    qkv = np.random.default_rng(chunk).standard_normal(
        (len(PASTS), chunk, WIDTH)).astype(np.float32)
    check_against_stock(*sessions(rotary_dim, library), PASTS, qkv, seed=chunk)


@pytest.mark.parametrize("rotary_dim", ROTARY)
@pytest.mark.parametrize("decode", [True, False])  # DecodeAttention, PrefillAttention's rows
def test_decode_rows_rotate_interleaved_pairs(library, rotary_dim, decode):
    pasts = np.array([0, 1, 300, CAPACITY - 1])
    native, stock = sessions(rotary_dim, library, valid_lens=not decode, decode=decode)
    qkv = np.random.default_rng(3).standard_normal((len(pasts), 1, WIDTH)).astype(np.float32)
    check_against_stock(native, stock, pasts, qkv,
                        None if decode else np.ones(len(pasts), np.int32), seed=3)


@pytest.mark.parametrize("packed", [False, True])
def test_a_fused_step_rotates_interleaved_pairs(library, packed):
    """A chunk, a decode row, a short chunk and an empty row in one call."""
    native, stock = sessions(HEAD_DIM, library, valid_lens=True, packed=packed)
    qkv = np.random.default_rng(4).standard_normal((len(PASTS), 40, WIDTH)).astype(np.float32)
    check_against_stock(native, stock, PASTS, qkv, np.array([40, 1, 17, 0]), seed=4,
                        packed=packed)


FAMILIES = ["cohere2"] + [pytest.param(f, marks=pytest.mark.slow)
                          for f in ("cohere", "glm", "helium", "ernie4_5")]


@pytest.mark.parametrize("family", FAMILIES)
def test_interleaved_bundles_with_the_kernels_match_transformers(
        library, bundle, hf_model, mode, family):
    mode("require")
    backend = make_backend(bundle(family))
    assert backend.kernels.described == select.NATIVE  # every layer native
    assert backend.why_not_fused is None  # so a step's chunk and decode rows are one call
    ids = prompt_ids(35)
    check_chunks(backend, ids, reference_logits(hf_model(family), ids), 5)
