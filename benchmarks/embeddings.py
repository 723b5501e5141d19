"""Embedding throughput and query latency: edgeprefill's embedding bundles against PyTorch.

The model is Qwen3-Embedding-0.6B's shape (hidden 1024, 28 layers, 16 query / 8 KV heads of
128, MLP 3072, vocabulary 151,669) with random fp32 weights, saved as that model ships:
the base model's tensors without `model.`, no LM head, sentence-transformers' modules.json
with last-token pooling and Normalize. edgeprefill exports it (an embedding bundle, fp32
and int8) and runs it at fp32 and `--compute bf16`; PyTorch runs transformers' AutoModel
as sentence-transformers does (the texts of a batch together, the last token's state), in
float32 and in bfloat16. Every runtime gets the same token ids; rounds alternate the
runtimes so each sees the host's drift; medians are reported.

    python benchmarks/embeddings.py --work /tmp/embed-bench [--texts 16 --tokens 128]

Prints the CPU, the library versions, a numpy float32 GEMM ceiling and a table of texts/s
(the batch) and ms (one 24-token query), each with its ratio to PyTorch float32.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "runners"))

CONFIG = {  # Qwen3-Embedding-0.6B
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151669, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0, "tie_word_embeddings": True, "bos_token_id": 1,
    "eos_token_id": 2,
}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def build(folder: Path) -> None:
    """The checkpoint as Qwen3-Embedding ships it (base model, sentence-transformers)."""
    import torch
    from build_model import build_tokenizer
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    model = Qwen3Model(Qwen3Config(**CONFIG)).eval()
    model.save_pretrained(folder)
    build_tokenizer(CONFIG["vocab_size"]).save_pretrained(folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": CONFIG["hidden_size"], "pooling_mode_lasttoken": True}))


def export_bundles(hf: Path, work: Path) -> dict[str, Path]:
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    out = {"fp32": work / "bundle-fp32", "int8": work / "bundle-int8"}
    for kind, path in out.items():
        if not (path / "edgeprefill.json").exists():
            export(hf, path, ExportOptions(chunks=(16, 64, 256), max_context=512,
                                           quant=QuantConfig("int8") if kind == "int8"
                                           else None))
    return out


def edgeprefill_runner(bundle: Path, compute: str, threads: int):
    from edgeprefill.sdk import Engine
    from edgeprefill.sdk.embedding import row_of

    engine = Engine.load(bundle, threads=threads, compute=compute, kv_slots=4)

    def run(batch: list[list[int]]) -> np.ndarray:
        streams = [engine.submit_embedding(ids) for ids in batch]
        return np.stack([row_of(s.result()) for s in streams])
    return run, engine.close


def torch_runner(hf: Path, dtype: str, threads: int):
    import torch
    from transformers import AutoModel

    torch.set_num_threads(threads)
    model = AutoModel.from_pretrained(hf, dtype=getattr(torch, dtype)).eval()

    def run(batch: list[list[int]]) -> np.ndarray:
        with torch.inference_mode():  # equal lengths: no padding, as sentence-transformers
            hidden = model(torch.tensor(batch)).last_hidden_state[:, -1]
        return hidden.float().numpy()
    return run, lambda: None


def gemm_ceiling(threads: int) -> float:
    """numpy float32 GEMM GFLOP/s (2048 x 1024 x 3072), best of 5."""
    a = np.random.default_rng(0).standard_normal((2048, 1024), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((1024, 3072), dtype=np.float32)
    a @ b
    best = min(_timed(np.matmul, a, b) for _ in range(5))
    return 2 * 2048 * 1024 * 3072 / best / 1e9


def _timed(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    hf = args.work / "hf"
    if not (hf / "config.json").exists():
        hf.mkdir(exist_ok=True)
        build(hf)
    bundles = export_bundles(hf, args.work)
    # Fresh ids for every timed call (the same ones for every runtime): edgeprefill keeps a
    # finished prompt's KV as a prefix-cache entry, and a repeated text would hit it.
    rng = np.random.default_rng(1)

    def texts(count: int, tokens: int) -> list[list[int]]:
        return [rng.integers(3, CONFIG["vocab_size"], tokens).tolist() for _ in range(count)]

    check = texts(args.texts, args.tokens)  # the vectors compared across runtimes
    batches = [texts(args.texts, args.tokens) for _ in range(args.rounds)]
    queries = [[texts(1, 24) for _ in range(5)] for _ in range(args.rounds)]
    warm = texts(1, 24)
    runtimes = {
        "PyTorch float32": lambda: torch_runner(hf, "float32", args.threads),
        "PyTorch bfloat16": lambda: torch_runner(hf, "bfloat16", args.threads),
        "edgeprefill fp32": lambda: edgeprefill_runner(bundles["fp32"], "fp32", args.threads),
        "edgeprefill fp32, --compute bf16":
            lambda: edgeprefill_runner(bundles["fp32"], "bf16", args.threads),
        "edgeprefill int8, --compute bf16":
            lambda: edgeprefill_runner(bundles["int8"], "bf16", args.threads),
    }
    batch_s: dict[str, list[float]] = {name: [] for name in runtimes}
    query_s: dict[str, list[float]] = {name: [] for name in runtimes}
    vectors: dict[str, np.ndarray] = {}
    for round_ in range(args.rounds):
        for name, load in runtimes.items():
            run, close = load()
            run(warm)
            vectors[name] = run(check)
            batch_s[name].append(_timed(run, batches[round_]))
            query_s[name] += [_timed(run, query) for query in queries[round_]]
            close()
            print(f"round {round_ + 1}: {name} done", file=sys.stderr, flush=True)
    import onnxruntime
    import torch
    import transformers
    print(f"CPU: {cpu_name()}, {args.threads} threads; onnxruntime {onnxruntime.__version__}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"numpy float32 GEMM ceiling: {gemm_ceiling(args.threads):.0f} GFLOP/s")
    print(f"{args.texts} texts of {args.tokens} tokens; a query of 24 tokens; medians of "
          f"{args.rounds} rounds, every timed call new ids\n")
    base = vectors["PyTorch float32"] / np.linalg.norm(vectors["PyTorch float32"], axis=1,
                                                        keepdims=True)
    ref_rate = args.texts / statistics.median(batch_s["PyTorch float32"])
    ref_query = statistics.median(query_s["PyTorch float32"])
    print("| runtime | texts/s | vs PyTorch fp32 | query ms | vs PyTorch fp32 | "
          "cosine to PyTorch fp32 (min) |")
    print("|---|---|---|---|---|---|")
    for name in runtimes:
        rate = args.texts / statistics.median(batch_s[name])
        ms = statistics.median(query_s[name])
        unit = vectors[name] / np.linalg.norm(vectors[name], axis=1, keepdims=True)
        cosine = float(np.min(np.sum(unit * base, axis=1)))
        print(f"| {name} | {rate:.2f} | {rate / ref_rate:.2f}x | {ms * 1e3:.0f} | "
              f"{ref_query / ms:.2f}x | {cosine:.5f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
