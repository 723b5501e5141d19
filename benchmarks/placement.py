"""How much a prefill chunk slows when the host places the two vCPUs far apart.

    python benchmarks/placement.py BUNDLE --chunks 64,128 --rounds 150
    python benchmarks/placement.py BUNDLE --compute bf16 --threads 1,2

The 2-vCPU VMs this project is measured on move, minutes at a time, between two host
placements: both vCPUs close (core-to-core latency ~40 ns) or on different CCDs (~180 ns,
probes/core_latency.py). Benchmarks that run one process per setting cannot tell a change
that helps in one placement from a run that happened to land in it. This one loads one
engine per `--threads` value in one process and takes turns: each round runs, per engine
and per chunk size, `--calls` chunk calls (a prompt's first chunk, random tokens) and
keeps their median, with the core-to-core latency probed before and after. A measurement
counts as near or far where both probes agree, and is dropped where the placement flipped
during it.

The table gives per thread count and chunk the near and far medians, far / near, and the
speed-up over the first thread count in each placement. On the Zen 4 VM (docs/benchmarks.md)
one thread ran as fast far as near, while two threads far barely beat one: the cost is in
how the threads hand work and data to each other across the fabric, not in either core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from comparison.report import machine_info
from probes.core_latency import FAR_NS, all_near, core_to_core_ns

from edgeprefill.engines import StepBatch
from edgeprefill.engines.base import COMPUTES
from edgeprefill.errors import EdgeprefillError
from edgeprefill.sdk import Engine


def classify(before: float | None, after: float | None) -> str | None:
    """near or far where both probes agree; None where one failed or the placement flipped."""
    if all_near([before, after]):
        return "near"
    if before is None or after is None:
        return None
    if before > FAR_NS and after > FAR_NS:
        return "far"
    return None


def table(times: dict[tuple[int, int, str], list[float]], threads: list[int],
          chunks: list[int]) -> list[str]:
    """Markdown rows from {(threads, chunk, placement): [median ms per measurement]}."""
    def median(key: tuple[int, int, str]) -> float | None:
        values = times.get(key)
        return statistics.median(values) if values else None

    def ms(value: float | None, count: int) -> str:
        return "-" if value is None else f"{value:.1f} ms (n={count})"

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None else f"{a / b:.2f}x"

    lines = ["| threads | chunk | near | far | far / near | speed-up near | speed-up far |",
             "|---|---|---|---|---|---|---|"]
    base = threads[0]
    for chunk in chunks:
        for t in threads:
            near, far = median((t, chunk, "near")), median((t, chunk, "far"))
            lines.append(
                f"| {t} | {chunk} | {ms(near, len(times.get((t, chunk, 'near'), [])))} | "
                f"{ms(far, len(times.get((t, chunk, 'far'), [])))} | {ratio(far, near)} | "
                f"{ratio(median((base, chunk, 'near')), near)} | "
                f"{ratio(median((base, chunk, 'far')), far)} |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--chunks", default="64,128", help="chunk sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--calls", type=int, default=3, help="chunk calls per measurement")
    parser.add_argument("--compute", choices=COMPUTES, default="fp32")
    args = parser.parse_args(argv)
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
        args.chunks = [int(c) for c in args.chunks.split(",")]
    except ValueError:
        parser.error("--threads and --chunks take comma-separated integers")
    if min(args.threads) < 1 or min(args.chunks) < 1 or args.rounds < 1 or args.calls < 1:
        parser.error("--threads, --chunks, --rounds and --calls must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if core_to_core_ns(1) is None:
        print("placement.py: the core-latency probe cannot run here (no C compiler, or one "
              "CPU)", file=sys.stderr)
        return 1
    try:
        engines = {t: Engine.load(args.bundle, threads=t, background=False, kv_slots=1,
                                  compute=args.compute) for t in args.threads}
    except EdgeprefillError as err:
        print(f"placement.py: {err}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    vocab = engines[args.threads[0]].manifest.model.vocab_size

    def call(engine: Engine, chunk: int) -> float:
        ids = rng.integers(3, vocab, (1, chunk)).astype(np.int64)
        batch = StepBatch(ids, np.zeros(1, np.int32), np.array([chunk], np.int32), 0)
        start = time.perf_counter()
        engine.backend.run(batch)
        return time.perf_counter() - start

    for engine in engines.values():  # warm-up: first calls allocate and plan
        for chunk in args.chunks:
            call(engine, chunk)
    times: dict[tuple[int, int, str], list[float]] = {}
    for done in range(args.rounds):
        for t, engine in engines.items():
            for chunk in args.chunks:
                before = core_to_core_ns(3)
                median = statistics.median(call(engine, chunk) for _ in range(args.calls))
                where = classify(before, core_to_core_ns(3))
                if where:
                    times.setdefault((t, chunk, where), []).append(median * 1e3)
        if (done + 1) % 25 == 0:
            print(f"  {done + 1}/{args.rounds} rounds", file=sys.stderr, flush=True)
    for engine in engines.values():
        engine.close()
    machine = machine_info(Path(sys.executable))
    print(f"placement: {args.bundle.name}, --compute {args.compute}, {args.rounds} rounds of "
          f"{args.calls} calls; machine: {machine['cpu']}, {machine['cpus']} CPUs")
    print("\n".join(table(times, args.threads, args.chunks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
