"""Sliding-window attention: GroupQueryAttention against the native kernels, past the window.

    python -m edgeprefill.kernels.build
    python benchmarks/sliding_attention.py --past 1024,4096 --chunk 1,256 --threads 2

The attention of Gemma 3 1B's local layers (4 query heads, 1 KV head, head_dim 256, window
512) in graphs of 8 chained layers (each its own cache, bound in place as past and present):
a `--chunk`-token chunk (1: a decode step) attends over `--past` cached positions plus
itself. The variants take turns `--turns` times in one process; prints milliseconds per
layer (median of the turns' medians):

- gqa: com.microsoft.GroupQueryAttention with local_window_size as edgeprefill exports it;
- native: edgeprefill.PrefillAttention on the same node (kernels/graph.py's kernel_node),
  as the runtime switches it in for every call (a decode step's row runs DecodeRows);
- native-global: the same without the window (a global layer's cost, for scale).
"""

from __future__ import annotations

import argparse

import numpy as np
from attention_stack import Stack, stack_model, take_turns
from onnx import helper, numpy_helper

from edgeprefill.kernels.build import KernelBuildError, build
from edgeprefill.kernels.graph import kernel_node

HEADS, KV_HEADS, HEAD_DIM, WINDOW, LAYERS = 4, 1, 256, 512, 8
STACK = Stack(HEADS, KV_HEADS, HEAD_DIM, LAYERS)
VARIANTS = ("gqa", "native", "native-global")


def gqa_node(layer: int, window: int):
    return helper.make_node(
        "GroupQueryAttention",
        ["qkv", "", "", f"past_k{layer}", f"past_v{layer}", "seqlens_k", "total", "cos", "sin"],
        [f"out{layer}", f"present_k{layer}", f"present_v{layer}"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        scale=HEAD_DIM**-0.5, do_rotary=1, local_window_size=window, name=f"gqa{layer}",
    )


def model(capacity: int, variant: str) -> bytes:
    rng = np.random.default_rng(0)
    angles = rng.random((capacity + 1, HEAD_DIM // 2), np.float32) * 6.28
    inits = [numpy_helper.from_array(np.cos(angles), "cos"),
             numpy_helper.from_array(np.sin(angles), "sin")]
    window = -1 if variant == "native-global" else WINDOW
    nodes = [gqa_node(i, window) for i in range(LAYERS)]
    if variant != "gqa":
        nodes = [kernel_node(n, prefill=True) for n in nodes]
    return stack_model(STACK, nodes, inits, "sliding")


def measure(past: int, chunk: int, args, library) -> dict[str, list[float]]:
    models = {v: model(past + chunk, v) for v in VARIANTS}
    return take_turns(STACK, models, past, chunk, args.threads, library, args.turns, args.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--past", default="1024,4096", help="cached positions, comma-separated")
    parser.add_argument("--chunk", default="1,256", help="chunk lengths (1: decode)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50, help="timed calls per turn (decode)")
    args = parser.parse_args()
    try:
        library = build()
    except KernelBuildError as err:
        parser.error(f"the native kernels cannot be built here: {err}")
    print(f"window {WINDOW}, {HEADS} heads / {KV_HEADS} KV head of {HEAD_DIM}, "
          f"{args.threads} threads; ms per layer, median of {args.turns} turns")
    for chunk in (int(c) for c in args.chunk.split(",")):
        for past in (int(p) for p in args.past.split(",")):
            turns = measure(past, chunk, args, library)
            line = ", ".join(f"{v} {np.median(t):.3f} ({'/'.join(f'{x:.3f}' for x in t)})"
                             for v, t in turns.items())
            ratio = np.median(turns["gqa"]) / np.median(turns["native"])
            print(f"chunk {chunk:4d} past {past:5d}: {line}; gqa/native {ratio:.2f}x")


if __name__ == "__main__":
    main()
