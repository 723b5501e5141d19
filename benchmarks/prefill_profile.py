"""Where a long prefill's time goes, per operator type, from ONNX Runtime's profiler.

    python benchmarks/prefill_profile.py BUNDLE [BUNDLE ...] --prompt 2048 --chunk 256
    python benchmarks/prefill_profile.py BUNDLE --runs 12 --compute bf16

Runs one `--prompt`-token prefill in `--chunk`-token chunks on each bundle (one warm-up
first, then `--runs` profiled runs) and prints, per bundle, the wall time of the first
profiled run and the share of kernel time per operator type, largest first. Shares hold up
under a loaded machine better than absolute times do.

With `--runs` above 1 it also prints every run's wall time and milliseconds per operator
type, and each one's slowest / fastest run, and after each run the core-to-core latency
(probes/core_latency.py): when a machine's speed moves between runs (the VMs' slow mode,
docs/benchmarks.md), this says which operators it moves and whether the host had placed
the two vCPUs far apart meanwhile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from backend_steps import prefill
from probes.core_latency import core_to_core_ns

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions
from edgeprefill.engines.base import COMPUTES
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.errors import EdgeprefillError

# Their kernel time contains their subgraphs' nodes, which are profiled on their own too.
CONTROL_FLOW = {"If", "Loop", "Scan"}


class ProfiledBackend(OnnxRuntimeBackend):
    profile = False

    def _session_options(self):
        so = super()._session_options()
        so.enable_profiling = self.profile
        return so


def timed_prefill(backend: OnnxRuntimeBackend, ids: np.ndarray, chunk: int) -> float:
    start = time.perf_counter()
    prefill(backend, ids, chunk, pad=True)
    return time.perf_counter() - start


def op_seconds(events: list[dict]) -> dict[str, float]:
    """Kernel seconds per operator type (control flow left out: its nodes count on their
    own), largest first."""
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            if op not in CONTROL_FLOW:
                totals[op] += event["dur"] / 1e6
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def split_runs(events: list[dict], runs: int) -> list[list[dict]]:
    """The node events of `runs` equal prefills, in time order, one list per prefill: every
    prefill runs the same nodes, so each holds the same number of events."""
    nodes = sorted((e for e in events if e.get("cat") == "Node"), key=lambda e: e["ts"])
    size = len(nodes) // runs
    return [nodes[i * size:(i + 1) * size] for i in range(runs)]


def profile_bundle(bundle: Path, prompt: int, chunk: int, threads: int,
                   compute: str = "fp32", runs: int = 1) -> None:
    manifest = load_manifest(bundle)
    ProfiledBackend.profile = True
    backend = ProfiledBackend(bundle, manifest, BackendOptions(threads=threads, compute=compute))
    backend.allocate_kv(1, -(-prompt // chunk) * chunk)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, manifest.model.vocab_size, prompt) for _ in range(runs + 1)]
    timed_prefill(backend, prompts[0], chunk)  # warm-up
    walls, latencies = [], []
    for ids in prompts[1:]:
        walls.append(timed_prefill(backend, ids, chunk))
        latencies.append(core_to_core_ns() if runs > 1 else None)
    path = Path(backend.session.end_profiling())
    per_run = [op_seconds(part) for part in split_runs(json.loads(path.read_text()), runs + 1)][1:]
    path.unlink()
    kind = manifest.graph.quantization or manifest.graph.dtype
    print(f"{bundle} ({kind}, compute {compute}, {threads} threads): {prompt} tokens in "
          f"{chunk}-token chunks, {walls[0]:.2f} s")
    whole = sum(per_run[0].values()) or 1.0
    for op, seconds in list(per_run[0].items())[:8]:
        print(f"  {op:<36}{seconds / whole:6.1%}")
    if runs > 1:
        print_runs(walls, per_run, latencies)


def print_runs(walls: list[float], per_run: list[dict[str, float]],
               latencies: list[float | None]) -> None:
    ops = list(per_run[0])[:6]
    print("  run    wall s  core ns" + "".join(f"{op[:14]:>15}" for op in ops) + "   (ms)")
    for i, (wall, seconds) in enumerate(zip(walls, per_run, strict=True)):
        ms = "".join(f"{seconds.get(op, 0) * 1e3:15.0f}" for op in ops)
        core = f"{latencies[i]:8.0f}" if latencies[i] is not None else "     n/a"
        print(f"  {i + 1:>3} {wall:9.3f} {core}{ms}")

    def spread(values: list[float]) -> str:
        return f"{max(values) / min(values):.2f}" if min(values) > 0 else "-"

    print("  slowest / fastest:  " + f"{spread(walls):>4}          "
          + "".join(f"{spread([s.get(op, 0) for s in per_run]):>15}" for op in ops))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute", choices=COMPUTES, default="fp32",
                        help="a float32 bundle's projections in fp32 or bf16 (--compute)")
    parser.add_argument("--runs", type=int, default=1,
                        help="profiled prefills after the warm-up, each its own prompt")
    args = parser.parse_args()
    if min(args.prompt, args.chunk, args.threads, args.runs) < 1:
        parser.error("--prompt, --chunk, --threads and --runs must be >= 1")
    try:
        for bundle in args.bundles:
            profile_bundle(bundle, args.prompt, args.chunk, args.threads, args.compute,
                           args.runs)
    except EdgeprefillError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
