"""edgeprefill.DecodeAttention's code paths against a numpy reference of what it computes.

The kernel has an AVX-512 path per head size (16-row key/value blocks shared by a query
group, 16 dot products summed across lanes at once; above 256 the query read a vector at a
time and the values swept in parts), an AVX2 + FMA one per head size where
the build has no AVX-512 (8-row blocks, 8 sums) and a portable one for other head sizes and
CPUs with neither. This checks each head size the vector paths specialize, one that only
the portable path takes, group sizes 1 to 7, and positions on either side of the 8- and
16-row blocks and the 128-position pieces, against attention written out in numpy
(rotary on the query and the new key, the cache written at each row's position, softmax
over positions 0..position). Skipped only where the library cannot be built."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.kernels import graph

CAPACITY = 320
POSITIONS = np.array([0, 1, 15, 16, 17, 127, 128, 129, 300], np.int32)



def rotary_tables(head_dim: int, rotary: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 10000.0 ** (-np.arange(0, rotary, 2) / rotary)
    angles = np.arange(CAPACITY)[:, None] * inv[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def kernel_model(heads: int, kv_heads: int, head_dim: int, rotary: int) -> bytes:
    cos, sin = rotary_tables(head_dim, rotary)
    node = helper.make_node(
        graph.OP, ["qkv", "past_k", "past_v", "positions", "cos", "sin"],
        ["out", "present_k", "present_v"], domain=graph.DOMAIN,
        num_heads=heads, kv_num_heads=kv_heads, scale=head_dim**-0.5,
    )
    cache = ["rows", kv_heads, CAPACITY, head_dim]
    inputs = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT,
                                      ["rows", 1, (heads + 2 * kv_heads) * head_dim]),
        helper.make_tensor_value_info("past_k", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_v", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("positions", TensorProto.INT32, ["rows"]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("out", "present_k", "present_v")]
    inits = [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")]
    model = helper.make_model(
        helper.make_graph([node], "decode", inputs, outputs, inits),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(graph.DOMAIN, 1)],
    )
    model.ir_version = 10
    return model.SerializeToString()


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Non-interleaved rotary on the first 2 * len(cos) dims of the last axis."""
    half = cos.shape[-1]
    out = x.astype(np.float64).copy()
    a, b = x[..., :half], x[..., half : 2 * half]
    out[..., :half] = a * cos - b * sin
    out[..., half : 2 * half] = b * cos + a * sin
    return out


def reference(qkv, keys, values, heads, kv_heads, head_dim, rotary):
    """What the kernel must compute, in float64; returns (out, keys, values)."""
    cos, sin = rotary_tables(head_dim, rotary)
    keys, values = keys.astype(np.float64), values.astype(np.float64)
    group = heads // kv_heads
    out = np.zeros((len(POSITIONS), 1, heads * head_dim))
    for row, position in enumerate(POSITIONS):
        parts = qkv[row, 0].reshape(heads + 2 * kv_heads, head_dim)
        c, s = cos[position], sin[position]
        q = rotate(parts[:heads], c, s)
        keys[row, :, position] = rotate(parts[heads : heads + kv_heads], c, s)
        values[row, :, position] = parts[heads + kv_heads :]
        for h in range(heads):
            seen = keys[row, h // group, : position + 1]
            scores = seen @ q[h] * head_dim**-0.5
            weights = np.exp(scores - scores.max())
            mixed = weights @ values[row, h // group, : position + 1] / weights.sum()
            out[row, 0, h * head_dim : (h + 1) * head_dim] = mixed
    return out, keys, values


def run_kernel(library, model: bytes, qkv, keys, values, threads: int):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(library))
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    binding.bind_cpu_input("qkv", qkv)
    binding.bind_cpu_input("positions", POSITIONS)
    binding.bind_output("out")  # first: copy_outputs_to_cpu follows the binding order
    for name, array in (("k", keys), ("v", values)):
        for kind, bind in (("past_", binding.bind_input), ("present_", binding.bind_output)):
            bind(kind + name, "cpu", 0, np.float32, array.shape, array.ctypes.data)
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


# (heads, kv_heads, head_dim, rotary dims): the AVX-512 and AVX2 paths' head sizes 32, 64,
# 80, 96, 128 and 256, group sizes 1, 3, 4 and 7, partial rotary; 48 takes the portable
# path everywhere. 288 and 576 are absorbed multi-head latent attention's one KV head
# (MiniCPM3's 32 + 256, DeepSeek's 64 + 512), whose query the AVX-512 path does not keep
# in registers and whose values both paths sweep in parts.
SHAPES = [
    (6, 2, 32, 32), (9, 3, 64, 64), (4, 4, 64, 32), (8, 2, 80, 80), (4, 1, 96, 64),
    (14, 2, 128, 128), (2, 1, 256, 256), (6, 2, 48, 48), (5, 1, 288, 32), (3, 1, 576, 64),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "rotary"), SHAPES)
def test_kernel_matches_numpy_attention(library, heads, kv_heads, head_dim, rotary, threads):
    rng = np.random.default_rng(head_dim + heads)
    qkv = rng.standard_normal(
        (len(POSITIONS), 1, (heads + 2 * kv_heads) * head_dim)).astype(np.float32)
    shape = (len(POSITIONS), kv_heads, CAPACITY, head_dim)
    keys = (rng.standard_normal(shape) * 2).astype(np.float32)
    values = rng.standard_normal(shape).astype(np.float32)
    want = reference(qkv, keys, values, heads, kv_heads, head_dim, rotary)
    model = kernel_model(heads, kv_heads, head_dim, rotary)
    out = run_kernel(library, model, qkv, keys, values, threads)  # keys, values in place
    np.testing.assert_allclose(out, want[0], rtol=2e-5, atol=2e-5, err_msg="out")
    np.testing.assert_allclose(keys, want[1], rtol=1e-6, atol=1e-6, err_msg="keys")
    np.testing.assert_allclose(values, want[2], rtol=0, atol=0, err_msg="values")
