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
    check_against_stock,
    layer_model,
    session,
)
from tests.test_sliding_window import check_chunks


@pytest.fixture
def mode(monkeypatch):
    """Sets EDGEPREFILL_KERNELS for the test."""
    return lambda value: monkeypatch.setenv(select.MODE_ENV, value)


def check_layer(native, pasts: np.ndarray, qkv: np.ndarray, valid=None, seed: int = 0,
                packed: bool = False) -> None:
    """`native` against GroupQueryAttention (rotary=False) on one call."""
    stock = session(layer_model(False, HEAD_DIM, rotary=False), None, 2)
    check_against_stock(native, stock, pasts, qkv, valid, seed, packed)


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


# SmolLM3's fixture: its second layer has no rope (no_rope_layer_interval 2); HunYuan's
# rotary runs outside attention; Granite 4's "nope" and GPT-2 rotate no layer (Nemotron-H's
# attention, beside Mamba-2 layers: tests/test_mamba2_kernel.py).
FAMILIES = ["smollm3"] + [pytest.param(f, marks=pytest.mark.slow) for f in (
    "hunyuan_v1_dense", "granitemoehybrid-nope", "gpt2", "exaone4")]


@pytest.mark.parametrize("family", FAMILIES)
def test_nope_layers_with_the_kernels_match_transformers(
        library, bundle, hf_model, mode, family):
    mode("require")
    backend = make_backend(bundle(family))
    assert backend.kernels.described == select.NATIVE  # every layer native, NoPE too
    assert backend.why_not_fused is None  # so a step's chunk and decode rows are one call
    ids = prompt_ids(23)
    check_chunks(backend, ids, reference_logits(hf_model(family), ids), 5)
