"""Comparative benchmark: edgeprefill vs transformers/PyTorch, ONNX Runtime GenAI and optimum.

One run builds (or reuses) a SmolLM2-135M-shaped Llama with random fp32 weights under
benchmarks/work/, exports it for every runtime, measures the machine's ceilings (GEMM rate,
memory bandwidth) and then each runtime in its own process and virtualenv at the same thread
count, on the same weights and the same prompt token ids. See benchmarks/README.md.

This file uses the standard library only, so any Python >= 3.10 can run it:
    python benchmarks/compare.py --quick              # smoke test on a tiny model
    python benchmarks/compare.py --json out.json      # the real comparison
"""


from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from comparison.ceilings import floors, measure_ceilings, params_without_embedding
from comparison.models import build_model, prompt_sets
from comparison.registry import RUNTIMES
from comparison.report import machine_info, print_report
from comparison.runners import pool_rounds, run_runtime
from comparison.settings import BENCH_DIR, REPO_DIR, Settings, StepError, say
from probes.core_latency import core_to_core_ns


def parse_int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="threads for every runtime")
    parser.add_argument("--lengths", help="TTFT prompt lengths (default 128,512,2048)")
    parser.add_argument(
        "--runtimes",
        default=",".join(name for name, r in RUNTIMES.items() if r.default),
        help=f"comma-separated subset of {','.join(RUNTIMES)} (default: all but the "
        "block-128 int4 variants)",
    )
    parser.add_argument("--repeats", type=int, help="measured runs per point (default 3)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every runtime this many times, taking turns, and pool the runs: on a "
        "machine whose speed drifts, each runtime then sees the same conditions",
    )
    parser.add_argument("--warmup", type=int, default=1, help="warm-up runs per TTFT length")
    parser.add_argument("--new-tokens", type=int, help="decode tokens (default 128)")
    parser.add_argument("--decode-prompt", type=int, help="decode prompt length (default 512)")
    parser.add_argument("--json", type=Path, help="also write all results to this file")
    parser.add_argument("--quick", action="store_true", help="tiny model and sizes: smoke test")
    parser.add_argument("--seed", type=int, default=0, help="weights and prompt ids")
    parser.add_argument("--work-dir", type=Path, default=BENCH_DIR / "work")
    parser.add_argument("--reexport", action="store_true", help="redo cached exports")
    parser.add_argument("--timeout", type=int, default=3600,
                        help="seconds per step, and per venv install (at least 1800)")
    parser.add_argument("--chunks", default="16,64,256", help="edgeprefill export --chunks")
    parser.add_argument("--chunk-size", type=int, default=256, help="edgeprefill chunk_size")
    parser.add_argument(
        "--project-python",
        type=Path,
        default=REPO_DIR / ".venv/bin/python",
        help="python of the venv edgeprefill is installed in",
    )
    parser.add_argument("--verbose", action="store_true", help="echo all child output")
    parser.add_argument(
        "--no-ceilings",
        action="store_true",
        help="skip measuring the machine's GEMM rate and bandwidth (~1 minute); the report "
        "then has no floors",
    )
    args = parser.parse_args(argv)

    runtimes = [name.strip() for name in args.runtimes.split(",") if name.strip()]
    unknown = [name for name in runtimes if name not in RUNTIMES]
    if unknown:
        parser.error(f"unknown runtimes {unknown}; choose from {list(RUNTIMES)}")
    quick = args.quick
    settings = Settings(
        threads=args.threads,
        lengths=parse_int_list(args.lengths or ("16,64" if quick else "128,512,2048")),
        runtimes=runtimes,
        repeats=args.repeats or (1 if quick else 3),
        rounds=args.rounds,
        warmup=args.warmup,
        new_tokens=args.new_tokens or (16 if quick else 128),
        decode_prompt_len=args.decode_prompt or (64 if quick else 512),
        quick=quick,
        seed=args.seed,
        work_dir=args.work_dir.resolve(),
        json_path=args.json,
        reexport=args.reexport,
        timeout_s=args.timeout,
        chunks=args.chunks,
        chunk_size=args.chunk_size,
        project_python=args.project_python.absolute(),  # not resolved: keep the venv's symlink
        verbose=args.verbose,
        ceilings=not args.no_ceilings,
    )
    if settings.new_tokens < 2 or min(settings.repeats, settings.rounds, settings.threads) < 1:
        parser.error(
            "need --new-tokens >= 2 (decode rate excludes the first), --repeats, --rounds "
            "and --threads >= 1"
        )
    if not settings.lengths or min(settings.lengths) < 1:
        parser.error("--lengths needs positive prompt lengths")
    return settings


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    started = time.perf_counter()
    machine = machine_info(settings.project_python)
    run_dir = settings.work_dir / "runs" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"benchmark run in {run_dir}")

    try:
        model = build_model(settings)
    except (StepError, OSError) as error:
        say(f"cannot build the benchmark model, nothing to measure:\n{error}")
        return 1
    prompts = prompt_sets(settings, model.config["vocab_size"])
    ceilings = measure_ceilings(
        settings, model.config["hidden_size"], model.config["intermediate_size"], run_dir
    )
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in settings.runtimes}
    for turn in range(settings.rounds):
        if settings.rounds > 1:
            say(f"round {turn + 1} of {settings.rounds}")
        for name in settings.runtimes:
            previous = rounds[name][-1] if rounds[name] else None
            if previous is not None and "error" in previous:
                continue  # a runtime that failed once is not retried
            before = core_to_core_ns()
            result = run_runtime(RUNTIMES[name], settings, model, prompts, run_dir, turn)
            result["core_ns"] = [before, core_to_core_ns()]  # the host's vCPU placement
            rounds[name].append(result)
    results = {name: pool_rounds(runs) for name, runs in rounds.items()}
    machine["loadavg_end"] = os.getloadavg()[0]

    report = {
        "settings": {
            **asdict(settings),
            "work_dir": str(settings.work_dir),
            "json_path": str(settings.json_path),
            "project_python": str(settings.project_python),
        },
        "machine": machine,
        "model": {
            "name": model.name,
            "hf_dir": str(model.hf_dir),
            "config": model.config,
            "params": model.params,
            "embedding_params": model.embedding_params,
            "params_without_embedding": params_without_embedding(model.config),
        },
        "prompts_sha256": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        "ceilings": ceilings,
        "floors": floors(settings, model, ceilings),
        "runtimes": results,
        "timings": {"total_s": time.perf_counter() - started},
        "run_dir": str(run_dir),
    }
    (run_dir / "results.json").write_text(json.dumps(report, indent=2))
    if settings.json_path:
        settings.json_path.write_text(json.dumps(report, indent=2))
    print_report(report, settings, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
