"""edgeprefill runner, for a bundle made by `edgeprefill export`.

Run by compare.py with the project's own venv (/work/main/.venv):  python run_edgeprefill.py SPEC
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common import Loaded, run_runner
from onnx_weights import weight_bytes_per_token

from edgeprefill import Engine, GenerationParams
from edgeprefill.bundle import load_manifest


def load(spec: dict[str, Any]) -> Loaded:
    # No prefix reuse: every run already gets its own prompt, and with the cache off a
    # lookup can never stand in for the prefill being timed. One KV slot: batch 1.
    engine = Engine.load(
        spec["artifact_dir"], threads=spec["threads"], prefix_reuse=False, kv_slots=1
    )
    chunk_size = spec["options"]["chunk_size"]

    def generate(prompt_ids: list[int], max_new_tokens: int) -> list[tuple[float, int]]:
        stamps = []
        params = GenerationParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        for event in engine.generate(prompt_ids, params, chunk_size=chunk_size):
            stamps.append((time.perf_counter() - start, int(event.token_id)))
        return stamps

    def report() -> dict[str, Any]:
        """Prefix-cache counters: hits would mean some prefill was skipped, not measured."""
        metrics = engine.metrics()
        return {
            "prefix_lookups": getattr(metrics, "prefix_lookups", None),
            "prefix_hits": getattr(metrics, "prefix_hits", None),
        }

    extra = {"chunk_size": chunk_size}
    manifest = load_manifest(spec["artifact_dir"])
    if manifest.graph.quantization:  # fp32 bundles use compare.py's analytic byte count
        model = Path(spec["artifact_dir"]) / manifest.graph.file
        extra["weight_bytes_per_token"] = weight_bytes_per_token(model)
    return Loaded(generate, extra, report)


if __name__ == "__main__":
    run_runner(load, ["edgeprefill", "onnxruntime", "numpy"])
