"""edgeprefill on ONNX Runtime's CUDA provider against PyTorch eager on the same GPU.

    python benchmarks/gpu_steps.py --work /tmp/gpu-bench            # SmolLM2-135M shape
    python benchmarks/gpu_steps.py --work /tmp/q --quick --device cpu  # the script itself
    python benchmarks/gpu_steps.py --work /tmp/gs --bundles ort-fp16,ort-fp16-int4

Builds a SmolLM2-135M-shaped Llama with random weights (transformers), exports it as
bundles (both graph flavours, fp16 and fp32), and measures, taking turns round by round:
- TTFT of a `--prompt`-token prompt: edgeprefill in chunks of 512 and in one 2,048-token
  call (bare backend calls, logits of the last position on the host), PyTorch in one
  forward (`logits_to_keep=1`, the way generate() prefills);
- decode tokens/s after that prompt: one row, and `--rows` rows in one call (edgeprefill);
  PyTorch one row over a DynamicCache;
- whether edgeprefill's greedy tokens agree with PyTorch's at the same precision.
Prints one table (median of `--rounds` after a warm-up) with each row's ratio to PyTorch at
its precision, the GPU, and the library versions. Needs torch and transformers (the
`export` extra) and onnxruntime-gpu; `--device cpu` runs everything on the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH), str(BENCH / "runners")]

from comparison.settings import QUICK_SHAPE, SMOLLM2_135M_SHAPE  # noqa: E402

from edgeprefill.engines import BackendOptions, StepBatch  # noqa: E402

CHUNKS = (512, 2048)  # prefill chunk sizes, each capped at the prompt's length


def chunk_sizes(prompt: int) -> tuple[int, ...]:
    return tuple(sorted({min(c, prompt) for c in CHUNKS}))
BUNDLES = (("ort", "fp16"), ("standard", "fp16"), ("standard", "fp32"), ("ort", "fp32"))
TORCH_DTYPES = {"fp16": "float16", "fp32": "float32"}


def build_model(out: Path, quick: bool) -> Path:
    """The random-weight checkpoint (kept between runs in `out`)."""
    import torch
    from build_model import build_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = out / ("model-quick" if quick else "model")
    if (folder / "config.json").exists():
        return folder
    shape = QUICK_SHAPE if quick else SMOLLM2_135M_SHAPE
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(bos_token_id=1, eos_token_id=2, **shape))
    model.to(torch.float32).save_pretrained(folder)
    build_tokenizer(shape["vocab_size"]).save_pretrained(folder)
    return folder


def export_bundle(model: Path, out: Path, flavor: str, dtype: str, context: int,
                  chunks: tuple[int, ...], quant: str | None = None) -> Path:
    """`quant`: "int4" for `--quantize int4` (at its default accuracy level), else None."""
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig

    suffix = f"-{quant}" if quant else ""
    bundle = out / f"bundle-{flavor}-{dtype}{suffix}-{'-'.join(map(str, chunks))}-{context}"
    if not (bundle / "edgeprefill.json").exists():
        export(model, bundle, ExportOptions(flavor=flavor, dtype=dtype, chunks=chunks,
                                            max_context=context, overwrite=True,
                                            show_progress=False,
                                            quant=QuantConfig(quant) if quant else None))
    return bundle


# ---- one runtime's steps: prefill a prompt, decode greedily


class Runtime(ABC):
    name: str
    precision: str

    @abstractmethod
    def prefill(self, ids: np.ndarray, chunk: int) -> np.ndarray:
        """The prompt `ids` in calls of `chunk` tokens; the last position's logits."""

    @abstractmethod
    def decode(self, first: int, steps: int, rows: int) -> list[int]:
        """`steps` greedy tokens after `first`, `rows` rows a call; row 0's tokens."""

    @abstractmethod
    def close(self) -> None:
        """Free the runtime's model and memory."""


