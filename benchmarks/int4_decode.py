"""int4 decode projections alone: ONNX Runtime's MatMulNBits against edgeprefill.MatMulInt4.

    python -m edgeprefill.kernels.build
    python benchmarks/int4_decode.py --threads 1,2 --rows 1
    python benchmarks/int4_decode.py --threads 1 --cpu-time   # steadier on a loaded host

For each projection of the SmolLM2-135M shape (q/k/v packed 576 -> 960, o 576 -> 576,
gate/up packed 576 -> 3072, down 1536 -> 576, and the 576 -> 49152 LM head), a graph of
`--layers` such nodes on their own random int4 weights (block 32, as `export --quantize
int4` writes them) runs `--rows` one-token rows. At the default 60 nodes (the LM head 4) a
graph holds 12 MB (o), 21 MB (qkv), 33 MB (down), 66 MB (gate/up) and 71 MB (LM head) of
MatMulInt4's weights: only the last three pass a 32 MiB L3 (the Zen 3 and Zen 4 VMs), so
there o and qkv read theirs from the L3 (raise `--layers` to read them from memory). The
two ops: MatMulNBits at accuracy level 4 (the bundle's op), and MatMulInt4 on the same
weights repacked as `engines/ort/int4_decode.py` repacks them. They take turns `--turns`
times. Prints microseconds per node (median) and the weight bytes read per
second, and the largest difference between the two outputs relative to their magnitude
(the same quantization; only the float32 sums' order differs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from onnx import helper, numpy_helper
from op_ab import built_library, graph_session, taking_turns

from edgeprefill.engines.ort.int4_decode import OP, repack
from edgeprefill.export.quantize import int4_blockwise
from edgeprefill.kernels.graph import DOMAIN

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576),
          "lm_head": (576, 49152)}


def session(op: str, k: int, n: int, layers: int, threads: int, library: str):
    rng = np.random.default_rng(k * n)
    nodes, inits = [], []
    for i in range(layers):
        packed, scales = int4_blockwise(rng.standard_normal((n, k)).astype(np.float32), 32)
        if op == OP:
            packed, scales = repack(packed, scales)
            nodes.append(helper.make_node(OP, ["a", f"b{i}", f"s{i}"], [f"y{i}"], domain=DOMAIN,
                                          K=k, N=n))
        else:
            nodes.append(helper.make_node(
                "MatMulNBits", ["a", f"b{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
                K=k, N=n, bits=4, block_size=32, accuracy_level=4))
        inits += [numpy_helper.from_array(packed, f"b{i}"),
                  numpy_helper.from_array(scales, f"s{i}")]
    weight_bytes = sum(len(t.raw_data) for t in inits)
    return graph_session(nodes, inits, threads, library), weight_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--layers", type=int, default=60, help="nodes per graph (LM head: 4)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10, help="timed calls per turn")
    parser.add_argument("--cpu-time", action="store_true", help=(
        "time by the process's CPU time, not the wall clock: steadier while other processes "
        "load the machine; with one thread only (ONNX Runtime's pool threads spin)"))
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]
    if args.cpu_time and thread_counts != [1]:
        parser.error("--cpu-time measures one thread only: add --threads 1")
    clock = time.process_time if args.cpu_time else time.perf_counter
    library = built_library()
    if library is None:
        return 1
    for threads in thread_counts:
        print(f"{threads} thread(s), {args.rows} row(s); us per node and weight GB/s, median of "
              f"{args.turns} turns x {args.calls} calls, alternating")
        for name, (k, n) in SHAPES.items():
            layers = 4 if name == "lm_head" else args.layers
            a = np.random.default_rng(1).standard_normal((args.rows, 1, k)).astype(np.float32)
            runs = {op: session(op, k, n, layers, threads, library) for op in ("MatMulNBits", OP)}
            out, times = taking_turns({op: s for op, (s, _) in runs.items()}, a, args.turns,
                                      args.calls, clock)
            cells = []
            for op, (_, weight_bytes) in runs.items():
                t = statistics.median(times[op])
                cells.append(f"{op} {t / layers * 1e6:7.1f} us {weight_bytes / t / 1e9:5.1f} GB/s")
            diff = np.abs(out[OP] - out["MatMulNBits"]).max() / np.abs(out["MatMulNBits"]).max()
            print(f"  {name:8} {k:5} x {n:<6} " + "   ".join(cells) + f"   max diff {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
