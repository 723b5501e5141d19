"""Attention sinks, no rotary, interleaved rotary: GroupQueryAttention against the native kernels.

    python -m edgeprefill.kernels.build
    python benchmarks/attention_variants.py --past 512,2048 --chunk 1,256 --threads 2

The SmolLM2-135M attention shape (9 query heads, 3 KV heads, head_dim 64) in graphs of 8
chained layers (each its own cache, bound in place as past and present), as each kind of
layer the kernels took at stop 40 exports it: `sinks` (gpt-oss: a head_sink input),
`nope` (do_rotary=0, no tables: SmolLM3's and EXAONE 4's NoPE layers, Granite-4.0-H,
Nemotron-H) and `interleaved` (rotary_interleaved=1: Cohere, GLM, Helium). A
`--chunk`-token chunk (1: a decode step) attends over `--past` cached positions plus itself.
For each kind, gqa (com.microsoft.GroupQueryAttention) and native (edgeprefill.PrefillAttention
on the same node, kernels/graph.py's kernel_node, as the runtime switches it in) take turns
`--turns` times in one process; prints milliseconds per layer (median of the turns' medians).
"""

from __future__ import annotations

import argparse

import numpy as np
from attention_stack import Stack, stack_model, take_turns
from onnx import helper, numpy_helper

from edgeprefill.kernels.build import KernelBuildError, build
from edgeprefill.kernels.graph import kernel_node

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 9, 3, 64, 8
STACK = Stack(HEADS, KV_HEADS, HEAD_DIM, LAYERS)
KINDS = ("sinks", "nope", "interleaved")


def gqa_node(layer: int, kind: str):
    inputs = ["qkv", "", "", f"past_k{layer}", f"past_v{layer}", "seqlens_k", "total"]
    rotary = {"do_rotary": 0} if kind == "nope" else {
        "do_rotary": 1, "rotary_interleaved": int(kind == "interleaved")}
    if kind != "nope":
        inputs += ["cos", "sin"]
    if kind == "sinks":
        inputs += ["", "", "sink"]
    return helper.make_node(
        "GroupQueryAttention", inputs, [f"out{layer}", f"present_k{layer}", f"present_v{layer}"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        scale=HEAD_DIM**-0.5, name=f"gqa{layer}", **rotary)


def model(capacity: int, kind: str, native: bool) -> bytes:
    rng = np.random.default_rng(0)
    angles = rng.random((capacity + 1, HEAD_DIM // 2), np.float32) * 6.28
    inits = []
    if kind != "nope":
        inits = [numpy_helper.from_array(np.cos(angles), "cos"),
                 numpy_helper.from_array(np.sin(angles), "sin")]
    if kind == "sinks":
        inits.append(numpy_helper.from_array(rng.standard_normal(HEADS).astype(np.float32), "sink"))
    nodes = [gqa_node(i, kind) for i in range(LAYERS)]
    if native:
        nodes = [kernel_node(n, prefill=True) for n in nodes]
    return stack_model(STACK, nodes, inits, kind)


def measure(kind: str, past: int, chunk: int, args, library) -> dict[str, list[float]]:
    models = {name: model(past + chunk, kind, name == "native") for name in ("gqa", "native")}
    return take_turns(STACK, models, past, chunk, args.threads, library, args.turns, args.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--past", default="512,2048", help="cached positions, comma-separated")
    parser.add_argument("--chunk", default="1,256", help="chunk lengths (1: decode)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of " +
                        ", ".join(KINDS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--calls", type=int, default=50, help="timed calls per turn (decode)")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if any(k not in KINDS for k in kinds):
        parser.error(f"--kinds takes {', '.join(KINDS)}")
    try:
        library = build()
    except KernelBuildError as err:
        parser.error(f"the native kernels cannot be built here: {err}")
    print(f"{HEADS} heads / {KV_HEADS} KV heads of {HEAD_DIM}, {args.threads} threads; "
          f"ms per layer, median of {args.turns} turns")
    for kind in kinds:
        for chunk in (int(c) for c in args.chunk.split(",")):
            for past in (int(p) for p in args.past.split(",")):
                turns = measure(kind, past, chunk, args, library)
                line = ", ".join(f"{v} {np.median(t):.3f} ({'/'.join(f'{x:.3f}' for x in t)})"
                                 for v, t in turns.items())
                ratio = np.median(turns["gqa"]) / np.median(turns["native"])
                print(f"{kind:11s} chunk {chunk:4d} past {past:5d}: {line}; "
                      f"gqa/native {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
