"""Shared prefill steps: many short prompts with one prompt per step against several a step.

The model is benchmarks/embeddings.py's Qwen3-Embedding-0.6B shape (random fp32 weights),
exported twice from one checkpoint: an embedding bundle and a generation bundle (its tied
embedding as the LM head). Both bundles pack their tokens, so a step may carry several
prompts' chunks (sdk/scheduler.py, shared prefill); `prefill_rows=1` is the one-prompt-
per-step baseline. Two workloads, each run both ways, taking turns, medians reported:

- embed: `--texts` texts of `--tokens` tokens embedded (a window of twice the KV slots in
  the engine, as Engine.embed keeps), texts/s;
- chat: two sessions decoding while `--users` chat prompts of `--chat-tokens` tokens
  arrive at once, each generating `--new` tokens: the users' mean and max TTFT, the
  decoding sessions' max inter-token latency (shared steps keep one chunk's token budget,
  so it should not grow), and the wall time until every reply is done.

    python benchmarks/shared_prefill.py --work /tmp/shared-bench [--texts 500 --tokens 30]
    python benchmarks/shared_prefill.py --work /tmp/shared-tiny --tiny --texts 8 --rounds 1

`--tiny` builds a 2-layer model of the same layout instead (a smoke run: its times mean
nothing). Prints the CPU, the versions and one table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "runners"))

import embeddings  # noqa: E402 - benchmarks/embeddings.py: the model and its checkpoint

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}
MODES = {"one prompt a step": {"prefill_rows": 1}, "shared steps": {}}


def bundles(work: Path, tiny: bool) -> dict[str, Path]:
    from edgeprefill.export.exporter import ExportOptions, export

    hf = work / "hf"
    if not (hf / "config.json").exists():
        hf.mkdir(parents=True, exist_ok=True)
        embeddings.build(hf)
    out = {"embed": work / "bundle-embed", "generate": work / "bundle-generate"}
    for task, path in out.items():
        if not (path / "edgeprefill.json").exists():
            export(hf, path, ExportOptions(chunks=(16, 64, 256), max_context=512, task=task,
                                           show_progress=False))
    return out


def embed_rate(bundle: Path, texts: list[list[int]], threads: int, slots: int,
               options: dict) -> float:
    from edgeprefill.sdk import Engine

    with Engine.load(bundle, threads=threads, kv_slots=slots, **options) as engine:
        engine.submit_embedding(texts[0]).result()  # warm
        start = time.perf_counter()
        window, streams = 2 * slots, []
        for i, ids in enumerate(texts):
            streams.append(engine.submit_embedding(ids))
            if i + 1 >= window:
                streams[i + 1 - window].result()
        for stream in streams:
            stream.result()
        seconds = time.perf_counter() - start
        assert engine.metrics().prefill_rows >= len(texts)
    return len(texts) / seconds


def chat(bundle: Path, prompts: list[list[int]], decoders: list[list[int]], new: int,
         threads: int, options: dict) -> dict[str, float]:
    from edgeprefill.sdk import Engine, GenerationParams

    with Engine.load(bundle, threads=threads, kv_slots=len(prompts) + len(decoders),
                     **options) as engine:
        long = GenerationParams(max_new_tokens=4 * new + 64, ignore_eos=True)
        background = [engine.generate(ids, long) for ids in decoders]
        for stream in background:
            next(iter(stream))  # decoding
        start = time.perf_counter()
        users = [engine.generate(ids, GenerationParams(max_new_tokens=new, ignore_eos=True))
                 for ids in prompts]
        for stream in users:
            stream.result()
        wall = time.perf_counter() - start
        ttft = [s.metrics.ttft for s in users]
        for stream in background:
            stream.cancel()
        itl = [x for s in background for x in s.metrics.inter_token_latencies
               if x is not None]
        m = engine.metrics()
    return {"ttft_mean": statistics.mean(ttft), "ttft_max": max(ttft),
            "itl_max": max(itl) if itl else 0.0, "wall": wall,
            "rows_per_step": m.prefill_rows / max(1, m.prefill_steps)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model: a smoke run")
    parser.add_argument("--texts", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=30)
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--chat-tokens", type=int, default=40)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8, help="KV slots of the embed runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.tiny:
        embeddings.CONFIG.update(TINY)
    paths = bundles(args.work, args.tiny)
    vocab = embeddings.CONFIG["vocab_size"]
    rng = np.random.default_rng(1)

    def ids(count: int, tokens: int) -> list[list[int]]:
        return [[1, *rng.integers(3, vocab, tokens - 1).tolist()] for _ in range(count)]

    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    chats: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        texts = ids(args.texts, args.tokens)  # new ids each round: no prefix-cache hits
        prompts, decoders = ids(args.users, args.chat_tokens), ids(2, 24)
        for mode, options in MODES.items():
            rates[mode].append(embed_rate(paths["embed"], texts, args.threads, args.slots,
                                          options))
            chats[mode].append(chat(paths["generate"], prompts, decoders, args.new,
                                    args.threads, options))
            print(f"round {round_ + 1}: {mode} done", file=sys.stderr, flush=True)
    import onnxruntime

    model = "tiny (2 layers)" if args.tiny else "Qwen3-0.6B shape"
    print(f"CPU: {embeddings.cpu_name()}, {args.threads} threads; onnxruntime "
          f"{onnxruntime.__version__}; model {model}")
    print(f"embed: {args.texts} texts of {args.tokens} tokens, {args.slots} KV slots; chat: "
          f"{args.users} prompts of {args.chat_tokens} tokens arriving at once beside 2 "
          f"decoding sessions, {args.new} tokens each; medians of {args.rounds} rounds\n")
    print("| mode | embed texts/s | chat TTFT mean ms | chat TTFT max ms | decoding ITL max ms "
          "| chat wall s | prefill rows a step (chat) |")
    print("|---|---|---|---|---|---|---|")
    for mode in MODES:
        c = {k: statistics.median(r[k] for r in chats[mode]) for k in chats[mode][0]}
        print(f"| {mode} | {statistics.median(rates[mode]):.1f} | {c['ttft_mean'] * 1e3:.0f} "
              f"| {c['ttft_max'] * 1e3:.0f} | {c['itl_max'] * 1e3:.0f} | {c['wall']:.2f} "
              f"| {c['rows_per_step']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
