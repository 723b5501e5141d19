"""What a hand-off between the two CPUs costs: one core reading, or overwriting, a buffer the
other core just wrote, against the same on a buffer of its own (handoff.c).

    python benchmarks/probes/handoff.py --sizes 576,2304 --turns 3

A 2-thread prefill hands every op's output to the next op: ONNX Runtime's pool gives each
thread the next free piece, so about half of what a thread reads the other one wrote, and
the arena hands that memory to later outputs, which then overwrite lines the other core
holds. Prints per size (KB; 576 is one 256-token chunk's hidden states in float32, 2304 one
[256, 2304] tensor) the median GB/s of each pattern and other / own, with the core-to-core
latency (core_latency.py) before and after each turn, so that near and far turns can be
told apart. Standard library only; None where the probe cannot run (no compiler, one CPU).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import the sibling probe by its package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from probes.core_latency import build, core_to_core_ns, placement

SOURCE = Path(__file__).with_name("handoff.c")
PATTERNS = ("own-read", "other-read", "own-write", "other-write")


def handoff_gbps(kb: int, rounds: int = 200) -> dict[str, float] | None:
    """GB/s per pattern for a buffer of `kb` KB (median over `rounds`), or None."""
    binary = build(SOURCE, "-O3", "-march=native")
    if binary is None:
        return None
    try:
        done = subprocess.run([str(binary), str(kb), str(rounds)], capture_output=True,
                              text=True, timeout=120)
        rates = dict(field.split("=") for field in done.stdout.split())
        return {name: float(rates[name]) for name in PATTERNS} if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, KeyError):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="576,2304", help="buffer sizes in KB")
    parser.add_argument("--turns", type=int, default=3, help="turns over the sizes")
    parser.add_argument("--rounds", type=int, default=200, help="rounds per measurement")
    args = parser.parse_args()
    try:
        sizes = [int(kb) for kb in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes wants comma-separated KB, got {args.sizes!r}")
    if min(sizes + [args.turns]) < 1 or not 2 <= args.rounds <= 2000:
        parser.error("sizes and --turns must be at least 1, --rounds 2..2000")
    print("GB/s (median of the rounds); other / own: the cost of the hand-off")
    print(f"{'turn':>4} {'KB':>6}" + "".join(f"{p:>13}" for p in PATTERNS)
          + f"{'read o/o':>10}{'write o/o':>10}  placement before / after")
    for turn in range(1, args.turns + 1):
        for kb in sizes:
            before = core_to_core_ns()
            rates = handoff_gbps(kb, args.rounds)
            after = core_to_core_ns()
            if rates is None:
                print("the probe cannot run here (it needs cc and two CPUs)", file=sys.stderr)
                return 1
            ratios = (rates["other-read"] / rates["own-read"],
                      rates["other-write"] / rates["own-write"])
            print(f"{turn:>4} {kb:>6}" + "".join(f"{rates[p]:13.1f}" for p in PATTERNS)
                  + f"{ratios[0]:10.2f}{ratios[1]:10.2f}  {placement(before)} / "
                  + placement(after))
    return 0


if __name__ == "__main__":
    sys.exit(main())
