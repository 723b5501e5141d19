"""TTFT of a request whose prompt shares a system prompt with an earlier one, on a model
whose layers carry a recurrent state (LFM2, Qwen3.5): the KV cache's state snapshots on
against off (off: the slot is reused whole or not at all, as before them), taking turns in
one process, a fresh engine each time.

    python benchmarks/prefix_snapshots.py BUNDLE --system 512 --user 40 --rounds 3

Each turn sends system + user A (max_new_tokens 1), then system + user B, and records both
TTFTs and how many tokens the second reused. Prints the CPU and, per mode, the median
and fastest of each over `--rounds`.
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
    """(first TTFT s, second TTFT s, tokens the second reused)."""
    engine = Engine.load(bundle, threads=threads, background=False)
    if not snapshots:
        engine.kv.max_snapshots = 0  # no snapshot is taken and no chunk cut for one
    got = [engine.submit(p, PARAMS, 0, None).result().metrics for p in prompts]
    engine.close()
    ttft = [m.token_times[0] - m.arrival for m in got]
    return ttft[0], ttft[1], got[1].prefix_reused


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
    prompts = [system + ids(args.user), system + ids(args.user)]
    runs: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for snapshots in (False, True):
            runs[snapshots].append(turn(args.bundle, args.threads, prompts, snapshots))
    print(f"CPU: {cpu_name()}; {args.threads} threads; system {args.system} + user "
          f"{args.user} tokens; {args.rounds} rounds")
    for snapshots, got in runs.items():
        first, second = [r[0] * 1e3 for r in got], [r[1] * 1e3 for r in got]
        print(f"snapshots {'on ' if snapshots else 'off'}: first TTFT median "
              f"{statistics.median(first):.0f} ms (fastest {min(first):.0f}), second "
              f"{statistics.median(second):.0f} ms (fastest {min(second):.0f}), "
              f"reused {got[0][2]}")


if __name__ == "__main__":
    main()
