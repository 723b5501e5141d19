"""The last layer's attention computes only each row's last valid token (PrefillAttention
last=1, kernels/graph.py's fold_last): the graph's GatherND of those tokens goes, and
every output, logits and cache are the bits the unfolded graph gives."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgeprefill.bundle import load_graph, load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.kernels import graph, select
from tests.test_prefill_kernel import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    PASTS,
    WIDTH,
    layer_model,
    run_layer,
    session,
)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("valid", [[40, 1, 17, 0], [0, 33, 0, 1], [1, 1, 1, 1], [40, 40, 40, 40]])
def test_last_gives_each_rows_last_token_bit_for_bit(library, bf16, valid):
    """last=1 against the same packed op's every token, gathered as the graph's GatherND
    gathers them (index: the valid tokens up to the row, less one; -1 the call's last):
    chunks of several query blocks, decode rows, empty rows first and in between."""
    valid = np.array(valid)
    rng = np.random.default_rng(4)
    qkv = rng.standard_normal((len(PASTS), 40, WIDTH)).astype(np.float32)
    shape = (len(PASTS), KV_HEADS, 640, HEAD_DIM)
    cache = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    model = layer_model(True, HEAD_DIM, bf16=bf16, packed=True)
    want_cache = [c.copy() for c in cache]
    every = run_layer(session(model, library, 2), PASTS, qkv, *want_cache, valid, packed=True)[0]
    got_cache = [c.copy() for c in cache]
    folded = layer_model(True, HEAD_DIM, bf16=bf16, packed=True, last=True)
    got = run_layer(session(folded, library, 2), PASTS, qkv, *got_cache, valid, packed=True,
                    last=True)
    assert got.shape == (1, len(valid), HEADS * HEAD_DIM)
    np.testing.assert_array_equal(got[0], every[np.cumsum(valid) - 1])
    for a, b in zip(want_cache, got_cache, strict=True):
        np.testing.assert_array_equal(b, a)


def test_last_without_packed_is_a_one_line_error_at_load(library):
    """Refused when the session is made, not on the first call; DecodeAttention, whose
    output is one row per sequence anyway, takes neither packed nor last."""
    with pytest.raises(Exception, match="PrefillAttention: last=1 needs packed=1"):
        session(layer_model(True, HEAD_DIM, valid_lens=True, last=True), library, 1)
    with pytest.raises(Exception, match="DecodeAttention: last=1 needs packed=1"):
        session(layer_model(True, HEAD_DIM, decode=True, last=True), library, 1)
    decode = onnx.load_from_string(layer_model(True, HEAD_DIM, decode=True))
    decode.graph.node[0].attribute.append(onnx.helper.make_attribute("packed", 1))
    with pytest.raises(Exception, match="DecodeAttention: packed and last are PrefillAttention"):
        session(decode.SerializeToString(), library, 1)


@pytest.mark.parametrize("family, folded", [("llama", 1), ("qwen3", 0)])
def test_only_the_last_layers_gather_folds(bundle, family, folded):
    """llama's last attention takes the gather of its last tokens; qwen3, whose attention
    keeps its packing chain (q/k norms), keeps its GatherND."""
    path = bundle(family)
    model = load_graph(path, load_manifest(path))
    before = sum(n.op_type == "GatherND" for n in model.graph.node)
    graph.add_native_attention(model)
    last = [n for n in model.graph.node if n.op_type == graph.PREFILL_OP
            and any(a.name == "last" and a.i == 1 for a in n.attribute)]
    assert len(last) == folded
    assert sum(n.op_type == "GatherND" for n in model.graph.node) == before - folded
    assert graph.fold_last(model.graph) == 0  # nothing left to fold


@pytest.mark.parametrize("kind, compute", [("float", "fp32"), ("float", "bf16"),
                                           ("int8", "bf16"), ("int4", "fp32"), ("int4", "bf16")])
def test_bundle_logits_and_cache_are_the_unfolded_graphs(library, bundle, quantized, monkeypatch,
                                                         kind, compute):
    """Prefill calls of several rows (an empty one among them), a call of decode rows beside
    a chunk and decode steps: the same logits and KV cache, bit for bit; and the loads run
    the same ops but the gather (int4: its decode projections find the one-row-per-sequence
    part after the folded attention as after the gather)."""
    from edgeprefill.engines.ort import backend as backend_module
    from edgeprefill.engines.ort.bf16_compute import cpu_has_bf16, widens_bf16

    if compute == "bf16" and not (cpu_has_bf16() or widens_bf16()):
        pytest.skip("MatMulBf16 runs its portable loops here")
    monkeypatch.setenv(select.MODE_ENV, "require")
    path = bundle("llama") if kind == "float" else quantized(kind)
    loaded: list[list[str]] = []
    loadable = backend_module.loadable

    def capture(graph_path, model, *args, **kwargs):
        loaded.append(sorted(n.op_type for n in graph.every_node(model.graph)))
        return loadable(graph_path, model, *args, **kwargs)

    monkeypatch.setattr(backend_module, "loadable", capture)

    def calls(backend: OnnxRuntimeBackend) -> tuple[list[np.ndarray], list[np.ndarray]]:
        backend.allocate_kv(4, 256)
        rng = np.random.default_rng(8)
        out = []
        ids = rng.integers(3, 128, (4, 70))
        out.append(backend.run(StepBatch(ids, np.zeros(4, np.int32),
                                         np.array([70, 23, 0, 41], np.int32), 0)).copy())
        chunk = np.zeros((4, 30), np.int64)
        chunk[:2, 0], chunk[2] = [5, 9], rng.integers(3, 128, 30)
        out.append(backend.run(StepBatch(chunk, np.array([70, 23, 0, 41], np.int32),
                                         np.array([1, 1, 30, 0], np.int32), 0)).copy())
        lens, token = np.array([71, 24, 30, 41], np.int32), np.array([[7], [8], [9], [10]])
        for _ in range(3):
            logits = backend.run(StepBatch(token, lens, np.ones(4, np.int32), 0)).copy()
            out.append(logits)
            token, lens = logits.argmax(-1)[:, None], lens + 1
        return out, [np.array(a, copy=True) for a in backend.kv_arrays()]

    def backend() -> OnnxRuntimeBackend:
        return OnnxRuntimeBackend(path, load_manifest(path),
                                  BackendOptions(threads=2, compute=compute))

    got, got_kv = calls(backend())
    monkeypatch.setattr(graph, "fold_last", lambda g: 0)
    want, want_kv = calls(backend())
    folded, unfolded = loaded
    unfolded.remove("GatherND")
    assert folded == unfolded
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(b, a)
    for a, b in zip(want_kv, got_kv, strict=True):
        np.testing.assert_array_equal(b, a)
