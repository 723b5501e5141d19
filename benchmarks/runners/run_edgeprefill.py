"""edgeprefill runner, for a bundle made by `edgeprefill export`.

Run by compare.py with the project's own venv (/work/main/.venv):  python run_edgeprefill.py SPEC
"""

from __future__ import annotations

import time
from typing import Any

from common import Loaded, run_runner
from onnx_weights import weight_bytes_per_token

from edgeprefill import Engine, GenerationParams


def load(spec: dict[str, Any]) -> Loaded:
    # No prefix reuse: every run already gets its own prompt, and with the cache off a
    # lookup can never stand in for the prefill being timed. One KV slot: batch 1.
    # The "spin" option "off" (registry: the *-no-spin rows) makes compute threads sleep
    # between ops; the other rows run edgeprefill's default (spin while a step runs).
    # The "compute" option "bf16" (registry: edgeprefill-bf16) runs the projections in bf16.
    engine = Engine.load(
        spec["artifact_dir"], threads=spec["threads"], prefix_reuse=False, kv_slots=1,
        spin=spec["options"].get("spin") != "off",
        compute=spec["options"].get("compute", "fp32"),
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
        """Prefix-cache counters (hits would mean some prefill was skipped, not measured)
        and, for a quantized bundle, the weight bytes a decode step reads (fp32 bundles use
        compare.py's analytic byte count)."""
        metrics = engine.metrics()
        facts = {
            "prefix_lookups": getattr(metrics, "prefix_lookups", None),
            "prefix_hits": getattr(metrics, "prefix_hits", None),
        }
        if engine.manifest.graph.quantization:
            graph = engine.bundle_dir / engine.manifest.graph.file
            facts["weight_bytes_per_token"] = weight_bytes_per_token(graph)
        return facts

    return Loaded(generate, {"chunk_size": chunk_size}, report)


if __name__ == "__main__":
    run_runner(load, ["edgeprefill", "onnxruntime", "numpy"])
