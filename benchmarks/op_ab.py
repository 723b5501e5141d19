"""What the one-op benchmarks share (int8_matmul.py, f32_matmul.py, int4_decode.py): a
graph per (op, shape) of `--layers` such nodes on their own random weights, the two ops
taking turns on the same rows, and a line per row count with microseconds per node, the
weight bytes streamed a second, new / old and how far apart their outputs are."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import NodeProto, TensorProto, helper

from edgeprefill.kernels.build import KernelBuildError, build
from edgeprefill.kernels.graph import DOMAIN

# the SmolLM2-135M projections: name -> (K, N)
SHAPES = {"up": (576, 1536), "down": (1536, 576), "o": (576, 576), "lm_head": (576, 49152)}


def built_library() -> str | None:
    """The native kernels' library, built if need be; None (the reason printed on stderr)
    where it cannot be."""
    try:
        return str(build())
    except KernelBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return None


def session_options(threads: int, library: str | Path | None = None) -> Any:
    """A benchmark session's options: `threads` intra-op threads, the native library where
    given, and the pool spinning only while a call runs, as the engine sets it
    (engines/ort/backend.py). A benchmark holds several sessions at once, each with its own
    pool, and a pool left spinning after its call takes a core from the session being
    timed: on 2 cores, ops timed at 2 threads ran up to 2x slower than at 1 thread, the
    order of the sessions deciding which (docs/benchmarks.md, stop 60)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if library is not None:
        options.register_custom_ops_library(str(library))
    return options


def graph_session(nodes: list[NodeProto], initializers: list[Any], threads: int,
                  library: str) -> Any:
    """The session of `nodes` (reading input a, each writing its own output y0, y1, ...) on
    `initializers`, with `threads` threads and the native library."""
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
               for i in range(len(nodes))]
    graph = helper.make_graph(nodes, "op", [helper.make_tensor_value_info(
        "a", TensorProto.FLOAT, None)], outputs, initializers)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
        helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), session_options(threads, library),
                                providers=["CPUExecutionProvider"])


def taking_turns(runs: dict[str, Any], a: np.ndarray, turns: int, calls: int,
                 clock: Callable[[], float]) -> tuple[dict[str, np.ndarray],
                                                      dict[str, list[float]]]:
    """Each session's output on `a`, and the times of `calls` calls of each, the sessions
    taking turns `turns` times."""
    out = {op: s.run(None, {"a": a})[0] for op, s in runs.items()}
    times: dict[str, list[float]] = {op: [] for op in runs}
    for _ in range(turns):
        for op, s in runs.items():
            for _ in range(calls):
                start = clock()
                s.run(None, {"a": a})
                times[op].append(clock() - start)
    return out, times


def compare_ops(description: str, old: str, new: str, session: Callable[..., Any],
                bytes_per_weight: float, rows: str, layers: int) -> int:
    """The benchmark's command line and run: `session(op, k, n, layers, threads, library)`
    builds the graph of `op` (`old` or `new`); `rows` and `layers` are the defaults of
    --rows and --layers; a weight is `bytes_per_weight` bytes (the GB/s column)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", default="1,2", help="comma-separated")
    parser.add_argument("--rows", default=rows, help="comma-separated")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    parser.add_argument("--layers", type=int, default=layers,
                        help="nodes per graph (LM head: 1)")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per turn")
    parser.add_argument("--cpu-time", action="store_true", help=(
        "time by the process's CPU time, not the wall clock: steadier while other processes "
        "load the machine; with one thread only (ONNX Runtime's pool threads spin)"))
    parser.add_argument("--fastest", action="store_true",
                        help="the fastest call, not the median: steadier under other load")
    args = parser.parse_args()
    library = built_library()
    if library is None:
        return 1
    clock = time.process_time if args.cpu_time else time.perf_counter
    pick = min if args.fastest else statistics.median
    print(f"us per node, {'fastest' if args.fastest else 'median'} of {args.turns} turns x "
          f"{args.calls} calls, alternating; GB/s: weight bytes streamed")
    for threads in (int(t) for t in args.threads.split(",")):
        for name in args.shapes.split(","):
            k, n = SHAPES[name]
            nodes = 1 if name == "lm_head" else args.layers
            runs = {op: session(op, k, n, nodes, threads, library) for op in (old, new)}
            for count in (int(r) for r in args.rows.split(",")):
                a = np.random.default_rng(count).standard_normal((count, k)).astype(np.float32)
                out, times = taking_turns(runs, a, args.turns, args.calls, clock)
                was, now = (pick(times[op]) / nodes for op in (old, new))
                gbps = [bytes_per_weight * k * n / t / 1e9 for t in (was, now)]
                diff = np.abs(out[new] - out[old]).max() / np.abs(out[old]).max()
                print(f"  {threads}t {name:8} {k:5} x {n:<6} rows {count:4}: {old} "
                      f"{was * 1e6:9.1f} ({gbps[0]:5.1f} GB/s)  {new} {now * 1e6:9.1f} "
                      f"({gbps[1]:5.1f} GB/s)  new/old {now / was:5.2f}  diff {diff:.1e}")
    return 0
