"""fp32 against int8 and int4 exports of one checkpoint: speed, logit error, top-1 agreement.

    python benchmarks/quantized.py HF_DIR --threads 2
    python benchmarks/quantized.py models/tiny-recall --task

Exports the checkpoint five times (fp32, `--quantize int8`, `--quantize int4` at accuracy
levels 4 and 0, and int4 with block 128), then for each: TTFT of one prompt (one chunk),
decode tokens/s, and against fp32 the relative max logit error and the top-1 agreement over
every position of a teacher-forced sequence. With `--task` (the shipped tiny model only) it
also counts the secrets recalled correctly (secret and `</s>`) on fresh ~1,000-token
prompts made by the model's own training script.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edgeprefill.engines import StepBatch
from edgeprefill.errors import EdgeprefillError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine, GenerationParams

VARIANTS = {
    "fp32": None,
    "int8": QuantConfig("int8"),
    "int4": QuantConfig("int4", 32),  # accuracy level 4 (the default): int8 activations
    "int4 acc0": QuantConfig("int4", 32, accuracy_level=0),  # float activations
    "int4 b128": QuantConfig("int4", 128),  # one scale per 128 weights: fewer bytes to read
}
TRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "train_tiny_recall.py"


def task_examples(count: int, length: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, expected answer ids) from the tiny model's own training script, with
    a seed it never trained on."""
    spec = importlib.util.spec_from_file_location("train_tiny_recall", TRAIN_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rng = random.Random(20_000 + length)
    examples = []
    for _ in range(count):
        ids, labels = script.example(rng, length)
        answer_at = next(i for i, v in enumerate(labels) if v != -100)
        examples.append((ids[:answer_at], [ids[answer_at], script.IDS["</s>"]]))
    return examples


def task_accuracy(engine: Engine, examples: list[tuple[list[int], list[int]]]) -> int:
    params = GenerationParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
    correct = 0
    for prompt, answer in examples:
        got = [event.token_id for event in engine.generate(prompt, params)]
        correct += got == answer
    return correct


def timed_run(engine: Engine, ids: list[int], new_tokens: int) -> tuple[float, float]:
    stream = engine.generate(ids, GenerationParams(max_new_tokens=new_tokens, ignore_eos=True),
                             chunk_size=len(ids)).result()
    times = stream.metrics.token_times
    return stream.metrics.ttft, (len(times) - 1) / (times[-1] - times[0])


def teacher_forced_logits(engine: Engine, ids: list[int]) -> np.ndarray:
    """Logits after every prefix, one decode-shaped step per token."""
    rows = []
    for i, token in enumerate(ids):
        batch = StepBatch(np.array([[token]]), np.array([i], np.int32),
                          np.array([1], np.int32), 0)
        rows.append(engine.backend.run(batch)[0].copy())
    return np.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--check-tokens", type=int, default=64)
    parser.add_argument("--task", action="store_true",
                        help="also the tiny-recall model's task accuracy (models/tiny-recall)")
    parser.add_argument("--task-prompts", type=int, default=30)
    args = parser.parse_args()
    if not (args.hf_dir / "config.json").is_file():
        parser.error(f"{args.hf_dir} is not a Hugging Face checkpoint folder (no config.json)")
    try:
        run(args)
    except EdgeprefillError as error:
        sys.exit(f"quantized.py: {error}")


def run(args: argparse.Namespace) -> None:
    examples = task_examples(args.task_prompts, 1000) if args.task else []
    vocab = json.loads((args.hf_dir / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(5, min(1000, vocab), size=args.prompt_tokens)]
    reference, rows = None, []
    with tempfile.TemporaryDirectory() as tmp:
        for name, quant in VARIANTS.items():
            out = Path(tmp) / name
            export(args.hf_dir, out, ExportOptions(chunks=(64,), max_context=2048,
                                                   show_progress=False, quant=quant))
            with Engine.load(out, threads=args.threads, kv_slots=1, prefix_reuse=False,
                             background=False) as engine:
                timed_run(engine, ids[:32], 4)  # warm-up
                ttft, decode = timed_run(engine, ids, args.new_tokens)
                logits = teacher_forced_logits(engine, ids[: args.check_tokens])
                task = task_accuracy(engine, examples) if examples else None
            if reference is None:
                reference = logits
            err = np.abs(logits - reference).max() / np.abs(reference).max()
            top1 = np.mean(logits.argmax(-1) == reference.argmax(-1))
            rows.append((name, ttft, decode, err, top1, task))
            print(f"{name}: TTFT {ttft:.2f} s, decode {decode:.1f} tok/s", flush=True)
    base_ttft, base_decode = rows[0][1], rows[0][2]
    print(f"\n{'weights':10} {'TTFT':>8} {'vs fp32':>8} {'decode':>10} {'vs fp32':>8} "
          f"{'rel err':>8} {'top-1':>6}" + (f" {'task':>7}" if examples else ""))
    for name, ttft, decode, err, top1, task in rows:
        shown = f" {task:>3}/{len(examples):<3}" if examples else ""
        print(f"{name:10} {ttft:7.2f}s {base_ttft / ttft:7.2f}x {decode:7.1f}t/s "
              f"{decode / base_decode:7.2f}x {err:8.4f} {top1:6.1%}{shown}")
    print(f"({args.prompt_tokens}-token prompt in one chunk, {args.new_tokens} decode tokens, "
          f"{args.threads} threads; {time.strftime('%Y-%m-%d %H:%M')})")


if __name__ == "__main__":
    main()
