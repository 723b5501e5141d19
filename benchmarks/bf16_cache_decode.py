"""Decode attention over a float32 KV cache against a bf16 one (`--compute bf16`'s cache).

    python -m edgeprefill.kernels.build
    python benchmarks/bf16_cache_decode.py --past 576,2000 --threads 1,2

One token per row of the SmolLM2-135M shape (9 query heads, 3 KV heads, head_dim 64)
attends over `--past` cached positions in a graph of `--layers` PrefillAttention nodes
(a decode step's op, its one-token rows run DecodeRows), each over its own cache: 64 layers
at past 576 are 57 MB of float32 keys and values, more than a 32 MiB L3, so each call reads
them from memory, as a decode step does. The same graph with PrefillAttentionBf16KV over
uint16 caches (the float32 values' bf16 roundings) reads half the bytes. The two take turns
`--turns` times in one process; prints microseconds per layer (median; one thread: CPU
time) and bf16 / float32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from op_ab import built_library, session_options

from edgeprefill.engines.ort.bf16_compute import bf16_bits
from edgeprefill.kernels import graph

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
WIDTH = (HEADS + 2 * KV_HEADS) * HEAD_DIM


def model(layers: int, capacity: int, bf16_cache: bool) -> bytes:
    rng = np.random.default_rng(0)
    tables = [rng.random((capacity + 1, HEAD_DIM // 2), np.float32) for _ in range(2)]
    kind = TensorProto.UINT16 if bf16_cache else TensorProto.FLOAT
    cache = [1, KV_HEADS, capacity, HEAD_DIM]
    nodes, inputs, outputs = [], [], []
    for i in range(layers):
        gqa = helper.make_node(
            "GroupQueryAttention", ["qkv", "", "", f"past_k{i}", f"past_v{i}", "seqlens_k",
                                    "total", "cos", "sin"],
            [f"out{i}", f"present_k{i}", f"present_v{i}"], name=f"layer{i}",
            domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
            scale=HEAD_DIM**-0.5, do_rotary=1)
        node = graph.kernel_node(gqa, prefill=True, valid_lens="valid")
        node.attribute.append(helper.make_attribute("bf16", 1))
        if bf16_cache:
            node.op_type = graph.PREFILL_BF16_KV_OP
        nodes.append(node)
        for kind_name in "kv":
            inputs.append(helper.make_tensor_value_info(f"past_{kind_name}{i}", kind, cache))
            outputs.append(helper.make_tensor_value_info(f"present_{kind_name}{i}", kind, cache))
    nodes.append(helper.make_node("Concat", [f"out{i}" for i in range(layers)], ["out"], axis=-1))
    inputs += [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, 1, WIDTH]),
               helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
               helper.make_tensor_value_info("total", TensorProto.INT32, []),
               helper.make_tensor_value_info("valid", TensorProto.INT32, [1])]
    outputs.append(helper.make_tensor_value_info("out", TensorProto.FLOAT, None))
    initializers = [numpy_helper.from_array(t, n)
                    for t, n in zip(tables, ("cos", "sin"), strict=True)]
    g = helper.make_graph(nodes, "decode", inputs, outputs, initializers)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1),
                                            helper.make_opsetid(graph.DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def bound(layers: int, past: int, threads: int, library: str, bf16_cache: bool):
    """A call of the graph with its caches bound in place (present = past), and what must
    stay alive with it."""
    capacity = past + 64
    session = ort.InferenceSession(model(layers, capacity, bf16_cache),
                                   session_options(threads, library),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    binding = session.io_binding()
    feeds = {"qkv": rng.standard_normal((1, 1, WIDTH)).astype(np.float32),
             "seqlens_k": np.array([past], np.int32), "total": np.array(past + 1, np.int32),
             "valid": np.array([1], np.int32)}
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    kept = []
    for i in range(layers):
        for kind in "kv":
            cache = rng.standard_normal((1, KV_HEADS, capacity, HEAD_DIM)).astype(np.float32)
            if bf16_cache:
                cache = bf16_bits(cache).astype(np.uint16)
            value = ort.OrtValue.ortvalue_from_numpy(cache)
            binding.bind_ortvalue_input(f"past_{kind}{i}", value)
            binding.bind_ortvalue_output(f"present_{kind}{i}", value)
            kept += [cache, value]
    binding.bind_output("out")
    return (lambda: session.run_with_iobinding(binding)), (session, binding, kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--past", default="576,2000", help="cached positions, comma-separated")
    parser.add_argument("--threads", default="1,2", help="comma-separated")
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per turn")
    args = parser.parse_args()
    library = built_library()
    if library is None:
        return 1
    for threads in (int(t) for t in args.threads.split(",")):
        clock = time.process_time if threads == 1 else time.perf_counter
        for past in (int(p) for p in args.past.split(",")):
            runs = {bf16: bound(args.layers, past, threads, library, bf16)
                    for bf16 in (False, True)}
            times: dict[bool, list[float]] = {False: [], True: []}
            for turn in range(args.turns):
                for bf16 in ((False, True) if turn % 2 == 0 else (True, False)):
                    run = runs[bf16][0]
                    run()
                    calls = []
                    for _ in range(args.calls):
                        start = clock()
                        run()
                        calls.append(clock() - start)
                    times[bf16].append(statistics.median(calls))
            us = {bf16: statistics.median(t) / args.layers * 1e6 for bf16, t in times.items()}
            print(f"{threads} thread(s), past {past}: float32 cache {us[False]:6.1f} us per "
                  f"layer, bf16 cache {us[True]:6.1f}, bf16 / float32 {us[True] / us[False]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
