"""transformers + PyTorch runner: fp32 eager model, greedy loop over a DynamicCache.

Run by compare.py inside the torch venv:  python run_torch.py SPEC.json
"""

from __future__ import annotations

import time
from typing import Any

import torch
from common import Loaded, run_runner
from transformers import AutoModelForCausalLM, DynamicCache


def load(spec: dict[str, Any]) -> Loaded:
    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["artifact_dir"], dtype=torch.float32)
    model.eval()

    def generate(prompt_ids: list[int], max_new_tokens: int) -> list[tuple[float, int]]:
        stamps = []
        start = time.perf_counter()
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            input_ids = torch.tensor([prompt_ids], dtype=torch.long)
            for _ in range(max_new_tokens):
                # logits_to_keep=1: only the last position's logits, as generate() does.
                output = model(
                    input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1
                )
                token = int(output.logits[0, -1].argmax())
                stamps.append((time.perf_counter() - start, token))
                input_ids = torch.tensor([[token]], dtype=torch.long)
        return stamps

    return Loaded(generate, {"torch_threads": torch.get_num_threads()})


if __name__ == "__main__":
    run_runner(load, ["torch", "transformers", "numpy"])
