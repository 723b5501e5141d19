"""A whole decode step with the native decode attention against the stock graph.

    python -m edgeprefill.kernels.build
    python benchmarks/native_decode.py BUNDLE --past 512,2048 --rows 1,4 --threads 2

Loads the bundle four times in one process, with `EDGEPREFILL_KERNELS=off` (ONNX Runtime's
GroupQueryAttention) and with the kernel switched in, in the order stock, native, native,
stock (the first-loaded session runs slower: docs/benchmarks.md, stop 28), then times bare
decode steps (`Backend.run`, no engine around it) taking turns: each turn runs `--steps`
steps of each session, so all see the same drift of a shared machine. Prints the
median step time per variant and their ratio for each (rows, past) point.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.errors import EdgeprefillError
from edgeprefill.kernels.select import MODE_ENV, NATIVE


def load(bundle: Path, mode: str, threads: int, spin: bool) -> OnnxRuntimeBackend:
    os.environ[MODE_ENV] = mode
    options = BackendOptions(threads=threads, spin=spin)
    return OnnxRuntimeBackend(bundle, load_manifest(bundle), options)


def step_runner(backend: OnnxRuntimeBackend, rows: int, past: int, capacity: int):
    backend.allocate_kv(rows, capacity)
    rng = np.random.default_rng(0)
    for arena in backend.kv_arrays():  # finite, varied history
        arena[...] = rng.standard_normal(arena.shape[1:], np.float32)
    vocab = backend.manifest.model.vocab_size
    batch = StepBatch(rng.integers(3, vocab, (rows, 1)), np.full(rows, past, np.int32),
                      np.ones(rows, np.int32), 0)
    return lambda: backend.run(batch)


def timed(run, steps: int) -> list[float]:
    run()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--past", default="512,2048", help="cached positions, comma-separated")
    parser.add_argument("--rows", default="1,4", help="decode rows, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per turn")
    parser.add_argument("--no-spin", dest="spin", action="store_false")
    args = parser.parse_args()
    try:
        pasts = [int(v) for v in args.past.split(",")]
        rows = [int(v) for v in args.rows.split(",")]
        # Each variant twice, loaded stock, native, native, stock: a process's first-loaded
        # session ran ~5% slower than later ones (docs/benchmarks.md, stop 28).
        order = ["off", "require", "require", "off"]
        variants = [(mode, load(args.bundle, mode, args.threads, args.spin)) for mode in order]
    except (ValueError, EdgeprefillError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    assert variants[1][1].kernels.described == NATIVE
    capacity = max(pasts) + 64
    print(f"{args.bundle}: {args.threads} threads, spin {args.spin}; median ms per decode step "
          f"({args.turns} turns x {args.steps} steps, alternating)")
    for r in rows:
        for past in pasts:
            runs = [(m, step_runner(b, r, past, capacity)) for m, b in variants]
            times: dict[str, list[float]] = {"off": [], "require": []}
            for _ in range(args.turns):
                for mode, run in runs:
                    times[mode] += timed(run, args.steps)
            stock, native = (statistics.median(times[m]) * 1e3 for m in ("off", "require"))
            print(f"  rows {r} past {past:5d}: GroupQueryAttention {stock:7.2f}  "
                  f"native {native:7.2f}  ({stock / native:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
