"""A Qwen3.5 bundle's DeltaNet recurrence alone: its `Scan` on stock ONNX Runtime against
the native GatedDeltaRule it is switched to at load time, taking turns in one process.

    python benchmarks/gated_delta.py BUNDLE --chunk 256 --rounds 3
    python benchmarks/gated_delta.py BUNDLE --chunk 1 --calls 200

Takes the bundle's first DeltaNet Scan into a graph of its own (its widths and body as
exported), feeds it one row of random inputs (q, k unit per head, decay in (0.2, 1)), and
prints the CPU, how far apart the two outputs are, and the median and fastest ms per call
of each over `--rounds` rounds of `--calls` calls.
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
from edgeprefill.kernels.gated_delta import fuse_gated_delta, is_delta_scan

NAMES = ("S", "q", "k", "v", "decay", "beta")


def scan_alone(bundle: Path) -> ModelProto:
    graph = load_graph(bundle, load_manifest(bundle))
    scan = next((n for n in graph.graph.node if is_delta_scan(n)), None)
    if scan is None:
        raise SystemExit(f"{bundle}: no Gated DeltaNet Scan (not a Qwen3.5 ort bundle?)")
    node = helper.make_node("Scan", list(NAMES), ["final", "out"])
    node.attribute.extend(scan.attribute)
    f = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [node], "scan", [helper.make_tensor_value_info(n, f, None) for n in NAMES],
        [helper.make_tensor_value_info(n, f, None) for n in ("final", "out")]),
        opset_imports=list(graph.opset_import))
    model.ir_version = graph.ir_version
    return model


def feeds(model: ModelProto, chunk: int) -> dict[str, np.ndarray]:
    state = next(i for i in model.graph.node[0].attribute if i.name == "body").g.input[0]
    heads, dk, dv = (d.dim_value for d in state.type.tensor_type.shape.dim[1:])
    rng = np.random.default_rng(0)

    def unit(shape):
        x = rng.standard_normal(shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    values = {"S": rng.standard_normal((1, heads, dk, dv)) * 0.1,
              "q": unit((1, chunk, heads, dk)) / np.sqrt(dk), "k": unit((1, chunk, heads, dk)),
              "v": rng.standard_normal((1, chunk, heads, dv)),
              "decay": rng.uniform(0.2, 1.0, (1, chunk, heads)),
              "beta": rng.uniform(0.0, 1.0, (1, chunk, heads))}
    return {k: v.astype(np.float32) for k, v in values.items()}


def session(model: ModelProto, threads: int, library: Path | None) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(),
                                session_options(threads, library),
                                providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--chunk", type=int, default=256, help="tokens per call")
    parser.add_argument("--calls", type=int, default=5, help="calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    stock = scan_alone(args.bundle)
    native = scan_alone(args.bundle)
    fuse_gated_delta(native)
    inputs = feeds(stock, args.chunk)
    sides = {"Scan": session(stock, args.threads, None),
             "GatedDeltaRule": session(native, args.threads, build())}
    outs = [s.run(None, inputs) for s in sides.values()]
    apart = max(float(np.abs(a - b).max()) for a, b in zip(*outs, strict=True))
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, s in sides.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                s.run(None, inputs)
            times[name].append((time.perf_counter() - start) / args.calls * 1e3)
    print(f"{cpu_name()}, {args.threads} threads, {args.chunk}-token chunk; outputs at most "
          f"{apart:.2e} apart")
    for name, ms in times.items():
        print(f"{name:<15} {statistics.median(ms):8.3f} ms (fastest {min(ms):.3f})")
    ratio = statistics.median(times["GatedDeltaRule"]) / statistics.median(times["Scan"])
    print(f"GatedDeltaRule / Scan {ratio:.3f}")


if __name__ == "__main__":
    main()
