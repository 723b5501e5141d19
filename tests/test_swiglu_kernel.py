"""edgeprefill.SwiGlu and its load-time rewrite: the op against silu(gate) * up in numpy,
the rewrite against the exact pattern (and nothing near it), and a whole bundle with the
native kernels against the stock graph token for token. Skipped only where the library
cannot be built."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeprefill.kernels import graph
from edgeprefill.kernels.swiglu import fuse_swiglu


def model(nodes, output: str = "y", extra_outputs: tuple[str, ...] = ()):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in (output, *extra_outputs)]
    m = helper.make_model(helper.make_graph(nodes, "mlp", inputs, outputs),
                          opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def exporter_pattern(swap: bool = False) -> list:
    """What edgeprefill.export.decoder writes for a SiLU-gated MLP's activation."""
    return [
        helper.make_node("Split", ["x"], ["gate", "up"], axis=-1, num_outputs=2),
        helper.make_node("Sigmoid", ["gate"], ["sig"]),
        helper.make_node("Mul", ["sig", "gate"] if swap else ["gate", "sig"], ["act"]),
        helper.make_node("Mul", ["up", "act"] if swap else ["act", "up"], ["y"]),
    ]


def run(m, library, x: np.ndarray, threads: int = 2) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if library is not None:
        so.register_custom_ops_library(str(library))
    session = ort.InferenceSession(m.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def silu_times_up(x: np.ndarray) -> np.ndarray:
    gate, up = np.split(x.astype(np.float64), 2, axis=-1)
    return gate / (1.0 + np.exp(-gate)) * up


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 1, 2 * 1536), (1, 300, 2 * 96), (3, 17, 2 * 33),
                                   (2, 2)])
def test_op_matches_numpy(library, shape, threads):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 6).astype(np.float32)
    x.flat[:4] = [0.0, -0.0, 100.0, -100.0][: x.size]  # sign edges, saturated sigmoid
    m = model(exporter_pattern())
    assert fuse_swiglu(m) == 1
    got = run(m, library, x, threads)
    assert got.shape == shape[:-1] + (shape[-1] // 2,)
    np.testing.assert_allclose(got, silu_times_up(x), rtol=2e-6, atol=1e-6)


def test_rewrite_is_at_least_as_exact_as_the_stock_graph(library):
    """The fused graph against the stock one ONNX Runtime runs (Sigmoid and Mul fused into
    its QuickGelu, whose sigmoid is an approximation off by up to ~1e-3 relative where the
    gate is very negative): both against float64, the fused one at least as close."""
    x = np.random.default_rng(3).standard_normal((1, 64, 2 * 576)).astype(np.float32) * 4
    want = silu_times_up(x)
    stock = run(model(exporter_pattern(swap=True)), None, x)
    fused = model(exporter_pattern(swap=True))
    assert fuse_swiglu(fused) == 1
    assert [n.op_type for n in fused.graph.node] == ["SwiGlu"]
    assert fused.graph.node[0].domain == graph.DOMAIN
    got = run(fused, library, x)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(stock, want, rtol=0, atol=1e-4)  # ONNX Runtime's own error
    assert np.abs(got - want).max() <= np.abs(stock - want).max()


def test_near_misses_are_left_alone():
    gelu = [
        helper.make_node("Split", ["x"], ["gate", "up"], axis=-1, num_outputs=2),
        helper.make_node("Gelu", ["gate"], ["act"]),
        helper.make_node("Mul", ["act", "up"], ["y"]),
    ]
    sizes = exporter_pattern()
    sizes[0] = helper.make_node("Split", ["x", "sizes"], ["gate", "up"], axis=-1)
    other_axis = exporter_pattern()
    other_axis[0] = helper.make_node("Split", ["x"], ["gate", "up"], axis=1, num_outputs=2)
    shared = exporter_pattern() + [helper.make_node("Neg", ["gate"], ["z"])]
    for nodes, extra in ((gelu, ()), (sizes, ()), (other_axis, ()), (shared, ("z",)),
                         (exporter_pattern(), ("act",))):
        m = model(nodes, extra_outputs=extra)
        before = m.SerializeToString()
        assert fuse_swiglu(m) == 0
        assert m.SerializeToString() == before
