"""float32 projections alone: ONNX Runtime's MatMul (MLAS) against edgeprefill.MatMulF32.

    python -m edgeprefill.kernels.build
    python benchmarks/f32_matmul.py --threads 1,2 --rows 1,4,256

For each shape (the SmolLM2-135M projections: 576 -> 1536, 1536 -> 576, 576 -> 576, and the
576 -> 49152 LM head), a graph of `--layers` such nodes on their own random weights (more
bytes than the last-level cache, as a decode step's) runs `--rows` rows of activations:
MatMul on the [K, N] initializer (MLAS packs it at load), and MatMulF32 on the same weight
in panels as engines/ort/f32_projections.py packs it. The two take turns `--turns` times.
Prints microseconds per node, new / old, the weight bytes a second each streams, and the
largest difference between the outputs relative to their magnitude (rounding only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from int8_matmul import taking_turns
from onnx import TensorProto, helper, numpy_helper

from edgeprefill.engines.ort.f32_projections import OP, pack
from edgeprefill.kernels.build import KernelBuildError, build
from edgeprefill.kernels.graph import DOMAIN

OLD = "MatMul"
SHAPES = {"up": (576, 1536), "down": (1536, 576), "o": (576, 576), "lm_head": (576, 49152)}


def session(op: str, k: int, n: int, layers: int, threads: int, library: str):
    rng = np.random.default_rng(k * n)
    nodes, inits, outputs = [], [], []
    for i in range(layers):
        w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        if op == OP:
            nodes.append(helper.make_node(OP, ["a", f"b{i}"], [f"y{i}"], domain=DOMAIN, N=n))
            inits.append(numpy_helper.from_array(pack(w), f"b{i}"))
        else:
            nodes.append(helper.make_node(OLD, ["a", f"b{i}"], [f"y{i}"]))
            inits.append(numpy_helper.from_array(w, f"b{i}"))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "f32", [helper.make_tensor_value_info(
        "a", TensorProto.FLOAT, None)], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated")
    parser.add_argument("--rows", default="1,2,4,256", help="comma-separated")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    parser.add_argument("--layers", type=int, default=16, help="nodes per graph (LM head: 1)")
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
          f"{args.calls} calls, alternating; GB/s: weight bytes streamed")
    for threads in (int(t) for t in args.threads.split(",")):
        for name in args.shapes.split(","):
            k, n = SHAPES[name]
            layers = 1 if name == "lm_head" else args.layers
            runs = {op: session(op, k, n, layers, threads, library) for op in (OLD, OP)}
            for rows in (int(r) for r in args.rows.split(",")):
                a = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32)
                out, times = taking_turns(runs, a, args.turns, args.calls, clock)
                old, new = (pick(times[op]) / layers for op in (OLD, OP))
                gbps = [4 * k * n / t / 1e9 for t in (old, new)]
                diff = np.abs(out[OP] - out[OLD]).max() / np.abs(out[OLD]).max()
                print(f"  {threads}t {name:8} {k:5} x {n:<6} rows {rows:4}: {OLD} "
                      f"{old * 1e6:9.1f} ({gbps[0]:5.1f} GB/s)  {OP} {new * 1e6:9.1f} "
                      f"({gbps[1]:5.1f} GB/s)  new/old {new / old:5.2f}  diff {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
