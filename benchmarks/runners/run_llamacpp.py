"""llama.cpp runner (CPU, llama-cpp-python), for a GGUF made by export_gguf.py.

Run by compare.py inside the llamacpp venv:  python run_llamacpp.py SPEC.json
The spec's options may set "flash_attn" ("on" or "off"; absent = on, what llama.cpp's own
default "auto" picks on the CPU backend; llama-cpp-python's Llama() alone would turn it off)
and "kv_type" ("f16" or "f32"; absent = f16, llama.cpp's default KV cache type). On the CPU
backend flash attention computes in f16 whatever the KV type: an F32 GGUF then drifts from
transformers' greedy tokens after a few decode steps; flash off with an f32 cache does not.
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
KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}


def context_size(spec: dict[str, Any]) -> int:
    """Room for the longest run (TTFT prompt + 1, or the decode prompt + new tokens)."""
    needed = max(max(spec["lengths"]) + 1, spec["decode_prompt_len"] + spec["new_tokens"])
    return -(-needed // 256) * 256


def load(spec: dict[str, Any]) -> Loaded:
    model_dir = Path(spec["artifact_dir"])
    options = spec.get("options", {})
    flash, kv_type = options.get("flash_attn", "on"), options.get("kv_type", "f16")
    if flash not in FLASH_ATTN or kv_type not in KV_TYPES:
        raise SystemExit(f"flash_attn must be on or off ({flash!r}), kv_type f16 or f32 "
                         f"({kv_type!r})")
    threads = spec["threads"]
    llm = llama_cpp.Llama(
        str(model_dir / "model.gguf"),
        n_ctx=context_size(spec),
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=FLASH_ATTN[flash],
        type_k=KV_TYPES[kv_type],
        type_v=KV_TYPES[kv_type],
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
        "kv_type": kv_type,
        "llama_cpp_system_info": system,
        "gguf_bytes": (model_dir / "model.gguf").stat().st_size,
    }
    return Loaded(generate, extra=extra)


if __name__ == "__main__":
    run_runner(load, ["llama-cpp-python", "numpy"])
