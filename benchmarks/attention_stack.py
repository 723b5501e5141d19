"""A stack of attention layers as one ONNX graph over one packed qkv input, one call of it
with every input bound once, and its variants timed taking turns: what the attention
benchmarks (prefill_attention.py, sliding_attention.py, attention_variants.py) time, ONNX
Runtime's GroupQueryAttention against the native ops. Each benchmark makes its own layer
nodes and tables."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from op_ab import session_options

from edgeprefill.kernels.graph import DOMAIN


class Stack(NamedTuple):
    heads: int
    kv_heads: int
    head_dim: int
    layers: int

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


def stack_model(stack: Stack, nodes: list, inits: list, name: str) -> bytes:
    """The graph of `nodes` (layer i reads qkv, past_k{i}, past_v{i}, seqlens_k, total and
    writes out{i}, present_k{i}, present_v{i}), their outputs concatenated."""
    f32 = TensorProto.FLOAT
    layers = range(stack.layers)
    concat = helper.make_node("Concat", [f"out{i}" for i in layers], ["out"], axis=-1)
    cache = [1, stack.kv_heads, "capacity", stack.head_dim]
    inputs = [
        helper.make_tensor_value_info("qkv", f32, [1, "chunk", stack.qkv_width]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ] + [helper.make_tensor_value_info(f"past_{kind}{i}", f32, cache)
         for i in layers for kind in "kv"]
    outputs = [helper.make_tensor_value_info("out", f32, None)] + [
        helper.make_tensor_value_info(f"present_{kind}{i}", f32, None)
        for i in layers for kind in "kv"]
    graph = helper.make_graph([*nodes, concat], name, inputs, outputs, inits)
    proto = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(DOMAIN, 1)])
    proto.ir_version = 10
    return proto.SerializeToString()


def bound_run(session, stack: Stack, past: int, chunk: int, caches: list[np.ndarray]):
    """One call of `chunk` tokens after `past`, every input bound once, each cache bound in
    place as past and present."""
    qkv = np.random.default_rng(1).standard_normal((1, chunk, stack.qkv_width))
    binding = session.io_binding()
    binding.bind_cpu_input("qkv", qkv.astype(np.float32))
    binding.bind_cpu_input("seqlens_k", np.array([past + chunk - 1], np.int32))
    binding.bind_cpu_input("total", np.array(past + chunk, np.int32))
    for i in range(stack.layers):
        for j, kind in enumerate("kv"):
            value = ort.OrtValue.ortvalue_from_numpy(caches[2 * i + j])
            binding.bind_ortvalue_input(f"past_{kind}{i}", value)
            binding.bind_ortvalue_output(f"present_{kind}{i}", value)
    binding.bind_output("out")
    return lambda: session.run_with_iobinding(binding)


def take_turns(stack: Stack, models: dict[str, bytes], past: int, chunk: int, threads: int,
               library, turns: int, calls: int,
               libraries: dict | None = None) -> dict[str, list[float]]:
    """Each model's ms per layer in each of `turns` turns (the median of its calls: `calls`
    for decode, a tenth of them for a chunk), the models taking turns over the same caches
    of `past` positions. `libraries` names another kernel library for some models (an A/B
    of two builds of the kernels in one process); the others get `library`."""
    rng = np.random.default_rng(2)
    caches = [rng.random((1, stack.kv_heads, past + chunk, stack.head_dim), np.float32)
              for _ in range(2 * stack.layers)]

    def session(name: str, model: bytes) -> ort.InferenceSession:
        options = session_options(threads, str((libraries or {}).get(name, library)))
        options.log_severity_level = 3  # e.g. the unused tables of a graph without rotary
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    runs = {name: bound_run(session(name, model), stack, past, chunk, caches)
            for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(turns):
        for name, run in runs.items():
            run()  # warm
            each = []
            for _ in range(calls if chunk == 1 else max(1, calls // 10)):
                start = time.perf_counter()
                run()
                each.append(time.perf_counter() - start)
            times[name].append(float(np.median(each)) / stack.layers * 1e3)
    return times
