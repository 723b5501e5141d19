"""The native attention without rotary (GroupQueryAttention's do_rotary=0, no cos/sin: the
NoPE layers of SmolLM3, EXAONE 4, Cohere 2 and Granite-4.0-H, Nemotron-H's attention): one
layer against ONNX Runtime's GroupQueryAttention (chunks, decode rows of both ops, a
fused step's mixed rows), and a bundle whose layers mix rope and NoPE against
transformers with the kernels switched in. Skipped, with the reason, only where the
library cannot be built."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from edgeprefill.kernels import graph, select
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_native_kernels import make_backend
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
from tests.test_sliding_window import check_chunks


@pytest.fixture
def mode(monkeypatch):
    """Sets EDGEPREFILL_KERNELS for the test."""
    return lambda value: monkeypatch.setenv(select.MODE_ENV, value)


def stock_rows(qkv: np.ndarray, cache: list[np.ndarray], pasts: np.ndarray,
               valid: np.ndarray | None = None) -> np.ndarray:
    """GroupQueryAttention's output without rotary, each row run alone over its valid tokens
    (it takes several rows of a chunk only when all start at 0); `cache` is updated in place."""
    stock = session(layer_model(False, HEAD_DIM, rotary=False), None, 2)
    valid = np.full(len(pasts), qkv.shape[1]) if valid is None else valid
    out = np.zeros((len(pasts), qkv.shape[1], HEADS * HEAD_DIM), np.float32)
    for r, n in enumerate(valid):
        if n:
            out[r, :n] = run_layer(stock, pasts[r:r + 1], qkv[r:r + 1, :n],
                                   cache[0][r:r + 1], cache[1][r:r + 1])[0]
    return out


def check_layer(native, pasts: np.ndarray, qkv: np.ndarray, valid=None, seed: int = 0) -> None:
    """`native` against GroupQueryAttention on one call: outputs and the cache it writes."""
    rng = np.random.default_rng(seed)
    shape = (len(pasts), KV_HEADS, CAPACITY, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    want = [c.copy() for c in cache]
    want_out = stock_rows(qkv, want, pasts, valid)
    got = [c.copy() for c in cache]
    got_out = run_layer(native, pasts, qkv, *got, valid)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_a_layer_without_rotary_goes_native_with_no_tables():
    node = graph.kernel_node(_gqa_node(), prefill=True, valid_lens="valid")
    assert list(node.input) == ["qkv", "past_k", "past_v", "seqlens_k", "total", "", "", "valid"]
    # Nothing rotates, so interleaving (Cohere 2's global layers) does not keep it out.
    assert graph.why_not_eligible(_gqa_node(rotary_interleaved=1)) is None
    assert graph.why_not_eligible(_gqa_node(do_rotary=1)) == \
        "inputs or outputs the kernel does not take"  # rotary, but no tables


def _gqa_node(**attrs):
    attrs = {"num_heads": HEADS, "kv_num_heads": KV_HEADS, "scale": 0.125, "do_rotary": 0,
             **attrs}
    return helper.make_node(
        "GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total"],
        ["out", "present_k", "present_v"], domain="com.microsoft", **attrs)


@pytest.mark.parametrize("chunk", [2, 17, 256])
def test_prefill_chunks_without_rotary(library, chunk):
    native = session(layer_model(True, HEAD_DIM, rotary=False), library, 2)
    qkv = np.random.default_rng(chunk).standard_normal(
        (len(PASTS), chunk, WIDTH)).astype(np.float32)
    check_layer(native, PASTS, qkv, seed=chunk)


@pytest.mark.parametrize("decode", [True, False])  # DecodeAttention, PrefillAttention's rows
def test_decode_rows_without_rotary(library, decode):
    pasts = np.array([0, 1, 300, CAPACITY - 1])
    native = session(layer_model(True, HEAD_DIM, valid_lens=not decode, decode=decode,
                                 rotary=False), library, 2)
    qkv = np.random.default_rng(3).standard_normal((len(pasts), 1, WIDTH)).astype(np.float32)
    check_layer(native, pasts, qkv, None if decode else np.ones(len(pasts), np.int32), seed=3)


def test_a_fused_step_without_rotary(library):
    """A chunk, a decode row, a short chunk and an empty row in one call."""
    native = session(layer_model(True, HEAD_DIM, valid_lens=True, rotary=False), library, 2)
    qkv = np.random.default_rng(4).standard_normal((len(PASTS), 40, WIDTH)).astype(np.float32)
    check_layer(native, PASTS, qkv, np.array([40, 1, 17, 0]), seed=4)


def test_nope_layers_with_the_kernels_match_transformers(library, bundle, hf_model, mode):
    """SmolLM3's fixture: its second layer has no rope (no_rope_layer_interval 2)."""
    mode("require")
    backend = make_backend(bundle("smollm3"))
    assert backend.kernels.described == select.NATIVE  # every layer native, NoPE too
    assert backend.why_not_fused is None  # so a step's chunk and decode rows are one call
    ids = prompt_ids(23)
    check_chunks(backend, ids, reference_logits(hf_model("smollm3"), ids), 5)
