"""The native attention with attention sinks (GroupQueryAttention's head_sink, gpt-oss: each
head's sink logit joins its softmax's denominator): one layer against ONNX Runtime's
GroupQueryAttention (chunks, decode rows of both ops, a fused step's mixed rows, packed
tokens; sinks far below, around and far above the scores), and gpt-oss's fixture against
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

# Per head: far below every score (no effect), around them, above them, far above (the
# head's output goes to ~0: ONNX Runtime's max then is the sink).
SINKS = np.resize(np.array([-100.0, 0.5, 3.0, 40.0], np.float32), HEADS)


@pytest.fixture
def mode(monkeypatch):
    """Sets EDGEPREFILL_KERNELS for the test."""
    return lambda value: monkeypatch.setenv(select.MODE_ENV, value)


def check_layer(native, pasts: np.ndarray, qkv: np.ndarray, valid=None, seed: int = 0,
                packed: bool = False) -> None:
    """`native` against GroupQueryAttention (sink=SINKS) on one call."""
    stock = session(layer_model(False, HEAD_DIM, sink=SINKS), None, 2)
    check_against_stock(native, stock, pasts, qkv, valid, seed, packed)


def test_the_sinks_go_to_the_kernel_nodes():
    inputs = ["qkv", "", "", "pk", "pv", "seqlens", "total", "cos", "sin", "", "", "sinks"]
    gqa = helper.make_node("GroupQueryAttention", inputs, ["o", "k", "v"],
                           domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
                           scale=0.125, do_rotary=1)
    assert graph.eligible(gqa)
    assert list(graph.kernel_node(gqa).input)[graph.KERNEL_SINK:] == ["sinks"]
    prefill = graph.kernel_node(gqa, prefill=True, valid_lens="valid")
    assert list(prefill.input)[7:] == ["valid", "", "sinks"]
    gqa.input[9] = "position_ids"  # what the kernels do not take keeps the node stock
    assert graph.why_not_eligible(gqa) == "inputs or outputs the kernel does not take"


@pytest.mark.parametrize("chunk", [2, 17, 256])
def test_prefill_chunks_with_sinks(library, chunk):
    native = session(layer_model(True, HEAD_DIM, sink=SINKS), library, 2)
    qkv = np.random.default_rng(chunk).standard_normal(
        (len(PASTS), chunk, WIDTH)).astype(np.float32)
    check_layer(native, PASTS, qkv, seed=chunk)


@pytest.mark.parametrize("decode", [True, False])  # DecodeAttention, PrefillAttention's rows
def test_decode_rows_with_sinks(library, decode):
    pasts = np.array([0, 1, 300, CAPACITY - 1])
    native = session(layer_model(True, HEAD_DIM, valid_lens=not decode, decode=decode,
                                 sink=SINKS), library, 2)
    qkv = np.random.default_rng(3).standard_normal((len(pasts), 1, WIDTH)).astype(np.float32)
    check_layer(native, pasts, qkv, None if decode else np.ones(len(pasts), np.int32), seed=3)


@pytest.mark.parametrize("packed", [False, True])
def test_a_fused_step_with_sinks(library, packed):
    """A chunk, a decode row, a short chunk and an empty row in one call."""
    native = session(layer_model(True, HEAD_DIM, valid_lens=True, packed=packed, sink=SINKS),
                     library, 2)
    qkv = np.random.default_rng(4).standard_normal((len(PASTS), 40, WIDTH)).astype(np.float32)
    check_layer(native, PASTS, qkv, np.array([40, 1, 17, 0]), seed=4, packed=packed)


def test_gpt_oss_with_the_kernels_matches_transformers(library, bundle, hf_model, mode):
    """gpt-oss's fixture: sinks on a sliding and a full layer (window 8)."""
    mode("require")
    backend = make_backend(bundle("gpt_oss"))
    assert backend.kernels.described == select.NATIVE  # every layer native, sinks too
    assert backend.why_not_fused is None  # so a step's chunk and decode rows are one call
    ids = prompt_ids(35)
    check_chunks(backend, ids, reference_logits(hf_model("gpt_oss"), ids), 5)
