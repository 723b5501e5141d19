"""The native attention at absorbed multi-head latent attention's shapes against ONNX
Runtime's GroupQueryAttention: one layer of multi-query attention over ONE KV head of
r + L (MiniCPM3's 32 + 256, DeepSeek's 64 + 512), rotary outside (do_rotary=0) and the
values the keys' own vectors, as export/latent_attention.py gives both. A decode step (the
decode rows' code, which vectorizes these widths) and a chunk over a past (the prefill
pieces), output and written cache. Skipped only where the library cannot be built."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeprefill.kernels import graph

CAPACITY, PAST = 320, 283  # past: 17 rows past the last 16-row block, 3 128-position pieces


def layer_model(heads: int, width: int, native: bool) -> bytes:
    node = helper.make_node(
        "GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total"],
        ["out", "present_k", "present_v"], name="mla", domain="com.microsoft",
        num_heads=heads, kv_num_heads=1, scale=192**-0.5, do_rotary=0)
    if native:
        node = graph.kernel_node(node, prefill=True)
    cache = [1, 1, CAPACITY, width]
    inputs = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, "chunk", (heads + 2) * width]),
        helper.make_tensor_value_info("past_k", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_v", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("out", "present_k", "present_v")]
    model = helper.make_model(helper.make_graph([node], "mla", inputs, outputs), opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(graph.DOMAIN, 1)])
    model.ir_version = 10
    return model.SerializeToString()


def run_layer(model: bytes, library, qkv: np.ndarray, cache: np.ndarray):
    """One chunk after PAST positions, the cache (keys and values the same vectors, as
    latent attention caches them) bound in place; returns (out, keys, values)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.register_custom_ops_library(str(library))
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    keys, values = cache.copy(), cache.copy()
    binding = session.io_binding()
    binding.bind_cpu_input("qkv", qkv)
    binding.bind_cpu_input("seqlens_k", np.array([PAST + qkv.shape[1] - 1], np.int32))
    binding.bind_cpu_input("total", np.array(PAST + qkv.shape[1], np.int32))
    binding.bind_output("out")  # first: outputs come back in the order they were bound
    for name, array in (("k", keys), ("v", values)):
        for kind, bind in (("past_", binding.bind_input), ("present_", binding.bind_output)):
            bind(kind + name, "cpu", 0, np.float32, array.shape, array.ctypes.data)
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0], keys, values


@pytest.mark.parametrize("chunk", [1, 21])
@pytest.mark.parametrize(("heads", "width"), [(40, 288), (16, 576)])
def test_latent_attention_matches_group_query_attention(library, heads, width, chunk):
    rng = np.random.default_rng(width + chunk)
    qkv = rng.standard_normal((1, chunk, heads + 2, width)).astype(np.float32)
    qkv[:, :, heads + 1] = qkv[:, :, heads]  # v = k: the new token's latent
    qkv = qkv.reshape(1, chunk, -1)
    cache = rng.standard_normal((1, 1, CAPACITY, width)).astype(np.float32)
    want = run_layer(layer_model(heads, width, False), library, qkv, cache)
    got = run_layer(layer_model(heads, width, True), library, qkv, cache)
    for name, a, b in zip(("out", "keys", "values"), want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=name)
