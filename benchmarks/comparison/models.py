"""The benchmark checkpoint (random weights of a fixed shape) and the prompt ids."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comparison.procs import last_json_line, run_step
from comparison.settings import (
    MODEL_FORMAT,
    QUICK_SHAPE,
    RUNNERS_DIR,
    SMOLLM2_135M_SHAPE,
    Settings,
    say,
)
from comparison.venvs import ensure_venv


@dataclass(frozen=True)
class ModelInfo:
    name: str
    hf_dir: Path
    config: dict[str, Any]
    params: int
    embedding_params: int


def model_name(settings: Settings, config: dict[str, Any]) -> str:
    """Directory name: readable prefix plus a hash of everything that determines the weights."""
    key = {"config": config, "seed": settings.seed, "format": MODEL_FORMAT}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    prefix = "quick" if settings.quick else "smollm2-135m-shape"
    return f"{prefix}-seed{settings.seed}-{digest}"


def build_model(settings: Settings) -> ModelInfo:
    config = QUICK_SHAPE if settings.quick else SMOLLM2_135M_SHAPE
    name = model_name(settings, config)
    model_dir = settings.work_dir / "models" / name
    hf_dir = model_dir / "hf"
    info_path = model_dir / "build.json"
    if not info_path.exists():
        say(f"  building {hf_dir} (random fp32 weights, seed {settings.seed})")
        python = ensure_venv("torch", settings)
        shutil.rmtree(hf_dir, ignore_errors=True)
        model_dir.mkdir(parents=True, exist_ok=True)
        spec_path = model_dir / "build-spec.json"
        spec = {"out_dir": str(hf_dir), "seed": settings.seed, "config": config}
        spec_path.write_text(json.dumps(spec, indent=2))
        cmd = [str(python), str(RUNNERS_DIR / "build_model.py"), str(spec_path)]
        output = run_step(cmd, model_dir / "build.log", python, settings)
        info_path.write_text(json.dumps(last_json_line(output), indent=2))
    built = json.loads(info_path.read_text())
    return ModelInfo(name, hf_dir, config, built["params"], built["embedding_params"])


def prompt_sets(settings: Settings, vocab_size: int) -> dict[str, Any]:
    """Fixed-seed random ids above the special tokens (0-2), the same for every runtime.

    Each run, warm-up included, gets its own independent prompt: a runtime with a prefix
    cache must not be able to reuse the KV of an earlier run."""
    rng = random.Random(settings.seed)

    def prompts(length: int, count: int) -> list[list[int]]:
        return [[rng.randrange(3, vocab_size) for _ in range(length)] for _ in range(count)]

    runs = settings.warmup + settings.repeats
    return {
        "ttft": {str(n): prompts(n, runs) for n in settings.lengths},
        "decode": prompts(settings.decode_prompt_len, settings.repeats),
    }


# ------------------------------------------------------------------------------- exports


def max_context(settings: Settings) -> int:
    """Room for the longest TTFT prompt plus one token and for the decode run, rounded up."""
    needed = max(max(settings.lengths) + 1, settings.decode_prompt_len + settings.new_tokens)
    return -(-needed // 256) * 256
