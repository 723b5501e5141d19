"""Where a decode step's time goes, per operator type, for one row and for several.

    python benchmarks/decode_profile.py BUNDLE --past 160 --rows 1,4 --steps 50
    python benchmarks/decode_profile.py BUNDLE-int4 --compute bf16

Bare decode steps (`Backend.run`, no engine around it) of `--rows` rows each at `--past`
cached positions (a finite random history), the row counts taking turns twice in one
process under ONNX Runtime's profiler. Prints each turn's median step time and the
milliseconds per step of each operator type, largest first: what a batched step adds over
one row (docs/benchmarks.md, stop 47). The profiler adds its own time to every node, so
the step times here run above bare ones; compare the columns with each other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from prefill_profile import ProfiledBackend, op_seconds

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.base import COMPUTES
from edgeprefill.errors import EdgeprefillError

TURNS = 2  # each row count twice, alternating


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--past", type=int, default=160, help="cached positions per row")
    parser.add_argument("--rows", default="1,4", help="row counts, comma-separated")
    parser.add_argument("--steps", type=int, default=50, help="profiled steps per turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute", default="fp32", choices=COMPUTES)
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows wants comma-separated counts, got {args.rows!r}")
    if min(counts + [args.steps, args.threads, args.past + 1]) < 1:
        parser.error("--rows, --steps and --threads must be positive, --past at least 0")
    try:
        profile(args, counts)
    except EdgeprefillError as error:
        sys.exit(f"decode_profile.py: {error}")
    return 0


def profile(args: argparse.Namespace, counts: list[int]) -> None:
    manifest = load_manifest(args.bundle)
    ProfiledBackend.profile = True
    backend = ProfiledBackend(args.bundle, manifest,
                              BackendOptions(threads=args.threads, compute=args.compute))
    backend.allocate_kv(max(counts), args.past + 1)
    rng = np.random.default_rng(0)
    for arena in backend.kv_arrays():  # a finite, varied history
        arena[...] = rng.standard_normal(arena.shape[1:]).astype(arena.dtype)
    top = min(1000, manifest.model.vocab_size)
    turns = [n for _ in range(TURNS) for n in counts]
    medians = []
    for rows in turns:
        batch = StepBatch(rng.integers(3, top, (rows, 1)), np.full(rows, args.past, np.int32),
                          np.ones(rows, np.int32), 0)
        backend.run(batch)  # its node events are in the turn's share: steps + 1 runs
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            backend.run(batch)
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times) * 1e3)
    path = Path(backend.session.end_profiling())
    events = json.loads(path.read_text())
    path.unlink()
    per_turn = split_turns(events, len(turns))
    print(f"{args.bundle} (compute {args.compute}, {args.threads} threads), past {args.past}: "
          f"ms per step, each turn {args.steps} steps")
    print(f"{'':<34}" + "".join(f"{f'{n} row' + 's' * (n > 1):>11}" for n in turns))
    print(f"{'step (median, profiled)':<34}" + "".join(f"{m:11.3f}" for m in medians))
    runs = args.steps + 1
    for op in sorted(per_turn[0], key=lambda o: -max(t.get(o, 0.0) for t in per_turn))[:12]:
        print(f"{op:<34}" + "".join(f"{t.get(op, 0.0) * 1e3 / runs:11.3f}" for t in per_turn))
    print(f"{'all nodes':<34}" + "".join(f"{sum(t.values()) * 1e3 / runs:11.3f}"
                                         for t in per_turn))


def split_turns(events: list[dict], turns: int) -> list[dict[str, float]]:
    """Seconds per operator type of each turn: the node events in time order, cut into
    equal parts (every step of every turn runs the same nodes)."""
    nodes = sorted((e for e in events if e.get("cat") == "Node"), key=lambda e: e["ts"])
    size = len(nodes) // turns
    return [op_seconds(nodes[i * size:(i + 1) * size]) for i in range(turns)]


if __name__ == "__main__":
    raise SystemExit(main())
