"""Decode-step time of a stateful bundle on ONNX Runtime's CUDA provider, from the
edgeprefill tree `--tree` (default: this checkout), to compare two trees taking turns.

    git archive c9ba8d8 edgeprefill | tar x -C /tmp/old            # a tree to compare with
    python benchmarks/gpu_states.py --work /tmp/q35 --tree /tmp/old --label old
    python benchmarks/gpu_states.py --work /tmp/q35 --label new     # and again, in turns

Builds once in `--work` (with this checkout's code) a Qwen3.5-0.8B-shaped text model with
random weights (24 layers, 18 of them Gated DeltaNet, hidden 1024; the vocabulary cut to
32,768) and exports it as an `ort` fp16 bundle; then allocates 4 slots of 512 positions,
prefills 64 tokens into each, and prints one JSON line: the median of `--steps` (50) decode
steps after 10, for 1 row and for 4 rows, and which state arena the tree used. Needs torch
and transformers (to build the model) and onnxruntime-gpu.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["linear_attention"] * 3 + ["full_attention"]


def build(work: Path) -> Path:
    """The bundle (built once, by this checkout)."""
    bundle = work / "bundle"
    if (bundle / "edgeprefill.json").exists():
        return bundle
    sys.path.insert(0, str(ROOT))
    from edgeprefill.export.exporter import ExportOptions, export
    from tests.conftest import build_hf_model

    hf = build_hf_model("qwen3_5_text", work / "hf", hidden_size=1024,
                        intermediate_size=3584, num_hidden_layers=24, layer_types=LAYERS * 6,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                        linear_num_key_heads=16, linear_num_value_heads=16,
                        linear_key_head_dim=128, linear_value_head_dim=128,
                        vocab_size=32768, initializer_range=0.02)
    export(hf, bundle, ExportOptions(flavor="ort", dtype="fp16", chunks=(64,),
                                     max_context=512, show_progress=False))
    return bundle


def measure(bundle: Path, device: str, steps: int) -> dict[str, object]:
    import numpy as np

    import edgeprefill
    from edgeprefill.bundle import load_manifest
    from edgeprefill.engines import BackendOptions, StepBatch
    from edgeprefill.engines.ort.backend import OnnxRuntimeBackend

    backend = OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(device=device))
    backend.allocate_kv(slots=4, capacity=512)
    rng = np.random.default_rng(0)
    vocab = backend.manifest.model.vocab_size
    past = np.zeros(4, np.int32)
    for slot in range(4):
        backend.run(StepBatch(rng.integers(3, vocab, (1, 64)), past[slot:slot + 1],
                              np.array([64], np.int32), slot))
        past[slot] = 64
    out: dict[str, object] = {"package": str(Path(edgeprefill.__file__).parent),
                              "state": type(backend.state).__name__}
    for rows in (1, 4):
        times = []
        for _ in range(steps + 10):
            step = StepBatch(rng.integers(3, vocab, (rows, 1)), past[:rows].copy(),
                             np.ones(rows, np.int32), 0)
            start = time.perf_counter()
            logits = backend.run(step)
            times.append(time.perf_counter() - start)
            past[:rows] += 1
        out[f"decode_{rows}_ms"] = round(statistics.median(times[10:]) * 1e3, 3)
    out["finite"] = bool(np.isfinite(logits).all())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="model and bundle here")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the edgeprefill tree timed")
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=50, help="decode steps timed per row count")
    args = parser.parse_args()
    bundle = build(args.work)
    # the timed tree's package, not the one that built the bundle
    for name in [m for m in sys.modules if m == "edgeprefill" or m.startswith("edgeprefill.")]:
        del sys.modules[name]
    sys.path.insert(0, str(args.tree.resolve()))
    print(json.dumps({"tree": args.label, **measure(bundle, args.device, args.steps)}))


if __name__ == "__main__":
    main()