class Edgeprefill(Runtime):
    def __init__(self, bundle: Path, flavor: str, dtype: str, device: str, rows: int,
                 context: int, quant: str | None = None) -> None:
        from edgeprefill.bundle import load_manifest
        from edgeprefill.engines.ort.backend import OnnxRuntimeBackend

        self.name = f"edgeprefill {flavor}{f' {quant}' if quant else ''}"
        self.precision = dtype
        self.backend = OnnxRuntimeBackend(bundle, load_manifest(bundle),
                                          BackendOptions(device=device))
        self.backend.allocate_kv(slots=rows, capacity=context)
        self.past = 0

    def prefill(self, ids: np.ndarray, chunk: int) -> np.ndarray:
        out = None
        for at in range(0, len(ids), chunk):
            piece = ids[at:at + chunk]
            out = self.backend.run(StepBatch(piece[None].astype(np.int64),
                                             np.array([at], np.int32),
                                             np.array([len(piece)], np.int32), 0))
        self.past = len(ids)
        return np.array(out[0], copy=True)

    def decode(self, first: int, steps: int, rows: int) -> list[int]:
        """Greedy on row 0; the other rows decode alongside at the same position (their
        cache is whatever the slots hold: the work per call is the same)."""
        tokens, token = [], first
        for step in range(steps):
            ids = np.full((rows, 1), token, np.int64)
            past = np.full(rows, self.past + step, np.int32)
            logits = self.backend.run(StepBatch(ids, past, np.ones(rows, np.int32), 0))
            token = int(np.argmax(logits[0]))
            tokens.append(token)
        return tokens

    def close(self) -> None:
        self.backend.close()


