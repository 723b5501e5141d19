"""A SwiGlu inside the native gate/up projection (MatMulInt8, MatMulBf16, MatMulF32,
MatMulInt4 with gated=1, kernels/swiglu.py's fold_gated): the same bits as the projection
then SwiGlu, for the op, for the rewrite's choices, and for whole bundles."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import GraphProto, NodeProto, TensorProto, helper, numpy_helper

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort import bf16_compute, f32_projections, int4_decode, int8_rows
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.export.quantize import int4_blockwise, int8_per_channel
from edgeprefill.kernels import graph, select, swiglu
from edgeprefill.kernels.graph import DOMAIN
from tests.test_prefill_kernel import session


def weights(op: str, k: int, n: int, seed: int) -> tuple[list[str], list[TensorProto]]:
    """The projection's weight inputs (after `a`) as initializers, packed as its rewrite
    packs them."""
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    if op == int8_rows.OP:
        codes, scale = int8_per_channel(w)
        packed, sums = int8_rows.pack(codes)
        arrays = {"b": packed, "scale": scale, "sums": sums}
    elif op == f32_projections.OP:
        arrays = {"b": f32_projections.pack(w)}
    elif op == int4_decode.OP:
        packed, scales = int4_decode.repack(*int4_blockwise(w.T.copy(), 32))
        arrays = {"b": packed, "scales": scales}
    else:
        arrays = {"b": bf16_compute.pack(w)}
    return list(arrays), [numpy_helper.from_array(v, name) for name, v in arrays.items()]


def sizes(op: str, k: int, n: int) -> dict[str, int]:
    """The projection's size attributes: N, and K for MatMulInt4."""
    return {"K": k, "N": n} if op == int4_decode.OP else {"N": n}


# the native projections with gated=1 and the norm inside
OPS = [int8_rows.OP, bf16_compute.OP, f32_projections.OP, int4_decode.OP]


def value(name: str):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def run(nodes: list[NodeProto], initializers: list[TensorProto], feeds: dict[str, np.ndarray],
        library, threads: int, outputs: tuple[str, ...] = ("y",)) -> list[np.ndarray]:
    """The graph of `nodes` on `feeds`, with the native library: its `outputs`."""
    g = helper.make_graph(nodes, "projection", [value(name) for name in feeds],
                          [value(name) for name in outputs], initializers)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return session(model.SerializeToString(), library, threads).run(None, feeds)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m, k, n", [(1, 576, 3072), (5, 33, 256), (55, 96, 384), (130, 64, 128),
                                     (1, 33, 384), (1, 64, 128)])
def test_gated_op_is_the_projection_then_swiglu(library, op, m, k, n, threads):
    """Rows past a 48-row block and a 6-row tile, K not a multiple of the pairs or quads,
    one to 24 panel pairs: the same bits as the two ops."""
    names, initializers = weights(op, k, n, seed=m + k + n)
    a = np.random.default_rng(m).standard_normal((1, m, k)).astype(np.float32) * 3
    two = [helper.make_node(op, ["a", *names], ["gu"], domain=DOMAIN, **sizes(op, k, n)),
           helper.make_node(swiglu.OP, ["gu"], ["y"], domain=DOMAIN)]
    one = [helper.make_node(op, ["a", *names], ["y"], domain=DOMAIN, **sizes(op, k, n),
                            gated=1)]
    want = run(two, initializers, {"a": a}, library, threads)[0]
    got = run(one, initializers, {"a": a}, library, threads)[0]
    assert got.shape == (1, m, n // 2)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", OPS)
def test_gated_needs_gate_and_up_in_whole_panels(library, op):
    names, initializers = weights(op, 64, 192, seed=1)
    node = helper.make_node(op, ["a", *names], ["y"], domain=DOMAIN, **sizes(op, 64, 192),
                            gated=1)
    with pytest.raises(Exception, match=f"{op}: gated=1 needs N = 2 x a multiple of 64"):
        run([node], initializers, {"a": np.ones((1, 2, 64), np.float32)}, library, 1)


def mlp(projection_op: str = int8_rows.OP, n: int = 256, extra_reader: bool = False,
        output: str = "y") -> GraphProto:
    """x -> projection -> SwiGlu -> y, the projection's output read by a Relu too where
    `extra_reader`; the graph's outputs: `output` (y, or the projection's own)."""
    nodes = [helper.make_node(projection_op, ["x", "b"], ["gu"], domain=DOMAIN, N=n),
             helper.make_node(swiglu.OP, ["gu"], ["y"], domain=DOMAIN)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["gu"], ["r"]))
    return helper.make_graph(nodes, "mlp", [value("x")], [value(output)])


def folded(g: GraphProto) -> int:
    return swiglu.fold_gated(helper.make_model(g))


def test_fold_takes_only_a_native_projection_read_by_the_swiglu_alone():
    model = helper.make_model(mlp())
    model.graph.value_info.append(value("gu"))  # a shape recorded for the folded value
    assert swiglu.fold_gated(model) == 1
    g = model.graph
    assert [n.op_type for n in g.node] == [int8_rows.OP]
    assert not g.value_info  # no shape left for a value no node makes
    assert list(g.node[0].output) == ["y"] and graph.int_attribute(g.node[0], "gated") == 1
    assert swiglu.fold_gated(model) == 0  # nothing left to fold
    assert folded(mlp(bf16_compute.OP)) == 1
    assert folded(mlp(int4_decode.OP)) == 1
    assert folded(mlp("MatMulNBits")) == 0  # not a native projection
    assert folded(mlp(n=192)) == 0  # gate and up not in whole panels
    assert folded(mlp(extra_reader=True)) == 0
    assert folded(mlp(output="gu")) == 0


