"""Decode speed of a Gemma-4-shaped model (KV-shared layers) against the capacity a slot is
loaded with: the same bundle loaded with `max_context` = each of `--capacities`, decoding
at the same short context. What the shared layers read should follow the context, not the
capacity (export/shared_kv.py).

    python benchmarks/shared_kv_decode.py --capacities 512,8192 --tokens 32

The model has Gemma 4 E2B's layer widths (hidden 1536, 8 query heads of 256, one KV head,
512-wide full-attention heads, MLP 6144 doubled in the shared layers) but `--layers`
layers, of which the last `--shared` read an earlier layer's KV, and a small vocabulary;
random weights built locally with transformers. Turns alternate between capacities; prints
the median of each turn's median decode rate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build(out: Path, layers: int, shared: int, max_context: int) -> Path:
    from tests.conftest import build_hf_model

    kinds = (["sliding_attention"] * 4 + ["full_attention"]) * (layers // 5 + 1)
    return build_hf_model(
        "gemma4_text", out, hidden_size=1536, intermediate_size=6144, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
        layer_types=kinds[:layers], num_kv_shared_layers=shared, sliding_window=512,
        hidden_size_per_layer_input=256, vocab_size_per_layer_input=256,
        use_double_wide_mlp=True, final_logit_softcapping=30.0, vocab_size=256,
        max_position_embeddings=max_context, initializer_range=0.02)


def decode_rate(bundle: Path, capacity: int, tokens: int, threads: int) -> float:
    from edgeprefill.sdk import Engine, GenerationParams

    with Engine.load(bundle, threads=threads, background=False, max_context=capacity,
                     kv_slots=1) as engine:
        params = GenerationParams(max_new_tokens=tokens, ignore_eos=True)
        result = engine.generate(list(range(3, 35)), params).result()
    return 1.0 / statistics.median(result.metrics.inter_token_latencies)


def main() -> None:
    from comparison.report import cpu_name

    from edgeprefill.export.exporter import ExportOptions, export

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacities", default="512,8192")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--shared", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    capacities = [int(c) for c in args.capacities.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        hf = build(Path(tmp) / "hf", args.layers, args.shared, max(capacities))
        bundle = Path(tmp) / "bundle"
        export(hf, bundle, _options(ExportOptions, max(capacities)))
        rates: dict[int, list[float]] = {c: [] for c in capacities}
        for _ in range(args.rounds):
            for capacity in capacities:
                rates[capacity].append(decode_rate(bundle, capacity, args.tokens, args.threads))
    print(f"CPU: {cpu_name()}; {args.threads} threads; {args.layers} layers, the last "
          f"{args.shared} KV-shared; 32-token prompt, {args.tokens} decoded; {args.rounds} "
          f"rounds")
    base = statistics.median(rates[capacities[0]])
    print("| capacity | decode tok/s (median) | vs the first |")
    print("|---|---|---|")
    for capacity, got in rates.items():
        median = statistics.median(got)
        print(f"| {capacity} | {median:.1f} | {median / base:.2f}x |")


def _options(options_class, max_context: int):
    return options_class(chunks=(32,), max_context=max_context, show_progress=False)


if __name__ == "__main__":
    main()