class Torch(Runtime):
    def __init__(self, model: Path, dtype: str, device: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch, self.device = torch, device
        self.name, self.precision = "PyTorch eager", dtype
        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=getattr(torch, TORCH_DTYPES[dtype])).to(device).eval()
        self.cache = None

    def _sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def prefill(self, ids: np.ndarray, chunk: int) -> np.ndarray:
        from transformers import DynamicCache

        torch = self.torch
        with torch.inference_mode():
            self.cache = DynamicCache(config=self.model.config)
            out = self.model(input_ids=torch.tensor(ids[None], device=self.device),
                             past_key_values=self.cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[0, -1].float().cpu().numpy()
        self._sync()
        return logits

    def decode(self, first: int, steps: int, rows: int) -> list[int]:
        torch = self.torch
        tokens, token = [], first
        with torch.inference_mode():
            for _ in range(steps):
                out = self.model(input_ids=torch.tensor([[token]], device=self.device),
                                 past_key_values=self.cache, use_cache=True)
                token = int(out.logits[0, -1].argmax())  # synchronizes
                tokens.append(token)
        return tokens

    def close(self) -> None:
        del self.model
        if self.device == "cuda":
            self.torch.cuda.empty_cache()


# ---- measuring


def timed(body: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = body()
    return time.perf_counter() - start, result


def measure(runtime: Runtime, ids: np.ndarray, steps: int, rows: int,
            results: dict[str, list[float]], tokens: dict[str, list[int]]) -> None:
    """One round of every measurement of `runtime` into `results` (name -> seconds)."""
    key = f"{runtime.name} {runtime.precision}"
    chunks = chunk_sizes(len(ids)) if isinstance(runtime, Edgeprefill) else (len(ids),)
    for chunk in chunks:
        seconds, logits = timed(lambda c=chunk: runtime.prefill(ids, c))
        results.setdefault(f"{key}|ttft {chunk}", []).append(seconds)
    first = int(np.argmax(logits))
    seconds, got = timed(lambda: runtime.decode(first, steps, 1))
    results.setdefault(f"{key}|decode 1", []).append(steps / seconds)
    tokens[key] = [first, *got]
    if isinstance(runtime, Edgeprefill) and rows > 1:
        runtime.prefill(ids, chunks[-1])
        seconds, _ = timed(lambda: runtime.decode(first, steps, rows))
        results.setdefault(f"{key}|decode {rows}", []).append(rows * steps / seconds)


def agreement(tokens: dict[str, list[int]], key: str, precision: str) -> str:
    """How many leading greedy tokens `key` shares with PyTorch at `precision`."""
    reference = tokens.get(f"PyTorch eager {precision}")
    if reference is None or key not in tokens:
        return "-"
    if " int4 " in key:  # other weights than PyTorch's: no agreement to expect
        return "- (int4 weights)"
    same = 0
    for a, b in zip(tokens[key], reference, strict=False):
        if a != b:
            break
        same += 1
    return f"{same}/{len(reference)}"


def versions(device: str) -> str:
    import onnxruntime as ort
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() \
        else "no GPU (CPU run)"
    providers = ", ".join(p.removesuffix("ExecutionProvider")
                          for p in ort.get_available_providers())
    return (f"{gpu}; onnxruntime {ort.__version__} ({providers}); "
            f"torch {torch.__version__}; transformers {transformers.__version__}")


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def report(results: dict[str, list[float]], tokens: dict[str, list[int]], rows: int,
           prompt: int) -> None:
    medians = {name: statistics.median(values) for name, values in results.items()}
    print(f"\n| runtime | precision | TTFT {prompt} (ms), chunk 512 / one call | vs PyTorch "
          f"| decode tok/s, 1 row | vs PyTorch | decode tok/s, {rows} rows | "
          "greedy tokens as PyTorch's |")
    print("|---|---|---|---|---|---|---|---|")
    keys = sorted({name.split("|")[0] for name in medians})
    for key in keys:
        precision = key.rsplit(" ", 1)[1]
        torch_key = f"PyTorch eager {precision}"
        ttfts = [medians[name] for name in sorted(
            (n for n in medians if n.startswith(f"{key}|ttft ")),
            key=lambda n: int(n.rsplit(" ", 1)[1]))]
        best = min(ttfts)
        base_ttft = medians.get(f"{torch_key}|ttft {prompt}")
        decode = medians.get(f"{key}|decode 1")
        base_decode = medians.get(f"{torch_key}|decode 1")
        wide = medians.get(f"{key}|decode {rows}")
        ttft_text = " / ".join(f"{1000 * t:.1f}" for t in ttfts)
        print(f"| {key.rsplit(' ', 1)[0]} | {precision} | {ttft_text} | "
              f"{ratio(base_ttft, best)} | {decode:.0f} | {ratio(decode, base_decode)} | "
              f"{'-' if wide is None else f'{wide:.0f} ({wide / decode:.2f}x 1 row)'} | "
              f"{agreement(tokens, key, precision)} |")
    print("\nvs PyTorch: PyTorch's time over edgeprefill's best (TTFT), edgeprefill's rate over "
          "PyTorch's (decode); above 1 is faster than PyTorch eager at that precision.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="model and bundles here")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=128, help="decode steps per round")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a 2-layer model")
    parser.add_argument("--bundles", default=",".join(f"{f}-{d}" for f, d in BUNDLES),
                        help="flavor-dtype[-int4] bundles (default: %(default)s)")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    context = args.prompt + args.steps + 8
    model = build_model(args.work, args.quick)
    ids = np.random.default_rng(0).integers(3, SMOLLM2_135M_SHAPE["vocab_size"],
                                            size=args.prompt)
    print(versions(args.device), flush=True)
    specs = [(*p.split("-"), None)[:3] for p in args.bundles.split(",")]
    runtimes: list[Runtime] = []
    for flavor, dtype, quant in specs:
        bundle = export_bundle(model, args.work, flavor, dtype, context,
                               chunk_sizes(args.prompt), quant)
        try:
            runtimes.append(Edgeprefill(bundle, flavor, dtype, args.device, args.rows, context,
                                        quant))
        except Exception as err:  # noqa: BLE001 - report and go on with the others
            print(f"edgeprefill {flavor} {dtype} {quant or ''}: not run "
                  f"({type(err).__name__}: {err})")
    for dtype in sorted({d for _, d, _ in specs}):
        if dtype == "fp16" and args.device == "cpu":
            continue  # PyTorch's CPU fp16 is no comparator
        runtimes.append(Torch(model, dtype, args.device))
    results: dict[str, list[float]] = {}
    tokens: dict[str, list[int]] = {}
    for round_index in range(args.rounds + 1):  # round 0 warms up and is dropped
        for runtime in runtimes:
            measure(runtime, ids, args.steps, args.rows, results, tokens)
        if round_index == 0:
            results.clear()
        print(f"round {round_index} done", flush=True)
    report(results, tokens, args.rows, args.prompt)
    for runtime in runtimes:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
