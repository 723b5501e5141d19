"""ONNX Runtime GenAI runner (CPU), for a model made by onnxruntime_genai.models.builder.

Run by compare.py inside the ortgenai venv:  python run_ortgenai.py SPEC.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og
from common import Loaded, run_runner
from onnx_weights import weight_bytes_per_token


def set_threads(model_dir: Path, threads: int) -> None:
    """Without intra_op_num_threads in genai_config.json the session runs single-threaded."""
    config_path = model_dir / "genai_config.json"
    config = json.loads(config_path.read_text())
    session_options = config["model"]["decoder"].setdefault("session_options", {})
    session_options["intra_op_num_threads"] = threads
    session_options["inter_op_num_threads"] = 1
    config_path.write_text(json.dumps(config, indent=4) + "\n")


def load(spec: dict[str, Any]) -> Loaded:
    model_dir = Path(spec["artifact_dir"])
    set_threads(model_dir, spec["threads"])
    model = og.Model(str(model_dir))

    def generate(prompt_ids: list[int], max_new_tokens: int) -> list[tuple[float, int]]:
        stamps = []
        start = time.perf_counter()
        params = og.GeneratorParams(model)
        # min_length == max_length: never stop on EOS. max_length also sizes the KV buffers.
        total = len(prompt_ids) + max_new_tokens
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray(prompt_ids, dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            stamps.append((time.perf_counter() - start, token))
        return stamps

    def report() -> dict[str, Any]:
        return {"weight_bytes_per_token": weight_bytes_per_token(model_dir / "model.onnx")}

    return Loaded(generate, report=report)


if __name__ == "__main__":
    run_runner(load, ["onnxruntime-genai", "onnxruntime", "numpy"])
