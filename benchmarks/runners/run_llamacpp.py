"""llama.cpp runner (CPU, llama-cpp-python), for a GGUF made by export_gguf.py.

Run by compare.py inside the llamacpp venv:  python run_llamacpp.py SPEC.json
The spec's options may set "flash_attn" ("on" or "off"; absent = on, what llama.cpp's own
default "auto" picks on the CPU backend; llama-cpp-python's Llama() alone would turn it off).
Prompts go in as token ids (no tokenizer), decoding is greedy and never stops on EOS.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import llama_cpp
from common import Loaded, log, run_runner

FLASH_ATTN = {"on": True, "off": False}


def context_size(spec: dict[str, Any]) -> int:
    """Room for the longest run (TTFT prompt + 1, or the decode prompt + new tokens)."""
    needed = max(max(spec["lengths"]) + 1, spec["decode_prompt_len"] + spec["new_tokens"])
    return -(-needed // 256) * 256


def load(spec: dict[str, Any]) -> Loaded:
    model_dir = Path(spec["artifact_dir"])
    flash = spec.get("options", {}).get("flash_attn", "on")
    if flash not in FLASH_ATTN:
        raise SystemExit(f"flash_attn must be on or off, not {flash!r}")
    threads = spec["threads"]
    llm = llama_cpp.Llama(
        str(model_dir / "model.gguf"),
        n_ctx=context_size(spec),
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=FLASH_ATTN[flash],
        verbose=False,
    )  # n_batch and n_ubatch stay llama-cpp-python's defaults (512 and 512)

    def generate(prompt_ids: list[int], max_new_tokens: int) -> list[tuple[float, int]]:
        stamps: list[tuple[float, int]] = []
        start = time.perf_counter()
        llm.reset()  # a fresh sequence: nothing of the previous prompt is reused
        # temp=0 is the greedy sampler; generate() itself never stops on EOS.
        for token in llm.generate(prompt_ids, temp=0.0, repeat_penalty=1.0, reset=False):
            stamps.append((time.perf_counter() - start, int(token)))
            if len(stamps) == max_new_tokens:
                break
        return stamps

    export = json.loads((model_dir / "gguf-export.json").read_text())
    system = llama_cpp.llama_print_system_info().decode().strip()
    log(f"{spec['runtime']}: {export['gguf_type']}, {system}")
    extra = {
        "gguf_type": export["gguf_type"],
        "n_ctx": llm.n_ctx(),
        "n_batch": llm.n_batch,
        "n_ubatch": llm.context_params.n_ubatch,
        "flash_attn": flash,
        "llama_cpp_system_info": system,
        "gguf_bytes": (model_dir / "model.gguf").stat().st_size,
    }
    return Loaded(generate, extra=extra)


if __name__ == "__main__":
    run_runner(load, ["llama-cpp-python", "numpy"])
