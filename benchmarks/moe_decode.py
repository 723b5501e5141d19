"""Decode speed of a small mixture-of-experts model against the dense model of its active
size, each exported as a bundle (random weights, built locally with transformers).

    python benchmarks/moe_decode.py --quantize none,int4 --tokens 64

The MoE is Qwen3-MoE shaped (`--experts` experts of width `--width`, top `--top-k`); the
dense model is Qwen3 with the same attention and an MLP `--top-k` x `--width` wide, so a
token runs the same multiply-adds in both, and the MoE holds `--experts / --top-k` times the
MLP weights. The MoE runs twice: as the `ort` flavour exports it (ONNX Runtime's MoE/QMoE
op, export/moe_op.py) and with the unrolled experts of export/moe.py (what fp16 bundles,
the `standard` flavour and the blocks the op cannot compute get: `why_unrolled`), to show
what the per-expert nodes cost. Each bundle decodes `--tokens` tokens after a 16-token
prompt, `--runs` times after three warm-up runs; prints the median of each run's median
inter-token rate (decode tokens/s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Runs dropped before timing: a fresh MoE-op bundle's first generations decoded up to 6x
# slower than later ones (median gaps 12.5, 10.1, then 1.9 ms on the 8 x 128-expert model).
WARM_UP = 3
sys.path.insert(0, str(ROOT))


def build(kind: str, out: Path, args) -> Path:
    from tests.conftest import build_hf_model

    shape = dict(hidden_size=args.hidden, num_hidden_layers=args.layers,
                 num_attention_heads=max(4, args.hidden // 64), num_key_value_heads=4,
                 head_dim=64,
                 vocab_size=128, initializer_range=0.02)
    if kind == "dense":
        return build_hf_model("qwen3", out, intermediate_size=args.top_k * args.width, **shape)
    return build_hf_model("qwen3_moe", out, num_experts=args.experts,
                          num_experts_per_tok=args.top_k, moe_intermediate_size=args.width,
                          mlp_only_layers=[], intermediate_size=args.width, **shape)


def export_bundle(hf: Path, out: Path, quantize: str, unrolled: bool) -> Path:
    import edgeprefill.export.decoder as decoder
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    why = decoder.why_unrolled
    if unrolled:  # what the builder gives a block the op cannot compute
        decoder.why_unrolled = lambda *args: "measured unrolled"  # type: ignore[assignment]
    try:
        export(hf, out, ExportOptions(chunks=(16,), max_context=256, show_progress=False,
                                      quant=None if quantize == "none" else QuantConfig(quantize)))
    finally:
        decoder.why_unrolled = why  # type: ignore[assignment]
    return out


def decode_rate(bundle: Path, tokens: int, runs: int, threads: int) -> float:
    from edgeprefill.sdk import Engine, GenerationParams

    rates = []
    with Engine.load(bundle, threads=threads, background=False) as engine:
        prompt = list(range(3, 19))
        params = GenerationParams(max_new_tokens=tokens, ignore_eos=True)
        for _ in range(runs + WARM_UP):
            result = engine.generate(prompt, params).result()
            rates.append(1.0 / statistics.median(result.metrics.inter_token_latencies))
    return statistics.median(rates[WARM_UP:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--quantize", default="none,int4")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hf = {kind: build(kind, root / kind, args) for kind in ("dense", "moe")}
        print(f"hidden {args.hidden}, {args.layers} layers; MoE {args.experts} experts of "
              f"{args.width}, top {args.top_k}; dense MLP {args.top_k * args.width}")
        for quantize in args.quantize.split(","):
            for name, kind, unrolled in (("dense", "dense", False), ("moe (MoE op)", "moe", False),
                                         ("moe (unrolled)", "moe", True)):
                path = export_bundle(hf[kind], root / f"{name}-{quantize}".replace(" ", ""),
                                     quantize, unrolled)
                rate = decode_rate(path, args.tokens, args.runs, args.threads)
                print(f"{quantize:5s} {name:15s} {rate:8.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
