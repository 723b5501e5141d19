"""Every measurement behind issue 15's targets in one go, for the quiet machine:

    python benchmarks/issue15_targets.py --work-dir /work/benchwork

1. compare.py, 2 rounds taking turns, TTFT 128/2048 and decode 512+128, over edgeprefill
   (fp32, int8, int4, each also with --compute bf16), ONNX Runtime GenAI (fp32, int4),
   OpenVINO GenAI (default precision, f32, int8, int4) and the llama.cpp entries of the
   registry whose venv exists; its report
   ends with the TTFT-2048 and decode targets met or missed per precision;
2. spin.py: busy-wait on and off over 10 fresh processes each (edgeprefill int4 bundle);
3. batched_decode.py: 4 sessions against one (edgeprefill fp32 bundle);
4. mixed_workload.py: 3 sessions + a 2,048-token prompt at 64 tokens per step against
   OpenVINO's ContinuousBatchingPipeline, 2 rounds.

Run it after the comparator venvs and exports exist in --work-dir (a first compare.py run
makes them), so that it only measures. Every step's output goes to the terminal and to
<work-dir>/issue15/<time>/<step>.log; a failed step is reported and the next one runs.
Standard library only, like compare.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from compare import parse_args as compare_args
from comparison.models import ModelInfo, build_model
from comparison.provenance import describe, package_origin
from comparison.registry import RUNTIMES
from comparison.runners import artifact_dir
from comparison.settings import BENCH_DIR, REPO_DIR, Settings, StepError
from comparison.venvs import VENV_PACKAGES, venv_python

BASE_RUNTIMES = ["edgeprefill", "edgeprefill-int8", "edgeprefill-int4", "edgeprefill-bf16",
                 "edgeprefill-int8-bf16", "edgeprefill-int4-bf16", "ortgenai", "ortgenai-int4",
                 "openvino", "openvino-f32", "openvino-int8", "openvino-int4"]
LLAMACPP_PREFIX = "llamacpp"


class Step(NamedTuple):
    name: str
    argv: Callable[[], list[str]]  # built when the step runs: later steps need earlier exports


def venv_ready(venv: str, settings: Settings) -> bool:
    """Installed as the registry asks (ensure_venv's marker): else compare.py would spend
    this run building it (llama.cpp compiles for about 20 minutes)."""
    marker = venv_python(venv, settings).parent.parent / "benchmark-installed.json"
    return marker.exists() and json.loads(marker.read_text()) == VENV_PACKAGES.get(venv)


def comparators(settings: Settings) -> list[str]:
    """The base list, plus the registry's llama.cpp entries (not in compare.py's default
    list) whose venv is built."""
    llamacpp = [name for name in RUNTIMES if name.startswith(LLAMACPP_PREFIX)]
    ready = [name for name in llamacpp if venv_ready(RUNTIMES[name].venv, settings)]
    if llamacpp and not ready:
        print(f"issue15: no venv for {', '.join(llamacpp)} in {settings.work_dir}/venvs: "
              "llama.cpp is left out", file=sys.stderr)
    return BASE_RUNTIMES + ready


def bundle(settings: Settings, runtime: str) -> str:
    model: ModelInfo = build_model(settings)
    return str(artifact_dir(RUNTIMES[runtime], model))


def steps(args: argparse.Namespace, settings: Settings, out: Path) -> list[Step]:
    python, bench = str(args.project_python), BENCH_DIR
    work = ["--work-dir", str(args.work_dir)]
    return [
        Step("compare", lambda: [
            python, str(bench / "compare.py"), *work, "--rounds", "2", "--lengths", "128,2048",
            "--runtimes", ",".join(comparators(settings)), "--threads", str(args.threads),
            "--project-python", python, "--json", str(out / "compare.json")]),
        Step("spin", lambda: [
            python, str(bench / "spin.py"), bundle(settings, args.spin_runtime),
            "--processes", "10", "--threads", str(args.threads),
            "--json", str(out / "spin.json")]),
        Step("batched_decode", lambda: [
            python, str(bench / "batched_decode.py"), bundle(settings, args.batched_runtime),
            "--sessions", "1,4", "--threads", str(args.threads)]),
        Step("mixed_workload", lambda: [
            python, str(bench / "mixed_workload.py"), *work, "--rounds", "2", "--reuse-bundles",
            "--threads", str(args.threads), "--json", str(out / "mixed.json")]),
    ]


def run(step: Step, log: Path) -> tuple[int, float]:
    start = time.perf_counter()
    try:
        argv = step.argv()
    except (StepError, OSError) as error:  # no model to find the bundle of: say so, go on
        log.write_text(f"{error}\n")
        print(f"issue15: {step.name}: cannot start: {error}", file=sys.stderr)
        return 1, 0.0
    print(f"issue15: {step.name}: {' '.join(argv)}", file=sys.stderr, flush=True)
    with log.open("w") as sink, subprocess.Popen(argv, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.write(line)
            sink.write(line)
    return child.returncode, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=BENCH_DIR / "work")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--project-python", type=Path, default=REPO_DIR / ".venv/bin/python",
                        help="python of the venv edgeprefill is installed in")
    parser.add_argument("--steps", default="compare,spin,batched_decode,mixed_workload",
                        help="comma-separated subset of the steps, in this order")
    parser.add_argument("--spin-runtime", default="edgeprefill-int4",
                        help="the compare.py export spin.py loads")
    parser.add_argument("--batched-runtime", default="edgeprefill",
                        help="the compare.py export batched_decode.py loads")
    args = parser.parse_args(argv)
    settings = compare_args(["--work-dir", str(args.work_dir), "--lengths", "128,2048"])
    out = settings.work_dir / "issue15" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    wanted = [s.strip() for s in args.steps.split(",") if s.strip()]
    chosen = [s for s in steps(args, settings, out) if s.name in wanted]
    if len(chosen) != len(wanted):
        parser.error("--steps: choose from compare, spin, batched_decode, mixed_workload")
    print(f"issue15: {describe(package_origin(args.project_python))}", file=sys.stderr)
    started, summary = time.perf_counter(), []
    for step in chosen:
        code, seconds = run(step, out / f"{step.name}.log")
        summary.append(f"  {step.name:<16} {'ok' if code == 0 else f'FAILED ({code})':<12} "
                       f"{seconds / 60:5.1f} min")
    print(f"\nissue 15 measurements in {out} ({(time.perf_counter() - started) / 60:.1f} min):")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
