"""The SkipRmsNorm inside the native projection that reads it (MatMulInt8, MatMulBf16, MatMulF32,
MatMulInt4 with epsilon, kernels/rms_norm.py's fold_norms): the same bits as the norm then the
projection, for the op, for the rewrite's choices, and for whole bundles."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import GraphProto, helper

from edgeprefill.bundle import load_manifest
from edgeprefill.engines.ort import bf16_compute, int8_rows
from edgeprefill.kernels import rms_norm
from edgeprefill.kernels.graph import DOMAIN, float_attribute
from tests.test_gated_projection import KINDS, OPS, run, sizes, value, weights, with_and_without

OUT = ("y", "sum")  # the projection's output and the residual sum


def norm_then(op: str, names: list[str], k: int, n: int, gated: bool) -> list:
    extra = {"gated": 1} if gated else {}
    return [helper.make_node(rms_norm.OP, ["x", "skip", "gamma"], ["normed", "sum"],
                             domain=DOMAIN, epsilon=1e-5),
            helper.make_node(op, ["normed", *names], ["y"], domain=DOMAIN, **sizes(op, k, n),
                             **extra)]


def inside(op: str, names: list[str], k: int, n: int, gated: bool) -> list:
    extra = {"gated": 1} if gated else {}
    return [helper.make_node(op, ["x", *names, "skip", "gamma"], ["y", "sum"], domain=DOMAIN,
                             **sizes(op, k, n), epsilon=1e-5, **extra)]


def feeds(m: int, k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(m + k)
    return {"x": rng.standard_normal((1, m, k)).astype(np.float32) * 2,
            "skip": rng.standard_normal((1, m, k)).astype(np.float32),
            "gamma": rng.standard_normal(k).astype(np.float32)}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m, k, n, gated", [(1, 576, 960, False), (5, 33, 70, False),
                                            (55, 96, 384, True), (130, 64, 128, False)])
def test_norm_inside_is_the_norm_then_the_projection(library, op, m, k, n, gated, threads):
    """Rows past a block, K with a tail past 16 lanes, with and without gated=1: the same
    output and residual sum, bit for bit."""
    names, initializers = weights(op, k, n, seed=m)
    want = run(norm_then(op, names, k, n, gated), initializers, feeds(m, k), library, threads,
               OUT)
    got = run(inside(op, names, k, n, gated), initializers, feeds(m, k), library, threads, OUT)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("op", OPS)
def test_norm_inputs_are_checked(library, op):
    names, initializers = weights(op, 64, 128, seed=2)
    f = feeds(3, 64)
    without_epsilon = [helper.make_node(op, ["x", *names, "skip", "gamma"], ["y", "sum"],
                                        domain=DOMAIN, **sizes(op, 64, 128))]
    with pytest.raises(Exception, match=f"{op}: skip, gamma and output 1 need the epsilon"):
        run(without_epsilon, initializers, f, library, 1, OUT)
    bad = dict(f, gamma=np.ones(32, np.float32))
    with pytest.raises(Exception, match=f"{op}: skip must have x's shape"):
        run(inside(op, names, 64, 128, False), initializers, bad, library, 1, OUT)


def chain(projection_op: str = int8_rows.OP, second_reader: bool = False,
          epsilon_already: bool = False, weight_made: bool = False) -> GraphProto:
    """norm -> Relu(sum) -> projection(normed): the sum read between the two, as the
    fused node must run where the norm ran."""
    skip_at = rms_norm.SKIP_INPUT.get(projection_op, 1)
    weight_inputs = [f"w{i}" for i in range(1, skip_at)]
    extra = {"epsilon": 1e-6} if epsilon_already else {}
    nodes = [helper.make_node(rms_norm.OP, ["x", "skip", "gamma"], ["normed", "sum"],
                              domain=DOMAIN, epsilon=1e-5),
             helper.make_node("Relu", ["sum"], ["r"])]
    if weight_made:
        nodes.append(helper.make_node("Identity", ["r"], ["w1"]))
    nodes.append(helper.make_node(projection_op, ["normed", *weight_inputs], ["y"],
                                  domain=DOMAIN, N=128, **extra))
    if second_reader:
        nodes.append(helper.make_node("Relu", ["normed"], ["q"]))
    return helper.make_graph(nodes, "chain", [value("x")], [value("y"), value("r")])


def test_fold_puts_the_projection_where_the_norm_was():
    model = helper.make_model(chain())
    model.graph.value_info.extend([value("normed"), value("sum")])
    assert rms_norm.fold_norms(model) == 1
    g = model.graph
    assert [n.op_type for n in g.node] == [int8_rows.OP, "Relu"]
    assert [v.name for v in g.value_info] == ["sum"]  # the normalized rows are gone
    fused = g.node[0]
    assert list(fused.input) == ["x", "w1", "w2", "w3", "skip", "gamma"]
    assert list(fused.output) == ["y", "sum"]
    assert float_attribute(fused, "epsilon", -1.0) == pytest.approx(1e-5)
    assert rms_norm.fold_norms(model) == 0  # nothing left


@pytest.mark.parametrize("graph, folds", [
    (chain(bf16_compute.OP), 1),
    (chain("MatMulInt4"), 1),
    (chain("MatMulNBits"), 0),  # not a native projection
    (chain(second_reader=True), 0),
    (chain(epsilon_already=True), 0),
    (chain(weight_made=True), 0),  # a node makes an input: it could not run where the norm ran
])
def test_fold_choices(graph, folds):
    assert rms_norm.fold_norms(helper.make_model(graph)) == folds


@pytest.mark.parametrize("kind, compute", KINDS)
def test_bundle_logits_and_cache_are_the_unfolded_graphs(library, wide_llama, monkeypatch,
                                                         kind, compute):
    """The same logits and KV cache bit for bit, and the loads differ only by the norms
    folded: every SkipRmsNorm (2 L - 1; int4: 2 L - 2 in each branch of the switch, and the
    last layer's second, whose MLP runs once after them on each row's last token)."""
    path = wide_llama(kind)
    norms, with_fold, without = with_and_without("fold_norms", path, compute, monkeypatch)
    layers = load_manifest(path).model.num_layers
    assert norms == (4 * layers - 3 if kind == "int4" else 2 * layers - 1)
    for _ in range(norms):
        without.remove(rms_norm.OP)
    assert with_fold == without
