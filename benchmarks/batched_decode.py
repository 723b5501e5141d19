"""Aggregate decode tokens/s with N sessions decoding together against one session.

Batched decode reads every weight once per step for all rows, so on a bandwidth-bound CPU
N sessions should cost little more than one.

    python benchmarks/batched_decode.py BUNDLE --sessions 1,2,4 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from probes.core_latency import core_to_core_ns, placement

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--sessions", default="1,2,4")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.sessions.split(",")]
    except ValueError:
        parser.error(f"--sessions wants comma-separated counts, got {args.sessions!r}")
    if min(counts + [args.threads, args.prompt_tokens]) < 1 or args.new_tokens < 2:
        parser.error("session counts, --threads and --prompt-tokens must be positive, "
                     "--new-tokens at least 2")
    try:
        with Engine.load(args.bundle, threads=args.threads, kv_slots=max(counts),
                         prefix_reuse=False) as engine:
            aggregate_decode_rate(engine, 1, 16, 4)  # warm-up
            rates, placements = {}, {}
            for n in counts:
                rates[n] = aggregate_decode_rate(engine, n, args.prompt_tokens, args.new_tokens)
                placements[n] = placement(core_to_core_ns())  # the host's, right after
    except EdgeprefillError as error:
        sys.exit(f"batched_decode.py: {error}")
    base = rates[counts[0]]
    print(f"{'sessions':>8} {'aggregate tok/s':>16} {'per session':>12} {'vs 1':>6}")
    for n, rate in rates.items():
        print(f"{n:>8} {rate:>16.1f} {rate / n:>12.1f} {rate / base:>5.2f}x   {placements[n]}")


if __name__ == "__main__":
    main()
