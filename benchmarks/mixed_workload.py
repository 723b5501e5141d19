"""The mixed workload against OpenVINO GenAI's ContinuousBatchingPipeline (issue 15 item 5).

3 sessions are decoding when a 2,048-token prompt arrives; every runtime gets a budget of
64 tokens per step, the decode rows' tokens included (edgeprefill: max_step_tokens=64, a
chunk of 61 beside 3 decode rows, in one call where the bundle packs its tokens; OpenVINO:
max_num_batched_tokens=64 with dynamic split-fuse), the same checkpoint (compare.py's
SmolLM2-135M shape), the same prompt ids and the same threads, each run in a fresh process,
the order alternating between rounds:

    python benchmarks/mixed_workload.py --work-dir /work/benchwork --rounds 2

Per runtime: the long prompt's first token (from its arrival), the longest gap between two
tokens of a session while it prefills, the sessions' gaps p50/p99 (from its arrival until
its reply is done) and the sessions' aggregate tokens/s while it prefills. The figures come
from the token time stamps every runner prints (runners/mixed_common.py), computed here
the same way for all. Uses the standard library only, like compare.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

from compare import parse_args as compare_args
from comparison.models import ModelInfo, build_model
from comparison.procs import last_json_line, run_step
from comparison.provenance import describe
from comparison.registry import RUNTIMES, Runtime
from comparison.report import machine_info, report_placement
from comparison.runners import artifact_dir, export_artifact
from comparison.settings import BENCH_DIR, REPO_DIR, RUNNERS_DIR, Settings, StepError, say
from comparison.venvs import ensure_venv
from probes.core_latency import all_near, core_to_core_ns


class MixedRuntime(NamedTuple):
    runner: str
    export: str  # the compare.py runtime whose export (and venv) it uses
    options: tuple[tuple[str, str], ...] = ()
    default: bool = True  # in the default --runtimes


UNFUSED = (("fuse_steps", "off"),)  # two calls per step: the A/B rows of fused steps
MIXED_RUNTIMES: dict[str, MixedRuntime] = {
    "edgeprefill": MixedRuntime("run_edgeprefill_mixed.py", "edgeprefill"),
    "edgeprefill-bf16": MixedRuntime("run_edgeprefill_mixed.py", "edgeprefill",
                                     (("compute", "bf16"),)),
    "edgeprefill-int4": MixedRuntime("run_edgeprefill_mixed.py", "edgeprefill-int4"),
    "edgeprefill-int4-bf16": MixedRuntime("run_edgeprefill_mixed.py", "edgeprefill-int4",
                                          (("compute", "bf16"),)),
    "edgeprefill-int8-bf16": MixedRuntime("run_edgeprefill_mixed.py", "edgeprefill-int8",
                                          (("compute", "bf16"),)),
    "edgeprefill-unfused": MixedRuntime("run_edgeprefill_mixed.py", "edgeprefill", UNFUSED,
                                        default=False),
    "edgeprefill-int8-bf16-unfused": MixedRuntime(
        "run_edgeprefill_mixed.py", "edgeprefill-int8", (("compute", "bf16"), *UNFUSED),
        default=False),
    "edgeprefill-bf16-unfused": MixedRuntime("run_edgeprefill_mixed.py", "edgeprefill",
                                             (("compute", "bf16"), *UNFUSED), default=False),
    "openvino-cb-f32": MixedRuntime("run_openvino_cb.py", "openvino",
                                    (("precision_hint", "f32"), ("kv_precision", "f32"))),
    "openvino-cb": MixedRuntime("run_openvino_cb.py", "openvino"),
    "openvino-cb-int8": MixedRuntime("run_openvino_cb.py", "openvino-int8"),
    "openvino-cb-int4": MixedRuntime("run_openvino_cb.py", "openvino-int4"),
}
FIGURES = {  # key -> (label, format)
    "long_ttft_s": ("long prompt TTFT", "{:.2f} s"),
    "max_gap_s": ("longest gap in prefill", "{:.3f} s"),
    "gap_p50_s": ("gap p50", "{:.3f} s"),
    "gap_p99_s": ("gap p99", "{:.3f} s"),
    "decode_tok_s": ("sessions tok/s in prefill", "{:.1f}"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=BENCH_DIR / "work")
    parser.add_argument("--runtimes",
                        default=",".join(n for n, r in MIXED_RUNTIMES.items() if r.default),
                        help=f"comma-separated subset of {','.join(MIXED_RUNTIMES)}")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs per runtime, the order reversed every other round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--session-prompt-tokens", type=int, default=32)
    parser.add_argument("--budget", type=int, default=64, help="tokens per step")
    parser.add_argument("--reply-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse-bundles", action="store_true",
                        help="use the edgeprefill bundles compare.py exported with the same "
                        "command instead of exporting them again")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument("--project-python", type=Path, default=REPO_DIR / ".venv/bin/python",
                        help="python of the venv edgeprefill is installed in")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.runtimes.split(",") if n.strip()]
    unknown = [n for n in names if n not in MIXED_RUNTIMES]
    if unknown or not names:
        parser.error(f"unknown runtimes {unknown}; choose from {list(MIXED_RUNTIMES)}")
    if min(args.rounds, args.threads, args.sessions, args.budget, args.prompt_tokens) < 1 \
            or args.reply_tokens < 2 or args.budget <= args.sessions:
        parser.error("need positive sizes, --reply-tokens >= 2 and --budget > --sessions")
    args.runtimes = names
    return args


def prompt_ids(args: argparse.Namespace, vocab: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    return {"sessions": [ids(args.session_prompt_tokens) for _ in range(args.sessions)],
            "long": ids(args.prompt_tokens)}


def figures(run: dict[str, Any]) -> dict[str, float]:
    """The table's figures from one run's stamps (seconds from the scenario's start)."""
    arrival, long = run["arrival_s"], run["long_token_s"]
    first, done = long[0], long[-1]
    gaps, in_prefill, tokens = [], [], 0
    for times in run["session_token_s"]:
        for earlier, later in pairwise(times):
            if arrival < later <= done:
                gaps.append(later - earlier)
            if earlier < first and later > arrival:  # the gap overlaps the prefill
                in_prefill.append(later - earlier)
        tokens += sum(arrival < t <= first for t in times)
    if not gaps:
        raise StepError("the sessions produced no token while the long prompt ran")
    gaps.sort()
    return {
        "long_ttft_s": first - arrival,
        "max_gap_s": max(in_prefill, default=0.0),
        "gap_p50_s": statistics.median(gaps),
        "gap_p99_s": gaps[min(len(gaps) - 1, round(0.99 * (len(gaps) - 1)))],
        "decode_tok_s": tokens / (first - arrival),
    }


def prepare(name: str, settings: Settings, model: ModelInfo, reuse: bool) -> tuple[Runtime, Path]:
    """The venv and the export of the compare.py runtime this one uses."""
    runtime = RUNTIMES[MIXED_RUNTIMES[name].export]
    python = ensure_venv(runtime.venv, settings)
    out = artifact_dir(runtime, model)
    assert runtime.export is not None
    marker = out.parent / f"{runtime.name}.done.json"
    command = runtime.export(runtime, settings, model.hf_dir, out)
    if not (reuse and marker.exists() and json.loads(marker.read_text()) == command):
        out, _ = export_artifact(runtime, settings, model)
    return runtime, python


def measure(name: str, base_spec: dict[str, Any], settings: Settings, model: ModelInfo,
            run_dir: Path, turn: int, python: Path) -> dict[str, Any]:
    mixed = MIXED_RUNTIMES[name]
    runtime = RUNTIMES[mixed.export]
    spec = {**base_spec, "runtime": name, "artifact_dir": str(artifact_dir(runtime, model)),
            "options": dict(mixed.options)}
    spec_path = run_dir / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [str(python), str(RUNNERS_DIR / mixed.runner), str(spec_path)]
    before = core_to_core_ns()
    output = run_step(cmd, run_dir / f"{name}.{turn}.log", python, settings)
    run = last_json_line(output)
    return {**run, **figures(run), "core_ns": [before, core_to_core_ns()]}


def pooled(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in FIGURES}


def table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["| runtime | " + " | ".join(label for label, _ in FIGURES.values()) + " |",
             "|---" * (len(FIGURES) + 1) + "|"]
    for name, runs in results.items():
        if not runs or "error" in runs[-1]:
            error = runs[-1]["error"].strip().splitlines()[-1] if runs else "not run"
            lines.append(f"| {name} | ERROR: {error[:150]} |")
            continue
        values = pooled(runs)
        cells = [fmt.format(values[key]) for key, (_, fmt) in FIGURES.items()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def near_only(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The table again over the runs probed near both before and after (on the 2-vCPU VMs
    the host's placement moves a run by ~30%: compare within one placement), or nothing
    when every run was near."""
    measured = {name: [r for r in runs if "error" not in r] for name, runs in results.items()}
    kept = {name: [r for r in runs if all_near(r.get("core_ns") or [])]
            for name, runs in measured.items()}
    if all(len(kept[name]) == len(runs) for name, runs in measured.items()):
        return []
    lines = ["near placement only (runs probed near before and after):"]
    lines += table({f"{name} ({len(kept[name])} of {len(runs)})": kept[name]
                    for name, runs in measured.items() if kept[name]})
    lines += [f"| {name} | no near run |" for name in measured if not kept[name]]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = compare_args(["--work-dir", str(args.work_dir), "--threads", str(args.threads),
                             "--lengths", str(args.prompt_tokens), "--seed", str(args.seed),
                             "--project-python", str(args.project_python)])
    machine = machine_info(settings.project_python)
    run_dir = settings.work_dir / "runs" / ("mixed-" + time.strftime("%Y%m%d-%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"mixed workload run in {run_dir}")
    try:
        model = build_model(settings)
    except (StepError, OSError) as error:
        say(f"cannot build the benchmark model:\n{error}")
        return 1
    vocab = model.config["vocab_size"]
    base_spec = {
        "threads": args.threads, "sessions": args.sessions, "budget": args.budget,
        "reply_tokens": args.reply_tokens, "session_max_tokens": 512,
        "ids": prompt_ids(args, vocab, args.seed),
        "warmup_ids": prompt_ids(args, vocab, args.seed + 1),
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.runtimes}
    pythons: dict[str, Path] = {}
    for turn in range(args.rounds):
        order = args.runtimes if turn % 2 == 0 else args.runtimes[::-1]
        for name in order:
            if results[name] and "error" in results[name][-1]:
                continue
            say(f"[{name}] round {turn + 1} of {args.rounds}")
            try:
                if name not in pythons:
                    _, pythons[name] = prepare(name, settings, model, args.reuse_bundles)
                run = measure(name, base_spec, settings, model, run_dir, turn, pythons[name])
            except (StepError, OSError) as error:
                run = {"error": str(error)}
                say(f"  {name} failed: {str(error).strip().splitlines()[-1]}")
            results[name].append(run)
    machine["loadavg_end"] = os.getloadavg()[0]
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine,
              "model": model.name, "results": results}
    (run_dir / "results.json").write_text(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(f"mixed workload: {args.sessions} sessions decoding, a {args.prompt_tokens}-token "
          f"prompt arrives, {args.budget} tokens per step, {args.threads} threads, "
          f"{model.name}, median of {args.rounds} fresh process(es) each")
    print(f"machine: {machine['cpu']}, load average {machine['loadavg_start']:.2f} at start, "
          f"{machine['loadavg_end']:.2f} at end")
    print(describe(machine["edgeprefill"]))
    print("\n".join(table(results)))
    print("\n".join(near_only(results)))
    print("\n".join(report_placement(
        {name: {"core_ns": [ns for r in runs for ns in r.get("core_ns", [])]}
         for name, runs in results.items()})))
    for name, runs in results.items():
        versions = next((r["versions"] for r in runs if "versions" in r), {})
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
