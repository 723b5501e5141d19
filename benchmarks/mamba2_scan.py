"""A Mamba-2 bundle's SSM recurrence alone: its `Scan` on stock ONNX Runtime against the
native Mamba2Scan it is switched to at load time, taking turns in one process, for a
prefill chunk and a decode step.

    python benchmarks/mamba2_scan.py BUNDLE --rounds 5
    python benchmarks/mamba2_scan.py BUNDLE --chunks 256 1 --calls 3 200

Takes the bundle's first Mamba-2 Scan into a graph of its own (its widths and body as
exported), feeds it one row of random inputs as the exporter makes them (dt in (0.001,
0.1), decay = exp(dt A) with A in [-16, -1]), and prints the CPU, how far apart the two
sides' final states and outputs are, and per chunk the median ms per call of each over
`--rounds` rounds (the two sides alternate within each round) with native / Scan.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from comparison.report import cpu_name
from onnx import ModelProto, TensorProto, helper
from op_ab import session_options

from edgeprefill.bundle import load_graph, load_manifest
from edgeprefill.kernels.build import build
from edgeprefill.kernels.mamba2_scan import OP, fuse_mamba2, is_mamba2_scan

NAMES = ("h", "dtx", "B", "C", "decay")


def scan_alone(bundle: Path) -> ModelProto:
    graph = load_graph(bundle, load_manifest(bundle))
    scan = next((n for n in graph.graph.node if is_mamba2_scan(n)), None)
    if scan is None:
        raise SystemExit(f"{bundle}: no Mamba-2 Scan (not a Mamba-2 hybrid's ort bundle?)")
    node = helper.make_node("Scan", list(NAMES), ["final", "out"])
    node.attribute.extend(scan.attribute)
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [node], "scan", [helper.make_tensor_value_info(n, f, None) for n in NAMES],
        [helper.make_tensor_value_info(n, f, None) for n in ("final", "out")]),
        opset_imports=list(graph.opset_import))
    model.ir_version = graph.ir_version
    return model


def widths(model: ModelProto) -> tuple[int, int, int]:
    """(heads, head_dim, state_size) from the body's state input [B, heads, P, N]."""
    state = next(a for a in model.graph.node[0].attribute if a.name == "body").g.input[0]
    heads, p, n = (d.dim_value for d in state.type.tensor_type.shape.dim[1:])
    return heads, p, n


def feeds(heads: int, p: int, n: int, chunk: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    dt = rng.uniform(0.001, 0.1, (1, chunk, heads))
    values = {"h": rng.standard_normal((1, heads, p, n)) * 0.1,
              "dtx": dt[..., None] * rng.standard_normal((1, chunk, heads, p)),
              "B": rng.standard_normal((1, chunk, heads, n)),
              "C": rng.standard_normal((1, chunk, heads, n)),
              "decay": np.exp(dt * -rng.uniform(1.0, 16.0, heads))}
    return {k: v.astype(np.float32) for k, v in values.items()}


def session(model: ModelProto, threads: int, library: Path | None) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(),
                                session_options(threads, library),
                                providers=["CPUExecutionProvider"])


def timed(s: ort.InferenceSession, inputs: dict[str, np.ndarray], calls: int) -> float:
    """ms per call over `calls` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        s.run(None, inputs)
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--chunks", type=int, nargs="+", default=[256, 1],
                        help="tokens per call, one comparison each")
    parser.add_argument("--calls", type=int, nargs="+", default=[3, 200],
                        help="calls per round, one per chunk")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if len(args.calls) != len(args.chunks):
        parser.error("--calls takes one count per --chunks entry")
    stock = scan_alone(args.bundle)
    native = scan_alone(args.bundle)
    fuse_mamba2(native)
    sides = {"Scan": session(stock, args.threads, None),
             OP: session(native, args.threads, build())}
    heads, p, n = widths(stock)
    print(f"{cpu_name()}, {args.threads} threads; {heads} heads of {p}, a state of {n}")
    print(f"| tokens | Scan ms | {OP} ms | {OP} / Scan | state apart | y apart |")
    print("|---|---|---|---|---|---|")
    for chunk, calls in zip(args.chunks, args.calls, strict=True):
        inputs = feeds(heads, p, n, chunk)
        (h0, y0), (h1, y1) = (s.run(None, inputs) for s in sides.values())
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, s in sides.items():
                times[name].append(timed(s, inputs, calls))
        scan, op = (statistics.median(times[name]) for name in sides)
        print(f"| {chunk} | {scan:.3f} | {op:.3f} | **{op / scan:.3f}** | "
              f"{float(np.abs(h0 - h1).max()):.1e} | {float(np.abs(y0 - y1).max()):.1e} |")


if __name__ == "__main__":
    main()
