"""Aggregate decode tokens/s with N sessions decoding together against one session.

Batched decode reads every weight once per step for all rows, so on a bandwidth-bound CPU
N sessions should cost little more than one.

    python benchmarks/batched_decode.py BUNDLE --sessions 1,2,4 --threads 2 --rounds 3

The session counts take turns for `--rounds` rounds (the order reversed every other round),
so that the host's drift reaches every count alike: a ratio of rates measured minutes apart
moved by 10% on the 2-vCPU VMs. Prints the median rate per count, its ratio to the first
count, and each round's ratio with its placement: the core-to-core latency is probed before
and after every count's measurement, and a round is near only where all its probes are. The
last line gives the median ratios over the near rounds alone. On the Zen 4 VM one session
decodes *faster* placed far (its weight streaming gets the two CCDs' bandwidth) while four do
not, so a far round's ratio is lower (docs/benchmarks.md, stop 31).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from probes.core_latency import all_near, core_to_core_ns

from edgeprefill.errors import EdgeprefillError
from edgeprefill.sdk import Engine, GenerationParams


def aggregate_decode_rate(engine: Engine, sessions: int, prompt: int, tokens: int) -> float:
    rng = np.random.default_rng(sessions)
    params = GenerationParams(max_new_tokens=tokens, ignore_eos=True)
    top = min(1000, engine.manifest.model.vocab_size)  # ids past the special tokens
    streams = [engine.generate([int(t) for t in rng.integers(5, top, size=prompt)], params)
               for _ in range(sessions)]
    # Time only the steps where every session decodes: from the last first token to the
    # first finish.
    while not all(s.metrics.generated_tokens for s in streams):
        time.sleep(0.001)
    start = max(s.metrics.token_times[0] for s in streams)
    for s in streams:
        s.result()
    end = min(s.metrics.token_times[-1] for s in streams)
    produced = sum(sum(1 for t in s.metrics.token_times if start < t <= end) for s in streams)
    return produced / (end - start)


def near_ratios(rates: dict[int, list[float]], probes: list[list[float | None]]) -> str:
    """The median ratio of each count to the first over the rounds whose probes were all
    near, or why there is none."""
    counts = list(rates)
    near = [turn for turn, round_probes in enumerate(probes) if all_near(round_probes)]
    if not near:
        return "near placement only: no round with every probe near"
    ratios = ", ".join(
        f"{n}: {statistics.median(rates[n][t] / rates[counts[0]][t] for t in near):.2f}x"
        for n in counts[1:])
    return f"near placement only ({len(near)} of {len(probes)} rounds): {ratios}"


def describe(round_probes: list[float | None]) -> str:
    if all_near(round_probes):
        return "near"
    known = [ns for ns in round_probes if ns is not None]
    return f"far or mixed (core latency up to {max(known):.0f} ns)" if known else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--sessions", default="1,2,4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="turns of every session count")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.sessions.split(",")]
    except ValueError:
        parser.error(f"--sessions wants comma-separated counts, got {args.sessions!r}")
    if min(counts + [args.threads, args.prompt_tokens, args.rounds]) < 1 or args.new_tokens < 2:
        parser.error("session counts, --threads, --prompt-tokens and --rounds must be "
                     "positive, --new-tokens at least 2")
    rates: dict[int, list[float]] = {n: [] for n in counts}
    probes: list[list[float | None]] = []  # per round: before and after every count
    try:
        with Engine.load(args.bundle, threads=args.threads, kv_slots=max(counts),
                         prefix_reuse=False) as engine:
            aggregate_decode_rate(engine, 1, 16, 4)  # warm-up
            for turn in range(args.rounds):
                probes.append([core_to_core_ns()])
                for n in counts if turn % 2 == 0 else counts[::-1]:
                    rates[n].append(
                        aggregate_decode_rate(engine, n, args.prompt_tokens, args.new_tokens))
                    probes[-1].append(core_to_core_ns())
    except EdgeprefillError as error:
        sys.exit(f"batched_decode.py: {error}")
    base = statistics.median(rates[counts[0]])
    print(f"{'sessions':>8} {'aggregate tok/s':>16} {'per session':>12} {f'vs {counts[0]}':>6}"
          f"   (median of {args.rounds} rounds)")
    for n, runs in rates.items():
        rate = statistics.median(runs)
        print(f"{n:>8} {rate:>16.1f} {rate / n:>12.1f} {rate / base:>5.2f}x")
    for turn, round_probes in enumerate(probes):
        ratios = ", ".join(f"{n}: {rates[n][turn] / rates[counts[0]][turn]:.2f}x"
                           for n in counts[1:])
        print(f"round {turn + 1}: {ratios}   {describe(round_probes)}")
    print(near_ratios(rates, probes))


if __name__ == "__main__":
    main()
