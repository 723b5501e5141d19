"""Core-to-core latency of the machine right now, for benchmarks to print beside their
timings (standard library only, like compare.py).

The 2-vCPU VMs this project is measured on move between two placements on their host:
both vCPUs close (one-way latency ~40 ns) or on different CCDs (~175 ns), minutes at a
time. In the far placement edgeprefill's 2-thread prefill chunks run 25-80% slower while a
1-thread engine is not slower: what costs is the threads handing work and data to each
other across the host's fabric, not either core (placement.py, docs/benchmarks.md).
`core_to_core_ns()` builds core_latency.c once per process with the C compiler (cc), runs
it (~0.1 s) and returns the median one-way latency in ns, or None where it cannot run (no
compiler, one CPU).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("core_latency.c")
FAR_NS = 100.0  # above this the two CPUs are far apart (another CCD or socket)


@functools.cache
def build(source: Path, *flags: str) -> Path | None:
    """`source` compiled with `cc` once per process (into a folder removed at exit), or None
    without a compiler or a second CPU, or where it does not build (handoff.py too)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or len(os.sched_getaffinity(0)) < 2:
        return None
    folder = tempfile.mkdtemp(prefix="edgeprefill-probe-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    out = Path(folder) / source.stem
    built = subprocess.run([compiler, *flags, "-pthread", str(source), "-o", str(out)],
                           capture_output=True, text=True)
    return out if built.returncode == 0 else None


def core_to_core_ns(rounds: int = 5) -> float | None:
    binary = build(SOURCE, "-O2")
    if binary is None:
        return None
    try:  # a probe that cannot finish must not end the benchmark that asked
        done = subprocess.run([str(binary), str(rounds)], capture_output=True, text=True,
                              timeout=30)
        return float(done.stdout.strip()) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


def placement(ns: float | None) -> str:
    if ns is None:
        return "core latency n/a"
    return f"core latency {ns:.0f} ns ({'far' if ns > FAR_NS else 'near'})"


def all_near(probes: list[float | None]) -> bool:
    """Whether a run's probes (before and after it) all said near; no probe, or one that
    could not run, is not near."""
    return bool(probes) and all(ns is not None and ns <= FAR_NS for ns in probes)
