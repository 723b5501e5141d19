"""Absorbed multi-head latent attention: GroupQueryAttention against the native kernels.

    python -m edgeprefill.kernels.build
    python benchmarks/latent_attention.py --past 512,2048,8192 --chunk 1,256 --threads 2

MLA as edgeprefill exports it absorbed (docs/design.md "### Multi-head latent attention"):
multi-query attention over ONE KV head of width r + L, rotary outside (do_rotary=0). The
shapes: `576x16` (DeepSeek-V2-Lite: 16 query heads over a head of 64 + 512), `576x128`
(DeepSeek-V3: 128 query heads) and `288x40` (MiniCPM3-4B: 40 query heads over 32 + 256),
in graphs of `--layers` chained layers (each its own cache, bound in place as past and
present). A `--chunk`-token chunk (1: a decode step) attends over `--past` cached positions
plus itself. gqa (com.microsoft.GroupQueryAttention) and native (edgeprefill.PrefillAttention
on the same node, kernels/graph.py's kernel_node, as the runtime switches it in) take turns
`--turns` times in one process; prints milliseconds per layer (median of the turns'
medians). Where the graph switch keeps stock attention (more than graph.MAX_GROUP query
heads per KV head: 576x128) native is edgeprefill.DecodeAttention, decode only.
`--baseline LIBRARY` adds `before`: the same native node run by another build of the
kernels (e.g. an older checkout's, from its `python -m edgeprefill.kernels.build`), taking
turns with the others.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from attention_stack import Stack, stack_model, take_turns
from onnx import helper

from edgeprefill.kernels.build import KernelBuildError, build
from edgeprefill.kernels.graph import MAX_GROUP, kernel_node

SHAPES = {"576x16": (16, 576), "576x128": (128, 576), "288x40": (40, 288)}


def gqa_node(layer: int, heads: int, head_dim: int):
    inputs = ["qkv", "", "", f"past_k{layer}", f"past_v{layer}", "seqlens_k", "total"]
    return helper.make_node(
        "GroupQueryAttention", inputs, [f"out{layer}", f"present_k{layer}", f"present_v{layer}"],
        domain="com.microsoft", num_heads=heads, kv_num_heads=1, scale=192**-0.5,
        do_rotary=0, name=f"gqa{layer}")


def model(stack: Stack, variant: str) -> bytes:
    nodes = [gqa_node(i, stack.heads, stack.head_dim) for i in range(stack.layers)]
    if variant == "native":
        nodes = [kernel_node(n, prefill=True) for n in nodes]
    elif variant == "decode":
        nodes = [kernel_node(n) for n in nodes]
    return stack_model(stack, nodes, [], variant)


def native_variant(heads: int, chunk: int) -> str | None:
    """The native op that runs this shape: PrefillAttention where the graph switch takes
    it, DecodeAttention for a decode step where it does not, else none."""
    if heads <= MAX_GROUP:
        return "native"
    return "decode" if chunk == 1 else None


def summary(turns: dict[str, list[float]], variant: str) -> str:
    """Each variant's median and turns, and the ratios to the native op."""
    medians = {v: float(np.median(t)) for v, t in turns.items()}
    line = ", ".join(f"{v} {medians[v]:.3f} ({'/'.join(f'{x:.3f}' for x in t)})"
                     for v, t in turns.items())
    ratios = "; ".join(f"{v}/{variant} {medians[v] / medians[variant]:.2f}x"
                       for v in medians if v != variant)
    return f"{line}; {ratios}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of " +
                        ", ".join(SHAPES))
    parser.add_argument("--past", default="512,2048,8192", help="cached positions, comma-separated")
    parser.add_argument("--chunk", default="1,256", help="chunk lengths (1: decode)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per turn (decode)")
    parser.add_argument("--baseline", type=Path, help="another kernel library, timed as before")
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    if any(s not in SHAPES for s in shapes):
        parser.error(f"--shapes takes {', '.join(SHAPES)}")
    try:
        library = build()
    except KernelBuildError as err:
        parser.error(f"the native kernels cannot be built here: {err}")
    print(f"{args.layers} layers, {args.threads} threads; ms per layer, median of "
          f"{args.turns} turns")
    for shape in shapes:
        heads, head_dim = SHAPES[shape]
        stack = Stack(heads, 1, head_dim, args.layers)
        for chunk in (int(c) for c in args.chunk.split(",")):
            variant = native_variant(heads, chunk)
            if variant is None:
                print(f"{shape:8s} chunk {chunk:4d}: the graph switch keeps stock attention")
                continue
            for past in (int(p) for p in args.past.split(",")):
                models = {"gqa": model(stack, "gqa"), variant: model(stack, variant)}
                if args.baseline:
                    models["before"] = models[variant]
                turns = take_turns(stack, models, past, chunk, args.threads, library,
                                   args.turns, args.calls, {"before": args.baseline})
                print(f"{shape:8s} chunk {chunk:4d} past {past:5d}: "
                      f"{summary(turns, variant)}", flush=True)


if __name__ == "__main__":
    main()
