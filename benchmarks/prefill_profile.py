"""Where a long prefill's time goes, per operator type, from ONNX Runtime's profiler.

    python benchmarks/prefill_profile.py BUNDLE [BUNDLE ...] --prompt 2048 --chunk 256

Runs one `--prompt`-token prefill in `--chunk`-token chunks on each bundle (one warm-up
first, then one profiled run) and prints, per bundle, the wall time of the profiled run
and the share of kernel time per operator type, largest first. Shares hold up under a
loaded machine better than absolute times do.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.engines.base import COMPUTES
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.errors import EdgeprefillError

# Their kernel time contains their subgraphs' nodes, which are profiled on their own too.
CONTROL_FLOW = {"If", "Loop", "Scan"}


class ProfiledBackend(OnnxRuntimeBackend):
    profile = False

    def _session_options(self):
        so = super()._session_options()
        so.enable_profiling = self.profile
        return so


def prefill(backend: OnnxRuntimeBackend, ids: np.ndarray, chunk: int) -> float:
    start = time.perf_counter()
    for at in range(0, len(ids), chunk):
        piece = ids[at : at + chunk]
        padded = np.zeros((1, chunk), np.int64)
        padded[0, : len(piece)] = piece
        backend.run(StepBatch(padded, np.array([at], np.int32),
                              np.array([len(piece)], np.int32), 0))
    return time.perf_counter() - start


def op_shares(profile: Path) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for event in json.loads(profile.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            if op not in CONTROL_FLOW:
                totals[op] += event["dur"]
    whole = sum(totals.values()) or 1.0
    return {op: t / whole for op, t in sorted(totals.items(), key=lambda kv: -kv[1])}


def profile_bundle(bundle: Path, prompt: int, chunk: int, threads: int,
                   compute: str = "fp32") -> None:
    manifest = load_manifest(bundle)
    ProfiledBackend.profile = True
    backend = ProfiledBackend(bundle, manifest, BackendOptions(threads=threads, compute=compute))
    backend.allocate_kv(1, -(-prompt // chunk) * chunk)
    ids = np.random.default_rng(0).integers(3, manifest.model.vocab_size, prompt)
    prefill(backend, ids, chunk)  # warm-up (profiled too: the file is cut below)
    seconds = prefill(backend, ids, chunk)
    path = Path(backend.session.end_profiling())
    events = json.loads(path.read_text())
    half = [e for e in events if e.get("cat") == "Node"]
    half = half[len(half) // 2 :]  # the second (timed) run only
    path.write_text(json.dumps(half))
    shares = op_shares(path)
    path.unlink()
    kind = manifest.graph.quantization or manifest.graph.dtype
    print(f"{bundle} ({kind}): {prompt} tokens in {chunk}-token chunks, {seconds:.2f} s")
    for op, share in list(shares.items())[:8]:
        print(f"  {op:<36}{share:6.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute", choices=COMPUTES, default="fp32",
                        help="a float32 bundle's projections in fp32 or bf16 (--compute)")
    args = parser.parse_args()
    try:
        for bundle in args.bundles:
            profile_bundle(bundle, args.prompt, args.chunk, args.threads, args.compute)
    except EdgeprefillError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
