"""optimum ORTModelForCausalLM runner (CPU), for a model exported by `optimum-cli export onnx`.

Run by compare.py inside the optimum venv (transformers < 4.58):  python run_optimum.py SPEC.json
"""

from __future__ import annotations

import time
from typing import Any

import onnxruntime as ort
import torch
from common import Loaded, run_runner
from optimum.onnxruntime import ORTModelForCausalLM


def check_rope_theta(model: ORTModelForCausalLM, expected: float) -> None:
    """transformers 4.x reads rope_theta from the top level of config.json; a miss would
    silently run a different model (rope_theta 10000) and make the comparison meaningless."""
    actual = getattr(model.config, "rope_theta", None)
    if actual != expected:
        raise RuntimeError(f"config rope_theta is {actual}, expected {expected}")


def load(spec: dict[str, Any]) -> Loaded:
    threads = spec["threads"]
    torch.set_num_threads(threads)
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = threads
    session_options.inter_op_num_threads = 1
    model = ORTModelForCausalLM.from_pretrained(
        spec["artifact_dir"],
        provider="CPUExecutionProvider",
        session_options=session_options,
        use_cache=True,
    )
    check_rope_theta(model, spec["model_config"]["rope_theta"])

    def generate(prompt_ids: list[int], max_new_tokens: int) -> list[tuple[float, int]]:
        stamps = []
        start = time.perf_counter()
        with torch.inference_mode():
            input_ids = torch.tensor([prompt_ids], dtype=torch.long)
            seen = len(prompt_ids)
            past = None
            for _ in range(max_new_tokens):
                attention_mask = torch.ones((1, seen), dtype=torch.long)
                output = model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    past_key_values=past,
                    use_cache=True,
                )
                token = int(output.logits[0, -1].argmax())
                stamps.append((time.perf_counter() - start, token))
                past = output.past_key_values
                input_ids = torch.tensor([[token]], dtype=torch.long)
                seen += 1
        return stamps

    return Loaded(generate, {"use_io_binding": bool(model.use_io_binding)})


if __name__ == "__main__":
    run_runner(load, ["optimum-onnx", "optimum", "onnxruntime", "transformers", "torch"])
