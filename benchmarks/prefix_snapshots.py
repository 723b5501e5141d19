"""TTFT of a request whose prompt shares a system prompt with an earlier one, on a model
whose layers carry a recurrent state (LFM2, Qwen3.5): the KV cache's state snapshots on
against off (off: the slot is reused whole or not at all, as before them), taking turns in
one process, a fresh engine each time.

    python benchmarks/prefix_snapshots.py BUNDLE --system 512 --user 40 --rounds 3

Each turn sends system + user A (max_new_tokens 1), then system + user B, then system +
user C, and records their TTFTs and how many tokens each reused. Prints the CPU and, per
mode, the median and fastest TTFT of each request over `--rounds`.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
from comparison.report import cpu_name

from edgeprefill.sdk import Engine, GenerationParams

PARAMS = GenerationParams(max_new_tokens=1, ignore_eos=True)


def turn(bundle: Path, threads: int, prompts: list[list[int]], snapshots: bool):
    """([TTFT s of each prompt], [tokens each reused])."""
    engine = Engine.load(bundle, threads=threads, background=False)
    if not snapshots:
        engine.kv.max_snapshots = 0  # no snapshot is taken and no chunk cut for one
    got = [engine.submit(p, PARAMS, 0, None).result().metrics for p in prompts]
    engine.close()
    return [m.token_times[0] - m.arrival for m in got], [m.prefix_reused for m in got]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--system", type=int, default=512, help="shared prompt tokens")
    parser.add_argument("--user", type=int, default=40, help="tokens after it, each request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    vocab = Engine.load(args.bundle, threads=1, background=False, warm_up=False)
    size = vocab.manifest.model.vocab_size
    vocab.close()
    rng = np.random.default_rng(0)

    def ids(n: int) -> list[int]:
        return [int(t) for t in rng.integers(3, size, n)]

    system = [1, *ids(args.system - 1)]
    prompts = [system + ids(args.user) for _ in range(3)]
    runs: dict[bool, list[tuple[list[float], list[int]]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for snapshots in (False, True):
            runs[snapshots].append(turn(args.bundle, args.threads, prompts, snapshots))
    print(f"CPU: {cpu_name()}; {args.threads} threads; system {args.system} + user "
          f"{args.user} tokens; {args.rounds} rounds")
    for snapshots, got in runs.items():
        times = [[ttft[i] * 1e3 for ttft, _ in got] for i in range(len(prompts))]
        said = ", ".join(f"{statistics.median(t):.0f} ms (fastest {min(t):.0f})"
                         for t in times)
        print(f"snapshots {'on ' if snapshots else 'off'}: TTFT median of each request "
              f"{said}; reused {got[0][1]}")


if __name__ == "__main__":
    main()
