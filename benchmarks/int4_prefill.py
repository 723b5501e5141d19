"""int4 prefill variants side by side (engines/ort/int4_prefill.py), with int8 as reference.

    python benchmarks/int4_prefill.py INT4_BUNDLE [--int8 INT8_BUNDLE] --rounds 5

Loads the int4 bundle once per `EDGEPREFILL_INT4_PREFILL` variant of `--variants` (off,
level0 and int8 by default; decode too) in this one process, plus the int8 bundle twice
(its DynamicQuantizeMatMul and the MatMulInt8 it gets where the native kernels run on
VNNI), and times, taking turns round by round: one 2,048-token prefill in 256-token
chunks, one 256-token chunk at past 0 and at past 1,792, and 16 decode steps at past 1,800
(`--cells` picks). Prints the median per cell (ms) and each session's resident-memory
growth at load (MB).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend

DECODE_STEPS = 16
PROMPT = 2048
# name: (chunk, past); past -1 is a whole PROMPT-token prefill in chunks of that size.
CELLS = {"prefill2048/256": (256, -1), "chunk256@0": (256, 0), "chunk256@1792": (256, 1792),
         "decode@1800": (1, 1800)}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def load(bundle: Path, variant: str | None, threads: int) -> tuple[OnnxRuntimeBackend, float]:
    if variant is not None:
        os.environ["EDGEPREFILL_INT4_PREFILL"] = variant
    before = rss_mb()
    backend = OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(threads=threads))
    backend.allocate_kv(1, 2304)
    step(backend, 256, 0)  # first run: prepacking and allocations
    return backend, rss_mb() - before


def step(backend: OnnxRuntimeBackend, chunk: int, past: int) -> float:
    """ms per call: one call for a chunk, the mean of DECODE_STEPS calls for decode;
    past -1: a whole PROMPT-token prefill in `chunk`-token chunks (TTFT less sampling)."""
    if past < 0:
        return sum(step(backend, chunk, at) for at in range(0, PROMPT, chunk))
    ids = np.random.default_rng(past).integers(3, 40000, (1, chunk))
    batch = StepBatch(ids, np.array([past], np.int32), np.array([chunk], np.int32), 0)
    calls = DECODE_STEPS if chunk == 1 else 1
    start = time.perf_counter()
    for _ in range(calls):
        backend.run(batch)
    return (time.perf_counter() - start) * 1000 / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("int4", type=Path)
    parser.add_argument("--int8", type=Path)
    parser.add_argument("--variants", default="off,level0,int8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cells", default=",".join(CELLS), help="which of: " + ", ".join(CELLS))
    args = parser.parse_args()
    cells = {name: CELLS[name] for name in args.cells.split(",")}
    rows: dict[str, tuple[OnnxRuntimeBackend, float]] = {}
    for variant in args.variants.split(","):
        rows[f"int4 {variant}"] = load(args.int4, variant, args.threads)
    if args.int8:  # its stock DynamicQuantizeMatMul, then MatMulInt8 (engines/ort/int8_rows.py)
        os.environ["EDGEPREFILL_INT8_ROWS"] = "off"
        rows["int8 bundle, DynamicQuantizeMatMul"] = load(args.int8, None, args.threads)
        del os.environ["EDGEPREFILL_INT8_ROWS"]  # auto: MatMulInt8 where it runs
        rows["int8 bundle, MatMulInt8 rows"] = load(args.int8, None, args.threads)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, (backend, _mb) in rows.items():
            for cell, (chunk, past) in cells.items():
                times.setdefault((name, cell), []).append(step(backend, chunk, past))
    print(f"| session | {' | '.join(cells)} (ms) | RSS at load (MB) | prefill projections |")
    print("|---|" + "---|" * (len(cells) + 2))
    for name, (backend, mb) in rows.items():
        medians = " | ".join(f"{statistics.median(times[name, c]):.1f}" for c in cells)
        print(f"| {name} | {medians} | {mb:.0f} | {backend.int4_prefill.projections or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
