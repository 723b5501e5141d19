"""Decode attention alone: ONNX Runtime's GroupQueryAttention against the alternatives tried.

    python benchmarks/decode_attention.py --past 512 --threads 2

One query token of the SmolLM2-135M shape (9 query heads, 3 KV heads, head_dim 64) attends
over `--past` cached positions of a fixed-capacity cache, in graphs of 8 chained layers (to
amortize the call), alternating the variants `--turns` times. Prints milliseconds per layer:

- gqa: com.microsoft.GroupQueryAttention as edgeprefill exports it (packed q/k/v, rotary
  inside, the cache bound as past and present, updated in place);
- gqa-scale1: the same with scale 1, the 1/sqrt(d) folded into q;
- gqa-if: the same inside an If on the chunk length (the way a decode-only kernel could be
  switched in); the cache is checked to be written in place;
- matmul: standard ops over the valid length, keys as the GEMM's left operand;
- onnx-attention: ONNX Attention (opset 24) with nonpad_kv_seqlen over the whole cache;
- native / native-if: edgeprefill.DecodeAttention (edgeprefill/kernels), alone and inside
  the If as the runtime switches it in (only where `python -m edgeprefill.kernels.build`
  has built the library).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from op_ab import session_options

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 8
GROUP = HEADS // KV_HEADS
QKV_WIDTH = (HEADS + 2 * KV_HEADS) * HEAD_DIM


def model_bytes(nodes: list, inputs: list, outputs: list, inits: list, opset: int) -> bytes:
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1),
               helper.make_opsetid("edgeprefill", 1)]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10  # onnxruntime 1.31 loads IR <= 13
    return model.SerializeToString()


def cache_inputs() -> list:
    shape = [1, KV_HEADS, "capacity", HEAD_DIM]
    return [
        helper.make_tensor_value_info(f"past_{kind}{i}", TensorProto.FLOAT, shape)
        for i in range(LAYERS)
        for kind in "kv"
    ]


def gqa_node(layer: int, scale: float, suffix: str = ""):
    return helper.make_node(
        "GroupQueryAttention",
        ["qkv", "", "", f"past_k{layer}", f"past_v{layer}", "seqlens_k", "total", "cos", "sin"],
        [f"out{layer}{suffix}", f"present_k{layer}{suffix}", f"present_v{layer}{suffix}"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, scale=scale,
        do_rotary=1,
    )


def native_node(layer: int, scale: float, suffix: str = ""):
    from edgeprefill.kernels.graph import kernel_node

    return kernel_node(gqa_node(layer, scale), suffix)


def gqa_model(capacity: int, scale: float, use_if: bool, native: bool = False) -> bytes:
    rng = np.random.default_rng(0)
    tables = [rng.random((capacity + 1, HEAD_DIM // 2), np.float32) for _ in range(2)]
    inits = [numpy_helper.from_array(t, n) for t, n in zip(tables, ("cos", "sin"), strict=True)]
    nodes = []
    if use_if:  # is_decode = (the chunk axis of qkv is 1)
        inits += [numpy_helper.from_array(np.array([v], np.int64), f"i{v}") for v in (1, 2)]
        nodes += [
            helper.make_node("Shape", ["qkv"], ["qkv_shape"]),
            helper.make_node("Slice", ["qkv_shape", "i1", "i2"], ["chunk"]),
            helper.make_node("Equal", ["chunk", "i1"], ["is_decode1"]),
            helper.make_node("Squeeze", ["is_decode1"], ["is_decode"]),
        ]
    for i in range(LAYERS):
        if not use_if:
            nodes.append(native_node(i, scale) if native else gqa_node(i, scale))
            continue
        names = (f"out{i}", f"present_k{i}", f"present_v{i}")
        decode = native_node if native else gqa_node
        branches = [
            helper.make_graph(
                [make(i, scale, s)], f"branch{s}", [],
                [helper.make_tensor_value_info(n + s, TensorProto.FLOAT, None) for n in names],
            )
            for s, make in (("_decode", decode), ("_prefill", gqa_node))
        ]
        nodes.append(helper.make_node(
            "If", ["is_decode"], list(names), then_branch=branches[0], else_branch=branches[1]
        ))
    nodes.append(helper.make_node("Concat", [f"out{i}" for i in range(LAYERS)], ["out"], axis=-1))
    inputs = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, "chunk", QKV_WIDTH]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
        *cache_inputs(),
    ]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)] + [
        helper.make_tensor_value_info(f"present_{kind}{i}", TensorProto.FLOAT, None)
        for i in range(LAYERS)
        for kind in "kv"
    ]
    return model_bytes(nodes, inputs, outputs, inits, 21)


def matmul_model() -> bytes:
    """scores = K . q^T per KV head (its 3 query heads as the GEMM's columns), softmax over
    the keys, then P^T . V: the big operand is never transposed."""
    consts = {
        "zero": [0], "axis2": [2], "q_shape": [1, KV_HEADS, GROUP, HEAD_DIM],
        "out_shape": [1, 1, HEADS * HEAD_DIM],
    }
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in consts.items()]
    inits.append(numpy_helper.from_array(np.array(HEAD_DIM**-0.5, np.float32), "scale"))
    nodes = [
        helper.make_node("Reshape", ["q", "q_shape"], ["q4"]),
        helper.make_node("Mul", ["q4", "scale"], ["q_scaled"]),
        helper.make_node("Transpose", ["q_scaled"], ["q_t"], perm=[0, 1, 3, 2]),
    ]
    for i in range(LAYERS):
        nodes += [
            helper.make_node("Slice", [f"past_k{i}", "zero", "total", "axis2"], [f"k{i}"]),
            helper.make_node("Slice", [f"past_v{i}", "zero", "total", "axis2"], [f"v{i}"]),
            helper.make_node("MatMul", [f"k{i}", "q_t"], [f"scores{i}"]),  # [1,KV,T,group]
            helper.make_node("Softmax", [f"scores{i}"], [f"probs{i}"], axis=-2),
            helper.make_node("Transpose", [f"probs{i}"], [f"probs_t{i}"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [f"probs_t{i}", f"v{i}"], [f"heads{i}"]),
            helper.make_node("Reshape", [f"heads{i}", "out_shape"], [f"out{i}"]),
        ]
    nodes.append(helper.make_node("Concat", [f"out{i}" for i in range(LAYERS)], ["out"], axis=-1))
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 1, HEADS * HEAD_DIM]),
        helper.make_tensor_value_info("total", TensorProto.INT64, [1]),
        *cache_inputs(),
    ]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    return model_bytes(nodes, inputs, outputs, inits, 21)


def onnx_attention_model() -> bytes:
    inits = [numpy_helper.from_array(np.array([0, 0, HEADS, HEAD_DIM], np.int64), "q_shape")]
    nodes = [
        helper.make_node("Reshape", ["q", "q_shape"], ["q_split"]),
        helper.make_node("Transpose", ["q_split"], ["q4"], perm=[0, 2, 1, 3]),
    ]
    for i in range(LAYERS):
        nodes.append(helper.make_node(
            "Attention", ["q4", f"past_k{i}", f"past_v{i}", "", "", "", "total"], [f"out{i}"],
            q_num_heads=HEADS, kv_num_heads=KV_HEADS, scale=HEAD_DIM**-0.5,
        ))
    nodes.append(helper.make_node("Concat", [f"out{i}" for i in range(LAYERS)], ["out"], axis=-1))
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 1, HEADS * HEAD_DIM]),
        helper.make_tensor_value_info("total", TensorProto.INT64, [1]),
        *cache_inputs(),
    ]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    return model_bytes(nodes, inputs, outputs, inits, 24)


def bound_run(session, feeds: dict, caches: list[np.ndarray], in_place: bool):
    """A run with every input bound once; GroupQueryAttention's present is the past buffer."""
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    for i in range(LAYERS):
        for j, kind in enumerate("kv"):
            value = ort.OrtValue.ortvalue_from_numpy(caches[2 * i + j])
            binding.bind_ortvalue_input(f"past_{kind}{i}", value)
            if in_place:
                binding.bind_ortvalue_output(f"present_{kind}{i}", value)
    binding.bind_output("out")
    return lambda: session.run_with_iobinding(binding)


def variants(past: int, capacity: int, threads: int, caches: list[np.ndarray]) -> dict:
    from edgeprefill.kernels.build import library_path

    library = library_path()
    options = session_options(threads, str(library) if library.is_file() else None)
    options.log_severity_level = 3

    def session(model: bytes):
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(1)
    qkv = rng.random((1, 1, QKV_WIDTH), np.float32)
    gqa_feeds = {
        "qkv": qkv,
        "seqlens_k": np.array([past], np.int32),
        "total": np.array(past + 1, np.int32),
    }
    q_feeds = {"q": qkv[..., : HEADS * HEAD_DIM].copy(), "total": np.array([past + 1], np.int64)}
    runs = {
        "gqa": bound_run(session(gqa_model(capacity, HEAD_DIM**-0.5, False)), gqa_feeds,
                         caches, True),
        "gqa-scale1": bound_run(session(gqa_model(capacity, 1.0, False)), gqa_feeds, caches, True),
        "gqa-if": bound_run(session(gqa_model(capacity, HEAD_DIM**-0.5, True)), gqa_feeds,
                            caches, True),
        "matmul": bound_run(session(matmul_model()), q_feeds, caches, False),
        "onnx-attention": bound_run(session(onnx_attention_model()), q_feeds, caches, False),
    }
    if not library.is_file():
        print("native kernels not built (python -m edgeprefill.kernels.build): not measured")
        return runs
    scale = HEAD_DIM**-0.5
    native_feeds = {**gqa_feeds}
    runs["native"] = bound_run(session(gqa_model(capacity, scale, False, True)), native_feeds,
                               caches, True)
    runs["native-if"] = bound_run(session(gqa_model(capacity, scale, True, True)), gqa_feeds,
                                  caches, True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--past", type=int, default=512, help="cached positions")
    parser.add_argument("--capacity", type=int, default=4608, help="cache capacity")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--calls", type=int, default=100, help="timed calls per turn")
    args = parser.parse_args()
    if not 0 < args.past < args.capacity:
        parser.error("--past must be positive and below --capacity (room for the new token)")
    if min(args.threads, args.turns, args.calls) < 1:
        parser.error("--threads, --turns and --calls must be positive")
    shape = (1, KV_HEADS, args.capacity, HEAD_DIM)
    caches = [np.zeros(shape, np.float32) for _ in range(2 * LAYERS)]
    runs = variants(args.past, args.capacity, args.threads, caches)
    runs["gqa-if"]()
    written = caches[0][0, :, args.past]
    print(f"gqa-if wrote the bound cache in place: {bool(np.abs(written).sum() > 0)}")
    rng = np.random.default_rng(2)
    for cache in caches:
        cache[:, :, : args.past] = rng.random((1, KV_HEADS, args.past, HEAD_DIM), np.float32)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.turns):
        for name, run in runs.items():
            run()
            for _ in range(args.calls):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    print(f"{args.past} cached positions, capacity {args.capacity}, {args.threads} threads; "
          f"ms per layer (median of {args.turns} turns x {args.calls} calls)")
    for name, values in times.items():
        per_turn = np.array(values).reshape(args.turns, -1)
        medians = np.median(per_turn, axis=1) / LAYERS * 1e3
        print(f"  {name:<16}{np.median(medians):7.3f}   turns: "
              + ", ".join(f"{m:.3f}" for m in medians))


if __name__ == "__main__":
    main()
