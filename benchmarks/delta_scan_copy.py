"""A Qwen3.5 bundle's DeltaNet `Scan` on stock ONNX Runtime (what runs where the native
kernels do not: Arm, or EDGEPREFILL_KERNELS=off): its body as exported since stop 40 (the
new state written to the body's output by the Add) against the body before (the same Add,
then an Identity copying S to the output each token), taking turns in one process.

    python benchmarks/delta_scan_copy.py BUNDLE --rounds 5

Prints the CPU, whether the two give the same bits, and the median ms per call of each for
a 256-token chunk and a decode step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from comparison.report import cpu_name
from gated_delta import feeds, scan_alone, session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from tests.test_gated_delta_kernel import with_copy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}; {args.threads} threads; median of {args.rounds} rounds")
    for chunk, calls in ((256, 3), (1, 200)):
        new = scan_alone(args.bundle)
        old = scan_alone(args.bundle)
        with_copy(old.graph.node[0], "S_out")
        inputs = feeds(new, chunk)
        sides = {"with the copy (before)": session(old, args.threads, None),
                 "without (now)": session(new, args.threads, None)}
        outs = [s.run(None, inputs) for s in sides.values()]
        same = all((a == b).all() for a, b in zip(*outs, strict=True))
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, s in sides.items():
                start = time.perf_counter()
                for _ in range(calls):
                    s.run(None, inputs)
                times[name].append((time.perf_counter() - start) / calls * 1e3)
        ms = {name: statistics.median(t) for name, t in times.items()}
        said = ", ".join(f"{name} {value:.3f} ms" for name, value in ms.items())
        print(f"chunk {chunk:>3}: same bits {same}; {said}; now / before "
              f"{ms['without (now)'] / ms['with the copy (before)']:.2f}")


if __name__ == "__main__":
    main()
