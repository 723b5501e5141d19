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
import platform
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RUNNERS_DIR = BENCH_DIR / "runners"

# A bare `torch` requirement pulls GBs of CUDA wheels; torch==2.13.0 resolves to a local CPU
# wheel. It is installed first, then repeated in every later install so nothing replaces it.
TORCH_PIN = "torch==2.13.0"
VENV_PACKAGES: dict[str, list[str]] = {
    # Builds the checkpoint and runs the transformers baseline.
    "torch": [TORCH_PIN, "transformers>=5,<6", "tokenizers", "safetensors", "numpy"],
    # The GenAI model builder imports torch, transformers 5.x, onnx and onnx_ir.
    "ortgenai": [TORCH_PIN, "onnxruntime-genai", "onnx", "onnx-ir", "transformers>=5,<6", "numpy"],
    # optimum-onnx pins transformers < 4.58, hence its own venv. accelerate lets its exporter
    # deduplicate the tied embedding / LM head, as a user following its docs would get.
    "optimum": [TORCH_PIN, "optimum-onnx[onnxruntime]", "accelerate"],
    "ceilings": ["numpy", "onnx", "onnxruntime"],
}
PROJECT_VENV = "project"  # edgeprefill runs from the project's own venv, never a copy
MODEL_FORMAT = 1  # bump when runners/build_model.py changes what it writes

