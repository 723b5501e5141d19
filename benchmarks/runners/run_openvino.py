"""OpenVINO GenAI runner (CPU), for a model made by `optimum-cli export openvino`.

Run by compare.py inside the openvino venv:  python run_openvino.py SPEC.json
The spec's options may set "precision_hint" (OpenVINO's INFERENCE_PRECISION_HINT: "f32";
absent = the plugin's default, bf16 on CPUs with AVX512-BF16 or AMX).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino_genai as ov_genai
from common import Loaded, run_runner


class Stamps(ov_genai.StreamerBase):
    """Records the time each generated token becomes known."""

    def __init__(self, start: float) -> None:
        super().__init__()
        self.start, self.stamps = start, []

    def write(self, token):
        for t in token if isinstance(token, list) else [token]:
            self.stamps.append((time.perf_counter() - self.start, int(t)))
        return ov_genai.StreamingStatus.RUNNING

    def end(self) -> None:
        pass


def load(spec: dict[str, Any]) -> Loaded:
    model_dir = Path(spec["artifact_dir"])
    config = {"INFERENCE_NUM_THREADS": spec["threads"]}
    hint = spec.get("options", {}).get("precision_hint")
    if hint:
        config["INFERENCE_PRECISION_HINT"] = hint
    pipe = ov_genai.LLMPipeline(str(model_dir), "CPU", **config)

    def generate(prompt_ids: list[int], max_new_tokens: int) -> list[tuple[float, int]]:
        gen = ov_genai.GenerationConfig()
        gen.max_new_tokens = gen.min_new_tokens = max_new_tokens  # never stop on EOS
        gen.do_sample = False
        ids = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))
        mask = ov.Tensor(np.ones((1, len(prompt_ids)), dtype=np.int64))
        streamer = Stamps(time.perf_counter())
        pipe.generate(ov_genai.TokenizedInputs(ids, mask), gen, streamer)
        return streamer.stamps

    return Loaded(generate, extra={"precision_hint": hint or "plugin default"})


if __name__ == "__main__":
    run_runner(load, ["openvino-genai", "openvino", "optimum-intel", "numpy"])
