"""Two bundles' prefill, taking turns in one process: what an exporter change does to TTFT.

    python benchmarks/bundle_ab.py OLD_BUNDLE NEW_BUNDLE --compute bf16 --turns 8
    python benchmarks/bundle_ab.py OLD_BUNDLE NEW_BUNDLE --chunk 61
    python benchmarks/bundle_ab.py B B --compute bf16 --old-env EDGEPREFILL_BF16_KV=off \
        --decode 32
    python benchmarks/bundle_ab.py B B --new-compute bf16 --decode 32   # fp32 against bf16

The two sides may be one bundle loaded two ways: `--old-env` / `--new-env` KEY=VALUE set
environment variables while that side loads (a load-time switch such as the bf16 KV cache);
`--old-without MODULE:FUNCTION` loads the old side with that load-time rewrite skipped (it
returns 0 and changes nothing), e.g. `edgeprefill.kernels.graph:fold_packing` or
`edgeprefill.kernels.select:fuse_skip_rms_norm`: a rewrite with no switch of its own.
`--decode N` times N decode steps after each prefill too (past = the prompt), separately.

Loads each bundle twice, in the order old, new, new, old (`Engine.load`, warm-up
included), and prefills the same `--prompt` token ids in `--chunk`-token chunks on each
(`Backend.run`, no scheduler), taking turns `--turns` times after one untimed run each. The
second copies are there because the order of loading shows: on the 2-core Zen 4 VM a
process's first-loaded session ran 5-6% slower than the same graph loaded after it, which
an old-then-new A/B reads as the new one's gain. Prints the CPU and the placement
(core-to-core latency) before and after, how far apart the two bundles' last logits are
(0: the same bits), and each bundle's median and fastest time over both its copies, with
new / old.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from backend_steps import prefill
from comparison.report import cpu_name
from probes.core_latency import core_to_core_ns, placement

from edgeprefill.engines.base import COMPUTES, StepBatch
from edgeprefill.errors import EdgeprefillError
from edgeprefill.sdk import Engine


def decode(backend, steps: int, past: int) -> None:
    """`steps` one-token steps into slot 0 after a `past`-token prefill."""
    token = np.array([[7]])
    for i in range(steps):
        backend.run(StepBatch(token, np.array([past + i], np.int32), np.ones(1, np.int32), 0))


def load(bundle: Path, env: list[str], skipped: list[str], **options) -> Engine:
    """Engine.load with `env` (KEY=VALUE each) set and the `skipped` functions
    (MODULE:FUNCTION each) returning 0 while it loads, both restored after."""
    saved = dict(os.environ)
    originals = []
    try:
        for item in env:
            key, _, value = item.partition("=")
            os.environ[key] = value
        for item in skipped:
            module_name, _, name = item.partition(":")
            module = importlib.import_module(module_name)
            originals.append((module, name, getattr(module, name)))
            setattr(module, name, lambda *args, **kwargs: 0)
        return Engine.load(bundle, **options)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for module, name, function in originals:
            setattr(module, name, function)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--compute", default="fp32", choices=COMPUTES)
    parser.add_argument("--old-compute", choices=COMPUTES, help="the old side's (--compute)")
    parser.add_argument("--new-compute", choices=COMPUTES, help="the new side's (--compute)")
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--chunk", type=int, default=256, help="tokens per call")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--old-env", action="append", default=[], metavar="KEY=VALUE",
                        help="set while the old side loads (repeatable)")
    parser.add_argument("--new-env", action="append", default=[], metavar="KEY=VALUE",
                        help="set while the new side loads (repeatable)")
    parser.add_argument("--old-without", action="append", default=[],
                        metavar="MODULE:FUNCTION",
                        help="a load-time rewrite the old side skips (repeatable)")
    parser.add_argument("--decode", type=int, default=0,
                        help="decode steps to time after each prefill (0: none)")
    args = parser.parse_args()
    if min(args.prompt, args.chunk, args.turns, args.threads) < 1 or args.decode < 0:
        parser.error("--prompt, --chunk, --turns and --threads must be positive, --decode >= 0")
    if any("=" not in item for item in args.old_env + args.new_env):
        parser.error("--old-env and --new-env take KEY=VALUE")
    for item in args.old_without:
        module_name, _, name = item.partition(":")
        try:
            if not callable(getattr(importlib.import_module(module_name), name, None)):
                parser.error(f"--old-without {item}: no function {name} in {module_name}")
        except ImportError as error:
            parser.error(f"--old-without {item}: {error}")
    before = core_to_core_ns()
    computes = (args.old_compute or args.compute, args.new_compute or args.compute)
    try:
        which = [0, 1, 1, 0]  # old, new, new, old: each bundle loaded first once, last once
        engines = [load((args.old, args.new)[i], (args.old_env, args.new_env)[i],
                        (args.old_without, [])[i], threads=args.threads, background=False,
                        kv_slots=1, compute=computes[i],
                        max_context=args.prompt + args.decode + 1)
                   for i in which]
        vocab = engines[0].backend.manifest.model.vocab_size
        ids = np.random.default_rng(3).integers(5, min(1000, vocab), args.prompt)
        last = [prefill(e.backend, ids, args.chunk) for e in engines[:2]]
        times: list[list[float]] = [[], []]
        steps: list[list[float]] = [[], []]  # per decode step
        for _ in range(args.turns):
            for i, engine in zip(which, engines, strict=True):
                start = time.perf_counter()
                prefill(engine.backend, ids, args.chunk)
                times[i].append(time.perf_counter() - start)
                if args.decode:
                    start = time.perf_counter()
                    decode(engine.backend, args.decode, args.prompt)
                    steps[i].append((time.perf_counter() - start) / args.decode)
        for engine in engines:
            engine.close()
    except EdgeprefillError as error:
        sys.exit(f"bundle_ab.py: {error}")
    after = core_to_core_ns()
    old, new = (statistics.median(t) for t in times)
    print(f"{cpu_name()}, {args.threads} threads, {placement(before)} / {placement(after)}; "
          f"{args.prompt}-token prompt in {args.chunk}-token chunks, --compute "
          f"{'/'.join(dict.fromkeys(computes))} (old/new), "
          f"median of {args.turns} turns x 2 copies")
    diff = float(np.abs(last[0] - last[1]).max())
    same = int(last[0].argmax()) == int(last[1].argmax())
    print("last logits: " + ("the same bits" if diff == 0.0 else
                             f"at most {diff:.3g} apart, {'same' if same else 'another'} argmax"))
    print(f"old {old:.3f} s (fastest {min(times[0]):.3f})  new {new:.3f} s (fastest "
          f"{min(times[1]):.3f})  new / old {new / old:.3f}")
    if args.decode:
        old, new = (statistics.median(t) * 1e3 for t in steps)
        print(f"decode step at past {args.prompt}: old {old:.2f} ms (fastest "
              f"{min(steps[0]) * 1e3:.2f})  new {new:.2f} ms (fastest {min(steps[1]) * 1e3:.2f})"
              f"  new / old {new / old:.3f}")


if __name__ == "__main__":
    main()
