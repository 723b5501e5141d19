"""int8 projections alone: ONNX Runtime's DynamicQuantizeMatMul against edgeprefill.MatMulInt8.

    python -m edgeprefill.kernels.build
    python benchmarks/int8_matmul.py --threads 1,2 --rows 1,16,64,256

For each shape (the SmolLM2-135M projections: 576 -> 1536, 1536 -> 576, 576 -> 576, and the
576 -> 49152 LM head), a graph of `--layers` such nodes on their own random per-column int8
weights (as `export --quantize int8` writes them) runs `--rows` rows of activations:
DynamicQuantizeMatMul as an int8 bundle's session runs it here (on uint8 weights at a zero
point of 128 where this CPU's int8 GEMM would saturate: engines/ort/int8_unsigned.py), and
MatMulInt8 on the same codes packed as engines/ort/int8_rows.py packs them. The two take
turns `--turns` times. Prints microseconds per node (median), new / old, and the largest
difference between the outputs relative to their magnitude (DynamicQuantizeMatMul scales a
call's rows together, MatMulInt8 each row on its own: not the same numbers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.engines.ort import int8_unsigned
from edgeprefill.engines.ort.int8_rows import OP, pack
from edgeprefill.export.quantize import int8_per_channel
from edgeprefill.kernels.build import KernelBuildError, build
from edgeprefill.kernels.graph import DOMAIN

OLD = "DynamicQuantizeMatMul"
SHAPES = {"up": (576, 1536), "down": (1536, 576), "o": (576, 576), "lm_head": (576, 49152)}


def session(op: str, k: int, n: int, layers: int, threads: int, library: str):
    rng = np.random.default_rng(k * n)
    nodes, inits, outputs = [], [], []
    for i in range(layers):
        codes, scales = int8_per_channel(rng.standard_normal((k, n)).astype(np.float32))
        names = [f"b{i}", f"s{i}"]
        if op == OP:
            packed, sums = pack(codes)
            nodes.append(helper.make_node(OP, ["a", f"b{i}", f"s{i}", f"c{i}"], [f"y{i}"],
                                          domain=DOMAIN, N=n))
            inits += [numpy_helper.from_array(packed, f"b{i}"),
                      numpy_helper.from_array(sums, f"c{i}")]
        elif int8_unsigned.saturates():
            nodes.append(helper.make_node(OLD, ["a", *names, f"z{i}"], [f"y{i}"],
                                          domain="com.microsoft"))
            inits += [numpy_helper.from_array(int8_unsigned.unsigned(codes), f"b{i}"),
                      numpy_helper.from_array(int8_unsigned.zero_points(n), f"z{i}")]
        else:
            nodes.append(helper.make_node(OLD, ["a", *names], [f"y{i}"], domain="com.microsoft"))
            inits.append(numpy_helper.from_array(codes, f"b{i}"))
        inits.append(numpy_helper.from_array(scales.astype(np.float32), f"s{i}"))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "int8", [helper.make_tensor_value_info(
        "a", TensorProto.FLOAT, None)], outputs, inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def taking_turns(runs: dict, a: np.ndarray, turns: int, calls: int,
                 clock) -> tuple[dict[str, np.ndarray], dict[str, list[float]]]:
    """Each session's output on `a`, and the times of `calls` calls of each, the sessions
    taking turns `turns` times (benchmarks/f32_matmul.py's too)."""
    out = {op: s.run(None, {"a": a})[0] for op, s in runs.items()}
    times: dict[str, list[float]] = {op: [] for op in runs}
    for _ in range(turns):
        for op, s in runs.items():
            for _ in range(calls):
                start = clock()
                s.run(None, {"a": a})
                times[op].append(clock() - start)
    return out, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated")
    parser.add_argument("--rows", default="1,16,64,256", help="comma-separated")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    parser.add_argument("--layers", type=int, default=8, help="nodes per graph (LM head: 1)")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per turn")
    parser.add_argument("--cpu-time", action="store_true", help=(
        "time by the process's CPU time, not the wall clock: steadier while other processes "
        "load the machine; with one thread only (ONNX Runtime's pool threads spin)"))
    parser.add_argument("--fastest", action="store_true",
                        help="the fastest call, not the median: steadier under other load")
    args = parser.parse_args()
    try:
        library = str(build())
    except KernelBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    clock = time.process_time if args.cpu_time else time.perf_counter
    pick = min if args.fastest else statistics.median
    print(f"us per node, {'fastest' if args.fastest else 'median'} of {args.turns} turns x "
          f"{args.calls} calls, alternating")
    for threads in (int(t) for t in args.threads.split(",")):
        for name in args.shapes.split(","):
            k, n = SHAPES[name]
            layers = 1 if name == "lm_head" else args.layers
            runs = {op: session(op, k, n, layers, threads, library) for op in (OLD, OP)}
            for rows in (int(r) for r in args.rows.split(",")):
                a = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
                out, times = taking_turns(runs, a, args.turns, args.calls, clock)
                old, new = (pick(times[op]) / layers * 1e6 for op in (OLD, OP))
                diff = np.abs(out[OP] - out[OLD]).max() / np.abs(out[OLD]).max()
                print(f"  {threads}t {name:8} {k:5} x {n:<6} rows {rows:4}: {OLD} {old:9.1f}"
                      f"  {OP} {new:9.1f}  new/old {new / old:5.2f}  diff {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