def test_fold_reaches_into_branches_and_sees_their_reads():
    """An If branch's projection and SwiGlu fold there; a value a branch reads from outside
    counts as read."""
    inner = mlp()
    branch = helper.make_graph(list(inner.node), "then", [], [value("y")])
    switch = helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch)
    assert folded(helper.make_graph([switch], "outer", [], [])) == 2  # both branches
    outer = mlp()
    reader = helper.make_graph([helper.make_node("Relu", ["gu"], ["q"])], "reads", [], [value("q")])
    outer.node.append(helper.make_node("If", ["c"], ["z"], then_branch=reader, else_branch=reader))
    assert folded(outer) == 0


# the native projections' loads: MatMulBf16, MatMulF32, MatMulInt8, int4 prefill's MatMulInt8
# and int4 decode's MatMulInt4
KINDS = [("float", "bf16"), ("float", "fp32"), ("int8", "fp32"), ("int4", "fp32")]


def with_and_without(fold: str, path, compute: str,
                     monkeypatch) -> tuple[int, list[str], list[str]]:
    """Loads `path` twice, the second time with the backend's `fold` (fold_gated,
    fold_norms) a no-op, and runs the same calls on both: several rows' prefill, a chunk
    beside decode rows, then decode steps. Asserts the same logits and KV cache, bit for
    bit; returns what the fold returned and each load's op types, sorted."""
    from edgeprefill.engines.ort import backend as backend_module

    if compute == "bf16" and not (bf16_compute.cpu_has_bf16() or bf16_compute.widens_bf16()):
        pytest.skip("MatMulBf16 runs its portable loops here")
    if not load_manifest(path).graph.quantization and compute == "fp32" and \
            f32_projections.why_not(True) is not None:
        pytest.skip("MatMulF32 does not run here")
    if load_manifest(path).graph.quantization and int8_rows.why_not(True) is not None:
        pytest.skip("no AVX512-VNNI nor AVX2 here: no MatMulInt8")
    monkeypatch.setenv(select.MODE_ENV, "require")
    loaded: list[list[str]] = []
    loadable = backend_module.loadable
    folded: list[int] = []
    real = getattr(backend_module, fold)

    def counted(model) -> int:
        folded.append(real(model))
        return folded[-1]

    def capture(graph_path, model, *args, **kwargs):
        loaded.append(sorted(n.op_type for n in graph.every_node(model.graph)))
        return loadable(graph_path, model, *args, **kwargs)

    monkeypatch.setattr(backend_module, "loadable", capture)

    def calls() -> tuple[list[np.ndarray], list[np.ndarray]]:
        backend = OnnxRuntimeBackend(path, load_manifest(path),
                                     BackendOptions(threads=2, compute=compute))
        backend.allocate_kv(3, 256)
        rng = np.random.default_rng(3)
        out = [backend.run(StepBatch(rng.integers(3, 128, (3, 60)), np.zeros(3, np.int32),
                                     np.array([60, 9, 33], np.int32), 0)).copy()]
        chunk = np.zeros((3, 20), np.int64)
        chunk[0], chunk[1:, 0] = rng.integers(3, 128, 20), [4, 5]
        out.append(backend.run(StepBatch(chunk, np.array([60, 9, 33], np.int32),
                                         np.array([20, 1, 1], np.int32), 0)).copy())
        lens, token = np.array([80, 10, 34], np.int32), np.array([[6], [7], [8]])
        for _ in range(3):
            logits = backend.run(StepBatch(token, lens, np.ones(3, np.int32), 0)).copy()
            out.append(logits)
            token, lens = logits.argmax(-1)[:, None], lens + 1
        return out, [np.array(a, copy=True) for a in backend.kv_arrays()]

    monkeypatch.setattr(backend_module, fold, counted)
    got, got_kv = calls()
    monkeypatch.setattr(backend_module, fold, lambda model: 0)
    want, want_kv = calls()
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(b, a)
    for a, b in zip(want_kv, got_kv, strict=True):
        np.testing.assert_array_equal(b, a)
    return folded[0], loaded[0], loaded[1]


@pytest.mark.parametrize("kind, compute", KINDS)
def test_bundle_logits_and_cache_are_the_unfolded_graphs(library, wide_llama, monkeypatch,
                                                         kind, compute):
    """The same logits and KV cache bit for bit (int4: the prefill branch's projections,
    after the switches merge), and the loads differ only by the SwiGlus folded."""
    path = wide_llama(kind)
    gated, with_fold, without = with_and_without("fold_gated", path, compute, monkeypatch)
    # int4: every layer's in both branches of the switch (MatMulInt8 in the prefill one,
    # MatMulInt4 in the decode one) but the last layer's, whose MLP runs once after them on
    # each row's last token (int4_prefill.after_gather): 2 L - 1.
    layers = load_manifest(path).model.num_layers
    assert gated == (2 * layers - 1 if kind == "int4" else layers)
    for _ in range(gated):
        without.remove(swiglu.OP)
    assert with_fold == without
