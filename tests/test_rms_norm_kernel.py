"""edgeprefill.SkipRmsNorm and its load-time rewrite: the op against the residual add and
RMS norm in float64 numpy and against ONNX Runtime's SkipSimplifiedLayerNormalization, rows
independent of their batch-mates, and the rewrite against the exporter's node (and nothing
near it). Skipped only where the library cannot be built."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.bundle import load_manifest
from edgeprefill.kernels import graph
from edgeprefill.kernels.rms_norm import OP, STOCK, fuse_skip_rms_norm

EPSILON = 1e-5


def model(width: int, gamma: np.ndarray, outputs: tuple[str, ...] = ("y", "", "", "sum"),
          inputs: tuple[str, ...] = ("x", "skip", "gamma")) -> onnx.ModelProto:
    """One SkipSimplifiedLayerNormalization as export/flavors.py writes it."""
    node = helper.make_node(STOCK, list(inputs), list(outputs), domain="com.microsoft",
                            epsilon=EPSILON)
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs if n]
    m = helper.make_model(helper.make_graph(
        [node], "norm",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "skip")],
        values, [numpy_helper.from_array(gamma, "gamma"),
                 numpy_helper.from_array(np.zeros(width, np.float32), "bias")]),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def run(m: onnx.ModelProto, library, x: np.ndarray, skip: np.ndarray,
        threads: int = 2) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if library is not None:
        so.register_custom_ops_library(str(library))
    session = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "skip": skip})


def reference(x: np.ndarray, skip: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    total = x.astype(np.float64) + skip
    return total / np.sqrt((total * total).mean(axis=-1, keepdims=True) + EPSILON) * gamma


def inputs(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    skip = rng.standard_normal(shape).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
    return x, skip, gamma


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 256, 576), (3, 1, 576), (2, 37, 100), (1, 1, 7)])
def test_op_matches_numpy_and_onnx_runtime(library, shape, threads):
    """Widths past and short of the 16-float vectors, prefill chunks (split over the pool)
    and decode rows (not). The sum output is the float32 sum itself."""
    x, skip, gamma = inputs(shape, sum(shape))
    m = model(shape[-1], gamma)
    stock_y, stock_sum = run(m, None, x, skip, threads)
    assert fuse_skip_rms_norm(m) == 1
    assert [(n.op_type, n.domain) for n in m.graph.node] == [(OP, graph.DOMAIN)]
    y, total = run(m, library, x, skip, threads)
    np.testing.assert_array_equal(total, x + skip)
    np.testing.assert_array_equal(stock_sum, total)
    np.testing.assert_allclose(y, reference(x, skip, gamma), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(y, stock_y, rtol=4e-6, atol=4e-6)


def test_a_row_gives_the_same_bits_with_any_batch_mates(library):
    x, skip, gamma = inputs((1, 300, 576), 5)
    m = model(576, gamma)
    fuse_skip_rms_norm(m)
    together = run(m, library, x, skip)[0]
    for row in (0, 17, 299):
        alone = run(m, library, x[:, row:row + 1], skip[:, row:row + 1], 1)[0]
        np.testing.assert_array_equal(alone, together[:, row:row + 1])


def test_near_misses_are_left_alone():
    """A bias input, or a node whose mean or inverse variance something reads, is not
    the exporter's: it keeps ONNX Runtime's kernel."""
    gamma = np.ones(8, np.float32)
    for m in (model(8, gamma, inputs=("x", "skip", "gamma", "bias")),
              model(8, gamma, outputs=("y", "mean", "", "sum")),
              model(8, gamma, outputs=("y", "", "inv_std", "sum"))):
        before = m.SerializeToString()
        assert fuse_skip_rms_norm(m) == 0
        assert m.SerializeToString() == before


def test_a_node_without_the_sum_output_gets_one(library):
    x, skip, gamma = inputs((1, 4, 32), 7)
    m = model(32, gamma, outputs=("y",))
    assert fuse_skip_rms_norm(m) == 1
    assert len(m.graph.node[0].output) == 2
    np.testing.assert_allclose(run(m, library, x, skip)[0], reference(x, skip, gamma),
                               rtol=2e-6, atol=2e-6)


def test_every_norm_after_a_residual_add_is_switched(bundle):
    """Each layer's norm after its attention and the next layer's input norm: 2 L - 1. The
    first layer's input norm has no residual to add, and the final norm runs on the rows
    gathered after the last residual add: both stay SimplifiedLayerNormalization."""
    path = bundle("llama")
    m = onnx.load(str(path / load_manifest(path).graph.file), load_external_data=False)
    stock = sum(n.op_type == STOCK for n in m.graph.node)
    layers = load_manifest(path).model.num_layers
    assert stock == 2 * layers - 1
    assert fuse_skip_rms_norm(m) == stock
    assert not any(n.op_type == STOCK for n in m.graph.node)
