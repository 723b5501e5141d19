"""Causal prefill attention: GroupQueryAttention against edgeprefill.PrefillAttention.

    python -m edgeprefill.kernels.build
    python benchmarks/prefill_attention.py --chunk 256 --past 0,1024,1792 --threads 2
    python benchmarks/prefill_attention.py --bundle BUNDLE [--bundle ...] --prompt 2048

Per layer (the first form):
A `--chunk`-token chunk of the SmolLM2-135M shape (9 query heads, 3 KV heads, head_dim 64)
attends causally over `--past` cached positions plus itself, in graphs of 8 chained layers
(each its own cache, bound in place as past and present), the two variants taking turns
`--turns` times in one process. Prints milliseconds per layer (median) and the causal
attention's rate (4 x head_dim x heads x the query-key pairs the causal mask keeps, per
second):

- gqa: com.microsoft.GroupQueryAttention as edgeprefill exports it (packed q/k/v, rotary
  inside);
- native: edgeprefill.PrefillAttention (edgeprefill/kernels/prefill_attention.cc) on the
  same inputs, as the runtime switches it in for chunks of more than one token;
- native-bf16: the same with bf16=1, its two products on bf16 operands (`--compute bf16`).

Whole prompts (`--bundle`): each bundle is loaded four times in one process, with
`EDGEPREFILL_KERNELS=off` (the stock graph) and `require` (the native kernels), in the order
stock, native, native, stock (the first-loaded session runs slower), and a
`--prompt`-token prompt is prefilled in `--chunk`-token chunks (`Backend.run`, no engine),
the two taking turns `--turns` times; prints the median time to the last chunk's logits.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from attention_stack import Stack, bound_run, stack_model
from backend_steps import prefill
from onnx import helper, numpy_helper
from op_ab import session_options

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import BackendOptions
from edgeprefill.engines.ort.backend import OnnxRuntimeBackend
from edgeprefill.errors import EdgeprefillError
from edgeprefill.kernels.build import KernelBuildError, build
from edgeprefill.kernels.graph import kernel_node

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 8
STACK = Stack(HEADS, KV_HEADS, HEAD_DIM, LAYERS)


def gqa_node(layer: int):
    return helper.make_node(
        "GroupQueryAttention",
        ["qkv", "", "", f"past_k{layer}", f"past_v{layer}", "seqlens_k", "total", "cos", "sin"],
        [f"out{layer}", f"present_k{layer}", f"present_v{layer}"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        scale=HEAD_DIM**-0.5, do_rotary=1, name=f"gqa{layer}",
    )


def model(capacity: int, variant: str) -> bytes:
    """variant: "gqa", "native" or "native-bf16" (the kernel's products in bf16, as
    `--compute bf16` runs it)."""
    rng = np.random.default_rng(0)
    angles = rng.random((capacity + 1, HEAD_DIM // 2), np.float32) * 6.28
    inits = [numpy_helper.from_array(np.cos(angles), "cos"),
             numpy_helper.from_array(np.sin(angles), "sin")]
    nodes = [kernel_node(gqa_node(i), prefill=True) if variant != "gqa" else gqa_node(i)
             for i in range(LAYERS)]
    if variant == "native-bf16":
        for node in nodes:
            node.attribute.append(helper.make_attribute("bf16", 1))
    return stack_model(STACK, nodes, inits, "prefill_attention")


def causal_gflop(chunk: int, past: int) -> float:
    pairs = chunk * past + chunk * (chunk + 1) / 2  # (query, key) pairs the mask keeps
    return 4 * HEAD_DIM * HEADS * pairs / 1e9


def prefill_runner(bundle: Path, mode: str, threads: int, prompt: int, chunk: int):
    os.environ["EDGEPREFILL_KERNELS"] = mode
    backend = OnnxRuntimeBackend(bundle, load_manifest(bundle), BackendOptions(threads=threads))
    backend.allocate_kv(1, prompt)
    ids = np.random.default_rng(3).integers(3, backend.manifest.model.vocab_size, prompt)
    return backend, lambda: prefill(backend, ids, chunk)


def ttft(args) -> int:
    print(f"{args.prompt}-token prompt in {args.chunk}-token chunks, {args.threads} threads; "
          f"median s of {args.turns} turns, alternating")
    for bundle in args.bundle:
        try:
            # Each twice, loaded stock, native, native, stock: a process's first-loaded
            # session ran ~5% slower than later ones (docs/benchmarks.md, stop 28).
            runs = [(mode, *prefill_runner(bundle, mode, args.threads, args.prompt, args.chunk))
                    for mode in ("off", "require", "require", "off")]
        except EdgeprefillError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        times: dict[str, list[float]] = {"off": [], "require": []}
        for _, _, run in runs:
            run()  # warm-up
        for _ in range(args.turns):
            for mode, _, run in runs:
                start = time.perf_counter()
                run()
                times[mode].append(time.perf_counter() - start)
        stock, native = (statistics.median(times[m]) for m in ("off", "require"))
        print(f"  {bundle}: stock {stock:6.3f} s  native {native:6.3f} s  {stock / native:.2f}x"
              f"  [{runs[1][1].kernels.described}]")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--past", default="0,1024,1792", help="cached positions, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per turn")
    parser.add_argument("--no-spin", action="store_true",
                        help="pool threads sleep between parallel sections (the runtime's default)")
    parser.add_argument("--library", help="a kernel library to use instead of building one")
    parser.add_argument("--bundle", action="append", type=Path,
                        help="time whole prompts on this bundle (repeatable)")
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens (--bundle)")
    args = parser.parse_args()
    if args.bundle:
        return ttft(args)
    try:
        pasts = [int(v) for v in args.past.split(",")]
        library = args.library or build()
    except (ValueError, KernelBuildError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    options = session_options(args.threads, str(library))
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     "0" if args.no_spin else "1")
    capacity = max(pasts) + args.chunk
    rng = np.random.default_rng(2)
    caches = [rng.standard_normal((1, KV_HEADS, capacity, HEAD_DIM)).astype(np.float32)
              for _ in range(2 * LAYERS)]
    sessions = {name: ort.InferenceSession(model(capacity, name), options,
                                           providers=["CPUExecutionProvider"])
                for name in ("gqa", "native", "native-bf16")}
    print(f"chunk {args.chunk}, {args.threads} threads; ms per layer, median of "
          f"{args.turns} turns x {args.calls} calls of {LAYERS} layers, alternating")
    for past in pasts:
        runs = {name: bound_run(s, STACK, past, args.chunk, caches)
                for name, s in sessions.items()}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for run in runs.values():
            run()  # warm-up
        for _ in range(args.turns):
            for name, run in runs.items():
                for _ in range(args.calls):
                    start = time.perf_counter()
                    run()
                    times[name].append((time.perf_counter() - start) / LAYERS)
        flop = causal_gflop(args.chunk, past)
        gqa = statistics.median(times["gqa"]) * 1e3
        line = f"  past {past:5d}: gqa {gqa:7.2f} ms ({flop / gqa * 1e3:5.1f} GFLOP/s)"
        for name in ("native", "native-bf16"):
            ms = statistics.median(times[name]) * 1e3
            line += f"  {name} {ms:7.2f} ms ({flop / ms * 1e3:5.1f} GFLOP/s) {gqa / ms:.2f}x"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
