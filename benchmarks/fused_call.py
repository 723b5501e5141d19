"""One fused call (a prefill chunk beside the decode rows) against the two calls it replaces.

A mixed step is a decode call for the sessions that decode plus a chunk of the prompt that
prefills. Where the backend fuses them (docs/design.md, *Fused steps*) it is one call; this
times the three calls in one process, taking turns, at one past length for every row:

    python benchmarks/fused_call.py BUNDLE --compute bf16 --past 1000 --chunk 61 --rows 3

It calls the backend directly, whatever the scheduler would decide (`fuses_rows`, printed):
for a bundle that does not fuse, the fused figure is what fusing would cost, not what runs.
Prints the medians, the fused call against the sum of the two, the CPU and the placement,
and how far the fused call's logits are from the two calls' (every call rewrites the same
cache positions with the same values, so all three start from the same cache).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from comparison.report import cpu_name
from probes.core_latency import core_to_core_ns, placement

from edgeprefill.engines.base import StepBatch
from edgeprefill.errors import EdgeprefillError
from edgeprefill.sdk import Engine


def calls(backend, rows: int, past: int, chunk: int, seed: int) -> dict[str, Callable[[], object]]:
    """The decode call (slots 0 .. rows - 1), the chunk call (slot `rows`) and the fused one.
    Each writes the same cache positions every time: the timings repeat one step."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(5, 1000, size=chunk)
    last = rng.integers(5, 1000, size=rows)
    fused_ids = np.zeros((rows + 1, chunk), np.int64)
    fused_ids[:rows, 0] = last
    fused_ids[rows] = tokens
    valid = np.ones(rows + 1, np.int32)
    valid[rows] = chunk
    return {
        "decode": lambda: backend.run(StepBatch(last[:, None], np.full(rows, past, np.int32),
                                                np.ones(rows, np.int32), 0)),
        "chunk": lambda: backend.run(StepBatch(tokens[None], np.array([past], np.int32),
                                               np.array([chunk], np.int32), rows)),
        "fused": lambda: backend.run(StepBatch(fused_ids, np.full(rows + 1, past, np.int32),
                                               valid, 0)),
    }


def fill(backend, slots: int, past: int, seed: int) -> None:
    """Every slot's first `past` positions, in chunks of 256."""
    rng = np.random.default_rng(seed)
    for slot in range(slots):
        ids = rng.integers(5, 1000, size=past)
        for at in range(0, past, 256):
            n = min(256, past - at)
            backend.run(StepBatch(ids[None, at:at + n], np.array([at], np.int32),
                                  np.array([n], np.int32), slot))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--compute", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--past", type=int, default=1000, help="every row's cached positions")
    parser.add_argument("--chunk", type=int, default=61, help="the prefill chunk's tokens")
    parser.add_argument("--rows", type=int, default=3, help="decode rows")
    parser.add_argument("--rounds", type=int, default=30, help="turns of the three calls")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if min(args.past, args.chunk - 1, args.rows, args.rounds, args.threads) < 1:
        parser.error("--past, --rows, --rounds and --threads must be positive, --chunk > 1")
    try:
        engine = Engine.load(args.bundle, threads=args.threads, background=False,
                             kv_slots=args.rows + 1, compute=args.compute,
                             max_context=args.past + args.chunk + 1)
        backend = engine.backend
        fill(backend, args.rows + 1, args.past, seed=0)
        runs = calls(backend, args.rows, args.past, args.chunk, seed=1)
        times: dict[str, list[float]] = {name: [] for name in runs}
        logits: dict[str, np.ndarray] = {}
        before = core_to_core_ns()
        for _ in range(args.rounds):
            for name, run in runs.items():
                start = time.perf_counter()
                out = run()
                times[name].append(time.perf_counter() - start)
                logits[name] = np.array(out, copy=True)
        after = core_to_core_ns()
        why = backend.why_not_fused
        engine.close()
    except EdgeprefillError as error:
        sys.exit(f"fused_call.py: {error}")
    median = {name: statistics.median(t) * 1000 for name, t in times.items()}
    separate = median["decode"] + median["chunk"]
    print(f"{cpu_name()}, {args.threads} threads, placement {placement(before)} / "
          f"{placement(after)}; {args.rows} decode rows and a {args.chunk}-token chunk at past "
          f"{args.past}, --compute {args.compute}")
    print(f"fuses here: {'yes' if why is None else f'no ({why})'}")
    apart = np.concatenate([logits["decode"], logits["chunk"]])
    diff = float(np.abs(logits["fused"] - apart).max())
    print("fused logits: " + ("the two calls' bit for bit" if diff == 0.0
                               else f"at most {diff:.3g} from the two calls'"))
    print(f"decode call {median['decode']:.2f} ms + chunk call {median['chunk']:.2f} ms = "
          f"{separate:.2f} ms; fused call {median['fused']:.2f} ms "
          f"({median['fused'] / separate:.3f}x)")


if __name__ == "__main__":
    main()