SMOLLM2_135M_SHAPE: dict[str, Any] = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
    # transformers' default 0.02 gives a model whose greedy output collapses into one token
    # repeated after a 512-token prompt, so the token-agreement check between runtimes would
    # prove nothing. 0.05 keeps the output varied; the speed of dense fp32 is the same.
    "initializer_range": 0.05,
}
# Same architecture, tiny: for checking that every runtime installs, exports and runs.
QUICK_SHAPE: dict[str, Any] = {
    **SMOLLM2_135M_SHAPE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
# A ratio compares against the best comparator (not edgeprefill) of the row's precision,
# or of this one where no comparator has the row's precision (edgeprefill int8).
REFERENCE_PRECISION = "fp32"


@dataclass(frozen=True)
class Runtime:
    name: str
    venv: str
    runner: str
    quant: str  # fp32, int8 or int4: what the exporter is asked for
    description: str
    block_size: int | None = None  # int4 block; None = the exporter's default (32 for both)

    @property
    def precision(self) -> str:
        """What the row is compared under: the weights' precision and, where it is not the
        default, their int4 block (block 128 is compared with block 128 only)."""
        return self.quant if self.block_size is None else f"{self.quant}-b{self.block_size}"


RUNTIMES: dict[str, Runtime] = {
    runtime.name: runtime
    for runtime in [
        Runtime("edgeprefill", PROJECT_VENV, "run_edgeprefill.py", "fp32", "edgeprefill bundle"),
        Runtime(
            "edgeprefill-int8", PROJECT_VENV, "run_edgeprefill.py", "int8",
            "edgeprefill bundle, --quantize int8 (int8 weights and activations)",
        ),
        Runtime(
            "edgeprefill-int4", PROJECT_VENV, "run_edgeprefill.py", "int4",
            "edgeprefill bundle, --quantize int4 (MatMulNBits, block 32)",
        ),
        Runtime(
            "edgeprefill-int4-b128", PROJECT_VENV, "run_edgeprefill.py", "int4",
            "edgeprefill bundle, --quantize int4 --block-size 128", block_size=128,
        ),
        Runtime("ortgenai", "ortgenai", "run_ortgenai.py", "fp32", "ONNX Runtime GenAI fp32"),
        Runtime("ortgenai-int4", "ortgenai", "run_ortgenai.py", "int4", "ONNX Runtime GenAI int4"),
        Runtime(
            "ortgenai-int4-b128", "ortgenai", "run_ortgenai.py", "int4",
            "ONNX Runtime GenAI int4, block_size=128", block_size=128,
        ),
        Runtime("optimum", "optimum", "run_optimum.py", "fp32", "optimum ORTModelForCausalLM"),
        Runtime("torch", "torch", "run_torch.py", "fp32", "transformers + PyTorch eager"),
    ]
}


@dataclass(frozen=True)
class Settings:
    threads: int
    lengths: list[int]
    runtimes: list[str]
    repeats: int
    rounds: int
    warmup: int
    new_tokens: int
    decode_prompt_len: int
    quick: bool
    seed: int
    work_dir: Path
    json_path: Path | None
    reexport: bool
    timeout_s: int
    chunks: str
    chunk_size: int
    project_python: Path
    verbose: bool
    ceilings: bool = True


class StepError(Exception):
    """A setup, export or measurement step failed; the message is what the report shows."""


# ---------------------------------------------------------------------------- subprocesses


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def subprocess_env(threads: int, python: Path) -> dict[str, str]:
    """Environment for every child: its venv first on PATH, thread pools pinned, no network."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    env.update(
        {
            # Nothing can come from a model hub: fail fast instead of retrying.
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONNOUSERSITE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_logged(
    cmd: list[str], log_path: Path, env: dict[str, str], timeout_s: int, echo_all: bool
) -> str:
    """Run cmd, append its output to log_path, echo the runners' [bench] progress lines, and
    return stdout+stderr. Raises StepError on failure or timeout."""
    timed_out = threading.Event()
    lines: list[str] = []
    with log_path.open("a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO_DIR,
            errors="replace",
        )

        def kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                lines.append(line)
                if echo_all or line.startswith("[bench]"):
                    say("    " + line.rstrip()[:200])
            proc.wait()
        finally:
            timer.cancel()
    output = "".join(lines)
    if timed_out.is_set():
        raise StepError(f"timed out after {timeout_s} s (log: {log_path})")
    if proc.returncode != 0:
        raise StepError(f"exit code {proc.returncode} (log: {log_path}):\n{tail(output)}")
    return output


def run_step(cmd: list[str], log_path: Path, python: Path, settings: Settings) -> str:
    """run_logged with the run's thread count, timeout and verbosity, in python's venv."""
    env = subprocess_env(settings.threads, python)
    return run_logged(cmd, log_path, env, settings.timeout_s, settings.verbose)


def last_json_line(output: str) -> dict[str, Any]:
    """Libraries print to stdout too; the result is the last line that parses as a JSON object."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise StepError("no JSON result line in the output:\n" + tail(output))


# -------------------------------------------------------------------------------- venvs


def venv_python(venv: str, settings: Settings) -> Path:
    if venv == PROJECT_VENV:
        return settings.project_python
    return settings.work_dir / "venvs" / venv / "bin" / "python"


def ensure_venv(venv: str, settings: Settings) -> Path:
    """Create benchmarks/work/venvs/<venv> on first use; a marker records what was installed."""
    python = venv_python(venv, settings)
    if venv == PROJECT_VENV:
        if not python.exists():
            raise StepError(f"project venv python not found: {python}")
        return python
    venv_dir = python.parent.parent
    packages = VENV_PACKAGES[venv]
    marker = venv_dir / "benchmark-installed.json"
    if marker.exists() and json.loads(marker.read_text()) == packages:
        return python
    say(f"  setting up venv {venv_dir} (first use; this takes a few minutes)")
    log_path = settings.work_dir / "venvs" / f"{venv}.install.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = subprocess_env(settings.threads, python)
    env.pop("HF_HUB_OFFLINE")
    if not python.exists():
        run_logged([sys.executable, "-m", "venv", str(venv_dir)], log_path, env, 600, False)
    pip = [str(python), "-m", "pip", "install", "--progress-bar", "off"]
    if TORCH_PIN in packages:
        run_logged(pip + [TORCH_PIN], log_path, env, 1800, settings.verbose)
    run_logged(pip + packages, log_path, env, 1800, settings.verbose)
    marker.write_text(json.dumps(packages))
    return python


# -------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelInfo:
    name: str
    hf_dir: Path
    config: dict[str, Any]
    params: int
    embedding_params: int


def model_name(settings: Settings, config: dict[str, Any]) -> str:
    """Directory name: readable prefix plus a hash of everything that determines the weights."""
    key = {"config": config, "seed": settings.seed, "format": MODEL_FORMAT}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    prefix = "quick" if settings.quick else "smollm2-135m-shape"
    return f"{prefix}-seed{settings.seed}-{digest}"


def build_model(settings: Settings) -> ModelInfo:
    config = QUICK_SHAPE if settings.quick else SMOLLM2_135M_SHAPE
    name = model_name(settings, config)
    model_dir = settings.work_dir / "models" / name
    hf_dir = model_dir / "hf"
    info_path = model_dir / "build.json"
    if not info_path.exists():
        say(f"  building {hf_dir} (random fp32 weights, seed {settings.seed})")
        python = ensure_venv("torch", settings)
        shutil.rmtree(hf_dir, ignore_errors=True)
        model_dir.mkdir(parents=True, exist_ok=True)
        spec_path = model_dir / "build-spec.json"
        spec = {"out_dir": str(hf_dir), "seed": settings.seed, "config": config}
        spec_path.write_text(json.dumps(spec, indent=2))
        cmd = [str(python), str(RUNNERS_DIR / "build_model.py"), str(spec_path)]
        output = run_step(cmd, model_dir / "build.log", python, settings)
        info_path.write_text(json.dumps(last_json_line(output), indent=2))
    built = json.loads(info_path.read_text())
    return ModelInfo(name, hf_dir, config, built["params"], built["embedding_params"])


def prompt_sets(settings: Settings, vocab_size: int) -> dict[str, Any]:
    """Fixed-seed random ids above the special tokens (0-2), the same for every runtime.

    Each run, warm-up included, gets its own independent prompt: a runtime with a prefix
    cache must not be able to reuse the KV of an earlier run."""
    rng = random.Random(settings.seed)

    def prompts(length: int, count: int) -> list[list[int]]:
        return [[rng.randrange(3, vocab_size) for _ in range(length)] for _ in range(count)]

    runs = settings.warmup + settings.repeats
    return {
        "ttft": {str(n): prompts(n, runs) for n in settings.lengths},
        "decode": prompts(settings.decode_prompt_len, settings.repeats),
    }


# ------------------------------------------------------------------------------- exports


def max_context(settings: Settings) -> int:
    """Room for the longest TTFT prompt plus one token and for the decode run, rounded up."""
    needed = max(max(settings.lengths) + 1, settings.decode_prompt_len + settings.new_tokens)
    return -(-needed // 256) * 256


def genai_block_option(runtime: Runtime) -> list[str]:
    if runtime.block_size is None:
        return []
    return ["--extra_options", f"block_size={runtime.block_size}"]


def export_command(runtime: Runtime, settings: Settings, hf_dir: Path, out: Path) -> list[str]:
    python = str(venv_python(runtime.venv, settings))
    if runtime.name.startswith("ortgenai"):
        cache = out.parent / "genai-cache"
        return [
            python,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf_dir),
            "-o",
            str(out),
            "-p",
            runtime.quant,
            "-e",
            "cpu",
            "-c",
            str(cache),
            *genai_block_option(runtime),
        ]
    if runtime.name == "optimum":
        cli = str(Path(python).parent / "optimum-cli")
        return [
            cli,
            "export",
            "onnx",
            "--model",
            str(hf_dir),
            "--task",
            "text-generation-with-past",
            str(out),
        ]
    if is_ours(runtime.name):
        cli = str(Path(python).parent / "edgeprefill")
        quantize = [] if runtime.quant == "fp32" else ["--quantize", runtime.quant]
        if runtime.block_size:
            quantize += ["--block-size", str(runtime.block_size)]
        return [
            cli,
            "export",
            str(hf_dir),
            "-o",
            str(out),
            "--chunks",
            settings.chunks,
            "--max-context",
            str(max_context(settings)),
            *quantize,
            "--overwrite",
        ]
    raise ValueError(f"no export for {runtime.name}")


def artifact_dir(runtime: Runtime, model: ModelInfo) -> Path:
    """Where a runtime's model is: its export, or the checkpoint itself for torch."""
    if runtime.name == "torch":
        return model.hf_dir
    return model.hf_dir.parent / "exports" / runtime.name


def export_artifact(runtime: Runtime, settings: Settings, model: ModelInfo) -> tuple[Path, float]:
    """Export the checkpoint for one runtime; returns (artifact dir, export seconds).

    Exports are cached next to the checkpoint, keyed by the exact command, except edgeprefill's:
    the project changes under active development, so its bundle is rebuilt on every run."""
    out = artifact_dir(runtime, model)
    if runtime.name == "torch":
        return out, 0.0
    cmd = export_command(runtime, settings, model.hf_dir, out)
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
            "options": {"chunk_size": settings.chunk_size},
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
    recomputed; peak RSS is the highest round's. A failed round's error wins."""
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
    pooled["measure_s"] = sum(r.get("measure_s", 0.0) for r in runs)
    return pooled


def measure_ceilings(settings: Settings, hidden: int, intermediate: int, run_dir: Path) -> dict:
    if not settings.ceilings:
        return {"skipped": "--no-ceilings"}
    say("[ceilings] fp32 GEMM and memory bandwidth")
    square = 256 if settings.quick else 2048
    spec = {
        "threads": settings.threads,
        # A layer-shaped GEMM (longest prompt x hidden x intermediate) and a big square one.
        "gemm_shapes": [[max(settings.lengths), hidden, intermediate], [square] * 3],
        # 1 GiB dwarfs the 260 MiB L3 of the dev VM; --quick only checks that it runs.
        "bandwidth_mib": 64 if settings.quick else 1024,
        "repeats": max(5, settings.repeats),
    }
    try:
        python = ensure_venv("ceilings", settings)
        spec_path = write_spec(run_dir, "ceilings", spec)
        cmd = [str(python), str(RUNNERS_DIR / "ceilings.py"), str(spec_path)]
        output = run_step(cmd, run_dir / "ceilings.log", python, settings)
        return last_json_line(output)
    except (StepError, OSError) as error:
        say(f"  ceilings failed: {str(error).strip().splitlines()[-1]}")
        return {"error": str(error)}


# -------------------------------------------------------------------------------- floors


def params_without_embedding(config: dict[str, Any]) -> int:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_width = config["num_attention_heads"] * config["head_dim"]
    kv_width = config["num_key_value_heads"] * config["head_dim"]
    per_layer = (
        hidden * q_width  # q_proj
        + 2 * hidden * kv_width  # k_proj, v_proj
        + q_width * hidden  # o_proj
        + 3 * hidden * inter  # gate, up, down
        + 2 * hidden  # two RMSNorm weights
    )
    return config["num_hidden_layers"] * per_layer + hidden  # + final norm


def prefill_flops(config: dict[str, Any], tokens: int) -> float:
    """Least work to get the first token: every weight used once per prompt token (2 FLOPs per
    multiply-add), causal attention (QK^T and PV over the lower triangle), and the LM head
    for the last position only."""
    linear = 2.0 * params_without_embedding(config) * tokens
    q_width = config["num_attention_heads"] * config["head_dim"]
    attention = 2.0 * config["num_hidden_layers"] * q_width * tokens * (tokens + 1)
    lm_head = 2.0 * config["vocab_size"] * config["hidden_size"]
    return linear + attention + lm_head


def fp32_weight_bytes(config: dict[str, Any]) -> float:
    """Bytes of fp32 weights read per decoded token: all non-embedding weights plus the tied
    vocab x hidden matrix read once as the LM head (the embedding lookup reads one row)."""
    return 4.0 * (params_without_embedding(config) + config["vocab_size"] * config["hidden_size"])


def best_gemm(ceilings: dict[str, Any]) -> tuple[float, str] | None:
    rows = ceilings.get("gemm", [])
    if not rows:
        return None
    row = max(rows, key=lambda r: r["gflops_best"])
    shape = "x".join(str(d) for d in row["shape_mkn"])
    return row["gflops_best"] * 1e9, f"{row['backend']} {shape}"


def best_read_bandwidth(ceilings: dict[str, Any]) -> tuple[float, str] | None:
    rows = [r for r in ceilings.get("bandwidth", []) if r["read_only"]]
    if not rows:
        return None
    row = max(rows, key=lambda r: r["gbps_best"])
    return row["gbps_best"] * 1e9, row["method"]


def floors(settings: Settings, model: ModelInfo, ceilings: dict[str, Any]) -> dict[str, Any]:
    gemm, bandwidth = best_gemm(ceilings), best_read_bandwidth(ceilings)
    out: dict[str, Any] = {
        "prefill_gflop": {str(n): prefill_flops(model.config, n) / 1e9 for n in settings.lengths},
        "fp32_weight_bytes_per_token": fp32_weight_bytes(model.config),
        "fp32_weight_bytes_resident": 4.0 * model.params,
    }
    if gemm:
        out["gemm_flops"], out["gemm_source"] = gemm
        out["ttft_floor_s"] = {
            str(n): prefill_flops(model.config, n) / gemm[0] for n in settings.lengths
        }
    if bandwidth:
        out["read_bytes_per_s"], out["bandwidth_source"] = bandwidth
    return out


def decode_floor_tok_s(result: dict[str, Any], floor: dict[str, Any]) -> float | None:
    """fp32 runtimes share the analytic byte count; a quantized one reports the bytes of its
    own weights (from its ONNX initializers), since that is what it has to stream."""
    if "read_bytes_per_s" not in floor:
        return None
    if result["precision"] == "fp32":
        weight_bytes = floor["fp32_weight_bytes_per_token"]
    else:
        weight_bytes = result.get("weight_bytes_per_token")
    if not weight_bytes:
        return None
    return floor["read_bytes_per_s"] / weight_bytes


# -------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Metric:
    label: str
    unit: str
    higher_is_better: bool


def metric_values(result: dict[str, Any], settings: Settings) -> dict[str, float]:
    values = {f"ttft{n}": result["ttft"][str(n)]["median_s"] for n in settings.lengths}
    values["decode"] = result["decode_tok_s"]
    values["rss"] = result["peak_rss_mib"]
    values["load"] = result["load_s"]
    return values


def metrics(settings: Settings) -> dict[str, Metric]:
    table = {f"ttft{n}": Metric(f"TTFT {n} tok", "s", False) for n in settings.lengths}
    decode_label = f"decode {settings.decode_prompt_len}+{settings.new_tokens}"
    table["decode"] = Metric(decode_label, "tok/s", True)
    table["rss"] = Metric("peak RSS", "MiB", False)
    table["load"] = Metric("load time", "s", False)
    return table


def floor_fraction(key: str, value: float, result: dict[str, Any], floor: dict) -> float | None:
    """Fraction of the hardware floor reached: 1.0 means running at the machine's ceiling."""
    if key.startswith("ttft") and "ttft_floor_s" in floor:
        if result["precision"] != "fp32":
            return None  # the floor is an fp32 GEMM rate; int8 matrix units are faster
        return floor["ttft_floor_s"][key[4:]] / value
    if key == "decode":
        ceiling = decode_floor_tok_s(result, floor)
        return value / ceiling if ceiling else None
    if key == "rss" and result["precision"] == "fp32":
        return floor["fp32_weight_bytes_resident"] / (value * 2**20)
    return None


def advantage(value: float, reference: float, higher_is_better: bool) -> float:
    """How many times better than the reference; > 1 means better, whatever the unit."""
    return value / reference if higher_is_better else reference / value


def is_ours(name: str) -> bool:
    return name.startswith("edgeprefill")


def best_reference(
    key: str,
    metric: Metric,
    values: dict[str, dict[str, float]],
    results: dict[str, dict[str, Any]],
    precision: str,
) -> tuple[str, float] | None:
    """Best comparator (not edgeprefill) of `precision`, or fp32 where none has it."""

    def candidates(wanted: str) -> list[tuple[str, float]]:
        return [
            (name, v[key])
            for name, v in values.items()
            if not is_ours(name) and results[name]["precision"] == wanted
        ]

    found = candidates(precision) or candidates(REFERENCE_PRECISION)
    if not found:
        return None
    pick = max if metric.higher_is_better else min
    return pick(found, key=lambda item: item[1])


def format_value(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    return f"{value:.1f} {unit}"


def common_prefix(a: list[int], b: list[int]) -> int:
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same


def token_agreement(results: dict[str, dict[str, Any]], name: str) -> str:
    """Greedy tokens equal to torch's: the first token of every TTFT prompt, and the common
    prefix of the last decode run. Checks that every runtime computed the same model: fp32
    runtimes should agree on (nearly) all of them; int4 is expected to drift."""
    reference, mine = results.get("torch", {}), results[name]
    if name == "torch" or "ttft" not in reference:
        return "-"
    firsts_ref = [t for r in reference["ttft"].values() for t in r["first_tokens"]]
    firsts = [t for r in mine["ttft"].values() for t in r["first_tokens"]]
    first_same = sum(x == y for x, y in zip(firsts_ref, firsts, strict=False))
    decode_same = common_prefix(reference["generated_ids"], mine["generated_ids"])
    return f"{first_same}/{len(firsts_ref)} {decode_same}/{len(reference['generated_ids'])}"


def report_header(
    settings: Settings, model: ModelInfo, ceilings: dict, floor: dict, machine: dict[str, Any]
) -> list[str]:
    c = model.config
    lines = [
        f"edgeprefill comparative benchmark: {settings.threads} threads for every runtime "
        f"(--threads {settings.threads}), median of {settings.repeats * settings.rounds} runs "
        f"({settings.rounds} round(s) of {settings.repeats}, each after {settings.warmup} "
        "warm-up)",
        f"model {model.name}: Llama {c['num_hidden_layers']}L hidden {c['hidden_size']} "
        f"inter {c['intermediate_size']} heads {c['num_attention_heads']}/"
        f"{c['num_key_value_heads']} head_dim {c['head_dim']} vocab {c['vocab_size']} tied, "
        f"fp32 random weights; {model.params / 1e6:.1f}M params, "
        f"{params_without_embedding(c) / 1e6:.1f}M without embedding",
        f"machine: {machine['cpu']}, {machine['cpus']} CPUs; load average "
        f"{machine['loadavg_start']:.2f} at start, {machine.get('loadavg_end', 0):.2f} at end",
    ]
    if "skipped" in ceilings:
        lines.append("ceilings: not measured (--no-ceilings), so no floors ('of floor' shows -)")
        return lines
    if "error" in ceilings:
        lines.append("ceilings: FAILED (" + ceilings["error"].strip().splitlines()[-1] + ")")
        return lines
    for row in ceilings["gemm"]:
        shape = "x".join(str(d) for d in row["shape_mkn"])
        lines.append(
            f"  GEMM fp32 {row['backend']:<20} MxKxN {shape:<24} "
            f"{row['gflops_best']:6.1f} GFLOP/s best, {row['gflops_median']:6.1f} median"
        )
    for row in ceilings["bandwidth"]:
        lines.append(
            f"  memory {row['method']:<52} {row['gbps_best']:6.1f} GB/s best, "
            f"{row['gbps_median']:6.1f} median"
        )
    if "gemm_flops" in floor:
        ttft = ", ".join(f"{n}: {s:.3f} s" for n, s in floor["ttft_floor_s"].items())
        lines.append(
            f"prefill floor = model FLOPs / {floor['gemm_flops'] / 1e9:.1f} GFLOP/s "
            f"({floor['gemm_source']}): {ttft}"
        )
    if "read_bytes_per_s" in floor:
        per_token = floor["fp32_weight_bytes_per_token"]
        lines.append(
            f"decode floor = weight bytes per token / {floor['read_bytes_per_s'] / 1e9:.1f} GB/s "
            f"({floor['bandwidth_source']}): fp32 {per_token / 1e6:.0f} MB -> "
            f"{floor['read_bytes_per_s'] / per_token:.1f} tok/s"
        )
    return lines


def report_table(settings: Settings, results: dict[str, dict[str, Any]], floor: dict) -> list[str]:
    ok = {name: r for name, r in results.items() if "error" not in r}
    values = {name: metric_values(r, settings) for name, r in ok.items()}
    lines = [
        f"{'metric':<18}{'runtime':<22}{'prec':<10}{'value':>14}{'vs best':>10}{'of floor':>10}",
    ]
    for key, metric in metrics(settings).items():
        for name, v in values.items():
            reference = best_reference(key, metric, values, ok, ok[name]["precision"])
            ratio = "-"
            if reference:
                ratio = f"{advantage(v[key], reference[1], metric.higher_is_better):.2f}x"
            fraction = floor_fraction(key, v[key], ok[name], floor)
            shown = "-" if fraction is None else f"{fraction:.0%}"
            if fraction is not None and fraction > 1.0:
                # Faster than the measured hardware allows: skipped work or a noisy ceiling.
                shown += " !"
            lines.append(
                f"{metric.label:<18}{name:<22}{ok[name]['precision']:<10}"
                f"{format_value(v[key], metric.unit):>14}{ratio:>10}{shown:>10}"
            )
        lines.append("")
    return lines


def report_status(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"{'runtime':<22}{'status':<7}{'=torch':>16}{'export':>8}  versions / error"]
    for name, r in results.items():
        export = f"{r['export_s']:.0f} s" if r.get("export_s") else "-"
        if "error" in r:
            message = r["error"].strip().splitlines()
            shown = message[0] if len(message) == 1 else f"{message[0]} {message[-1]}"
            lines.append(f"{name:<22}{'ERROR':<7}{'-':>16}{export:>8}  {shown[:160]}")
            continue
        versions = ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items())
        if r.get("prefix_hits"):
            versions += f"; PREFIX CACHE HITS {r['prefix_hits']}: some prefill was skipped"
        lines.append(
            f"{name:<22}{'ok':<7}{token_agreement(results, name):>16}{export:>8}  {versions}"
        )
    return lines


def print_report(report: dict[str, Any], settings: Settings, model: ModelInfo) -> None:
    lines = report_header(settings, model, report["ceilings"], report["floors"], report["machine"])
    lines += ["", *report_table(settings, report["runtimes"], report["floors"])]
    lines += report_status(report["runtimes"])
    lines += [
        "",
        "vs best: times better than the best comparator (torch, ortgenai, optimum) of the row's "
        "precision, fp32 where none has it (int8); >1.00x = better (less time/memory, more tok/s).",
        "of floor: hardware floor / measured (100% = at the machine's ceiling; ! = above 100%: "
        "work was skipped or a ceiling was under-measured); RSS floor = fp32 weights held once.",
        "=torch: greedy tokens equal to torch's: first token of each TTFT prompt, then the "
        "common prefix of the last decode run.",
        f"total run time {report['timings']['total_s']:.0f} s; logs in {report['run_dir']}",
    ]
    print("\n".join(lines))


# ---------------------------------------------------------------------------------- main


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg()[0],
        "python": sys.version.split()[0],
    }


def parse_int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="threads for every runtime")
    parser.add_argument("--lengths", help="TTFT prompt lengths (default 128,512,2048)")
    parser.add_argument(
        "--runtimes",
        default=",".join(name for name, r in RUNTIMES.items() if r.block_size is None),
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
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per step")
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
    machine = machine_info()
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
            rounds[name].append(
                run_runtime(RUNTIMES[name], settings, model, prompts, run_dir, turn)
            )
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
