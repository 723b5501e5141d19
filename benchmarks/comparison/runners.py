"""Export the checkpoint for one runtime and measure it in its own process."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from probes.core_latency import all_near

from comparison.models import ModelInfo
from comparison.procs import last_json_line, run_step
from comparison.registry import Runtime, is_ours
from comparison.settings import RUNNERS_DIR, Settings, StepError, say
from comparison.venvs import ensure_venv, venv_python


def artifact_dir(runtime: Runtime, model: ModelInfo) -> Path:
    """Where a runtime's model is: its export, or the checkpoint itself (no exporter)."""
    if runtime.export is None:
        return model.hf_dir
    return model.hf_dir.parent / "exports" / runtime.name


def export_artifact(runtime: Runtime, settings: Settings, model: ModelInfo) -> tuple[Path, float]:
    """Export the checkpoint for one runtime; returns (artifact dir, export seconds).

    Exports are cached next to the checkpoint, keyed by the exact command, except edgeprefill's:
    the project changes under active development, so its bundle is rebuilt on every run."""
    out = artifact_dir(runtime, model)
    if runtime.export is None:
        return out, 0.0
    cmd = runtime.export(runtime, settings, model.hf_dir, out)
    marker = out.parent / f"{runtime.name}.done.json"
    cached = marker.exists() and json.loads(marker.read_text()) == cmd
    if cached and not settings.reexport and not is_ours(runtime.name):
        return out, 0.0
    say(f"  exporting for {runtime.name}")
    marker.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    python = venv_python(runtime.venv, settings)
    start = time.perf_counter()
    run_step(cmd, out.parent / f"{runtime.name}.export.log", python, settings)
    marker.write_text(json.dumps(cmd))
    return out, time.perf_counter() - start


# --------------------------------------------------------------------------- measurements


def write_spec(run_dir: Path, name: str, spec: dict[str, Any]) -> Path:
    path = run_dir / f"{name}.spec.json"
    path.write_text(json.dumps(spec))
    return path


def run_runtime(
    runtime: Runtime,
    settings: Settings,
    model: ModelInfo,
    prompts: dict,
    run_dir: Path,
    turn: int = 0,
) -> dict[str, Any]:
    """Install, export (first round only) and measure one runtime. Any failure becomes
    {"error": ...}."""
    say(f"[{runtime.name}] {runtime.description}")
    result: dict[str, Any] = {"runtime": runtime.name, "precision": runtime.precision}
    step = "setup"
    try:
        start = time.perf_counter()
        python = ensure_venv(runtime.venv, settings)
        result["setup_s"] = time.perf_counter() - start
        step = "export"
        if turn == 0:
            artifact, result["export_s"] = export_artifact(runtime, settings, model)
        else:
            artifact = artifact_dir(runtime, model)
        step = "measure"
        spec = {
            "runtime": runtime.name,
            "artifact_dir": str(artifact),
            "threads": settings.threads,
            "lengths": settings.lengths,
            "repeats": settings.repeats,
            "warmup": settings.warmup,
            "decode_prompt_len": settings.decode_prompt_len,
            "new_tokens": settings.new_tokens,
            "prompts": prompts,
            "model_config": model.config,
            "options": {"chunk_size": settings.chunk_size, **dict(runtime.options)},
        }
        cmd = [
            str(python),
            str(RUNNERS_DIR / runtime.runner),
            str(write_spec(run_dir, runtime.name, spec)),
        ]
        start = time.perf_counter()
        log_name = f"{runtime.name}.{turn}.log" if turn else f"{runtime.name}.log"
        output = run_step(cmd, run_dir / log_name, python, settings)
        result["measure_s"] = time.perf_counter() - start
        result.update(last_json_line(output))
    except (StepError, OSError) as error:
        result["error"] = f"{step}: {error}"
        say(f"  {runtime.name} failed at {step}: {str(error).strip().splitlines()[-1]}")
    return result


def pool_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several rounds of a runtime: every timed run pooled, medians
    recomputed; peak RSS (the process's, and the run's after the load) is the highest
    round's. A failed round's error wins."""
    failed = [r for r in runs if "error" in r]
    if failed or len(runs) == 1:
        return failed[0] if failed else runs[0]
    pooled = {**runs[0], "rounds": len(runs)}
    pooled["ttft"] = {}
    for length, first in runs[0]["ttft"].items():
        times = [t for r in runs for t in r["ttft"][length]["runs_s"]]
        pooled["ttft"][length] = {**first, "runs_s": times, "median_s": statistics.median(times)}
    rates = [rate for r in runs for rate in r["decode_runs_tok_s"]]
    pooled["decode_runs_tok_s"] = rates
    pooled["decode_tok_s"] = statistics.median(rates)
    pooled["load_s"] = statistics.median(r["load_s"] for r in runs)
    pooled["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
    run_peaks = [r.get("run_peak_rss_mib") for r in runs]
    pooled["run_peak_rss_mib"] = None if None in run_peaks else max(run_peaks)
    pooled["measure_s"] = sum(r.get("measure_s", 0.0) for r in runs)
    pooled["core_ns"] = [ns for r in runs for ns in r.get("core_ns", [])]
    near = [r for r in runs if all_near(r.get("core_ns") or [])]
    if near and len(near) < len(runs):  # for the near-only verdicts (comparison/targets.py)
        pooled["near"] = pool_rounds(near)
    return pooled
