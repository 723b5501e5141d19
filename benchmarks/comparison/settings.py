"""What a run is asked to do, where things are, and the model shapes."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent.parent  # benchmarks/
REPO_DIR = BENCH_DIR.parent
RUNNERS_DIR = BENCH_DIR / "runners"

MODEL_FORMAT = 1  # bump when runners/build_model.py changes what it writes

SMOLLM2_135M_SHAPE: dict[str, Any] = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
    # transformers' default 0.02 gives a model whose greedy output collapses into one token
    # repeated after a 512-token prompt, so the token-agreement check between runtimes would
    # prove nothing. 0.05 keeps the output varied; the speed of dense fp32 is the same.
    "initializer_range": 0.05,
}
# Same architecture, tiny: for checking that every runtime installs, exports and runs.
QUICK_SHAPE: dict[str, Any] = {
    **SMOLLM2_135M_SHAPE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
# A ratio compares against the best comparator (not edgeprefill) of the row's precision,
# or of this one where no comparator has the row's precision (edgeprefill int8).
REFERENCE_PRECISION = "fp32"


@dataclass(frozen=True)
class Settings:
    threads: int
    lengths: list[int]
    runtimes: list[str]
    repeats: int
    rounds: int
    warmup: int
    new_tokens: int
    decode_prompt_len: int
    quick: bool
    seed: int
    work_dir: Path
    json_path: Path | None
    reexport: bool
    timeout_s: int
    chunks: str
    chunk_size: int
    project_python: Path
    verbose: bool
    ceilings: bool = True


class StepError(Exception):
    """A setup, export or measurement step failed; the message is what the report shows."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
