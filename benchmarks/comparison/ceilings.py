"""The machine's ceilings (fp32 GEMM rate, read bandwidth) and the floors they give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from comparison.models import ModelInfo
from comparison.procs import last_json_line, run_step
from comparison.runners import write_spec
from comparison.settings import RUNNERS_DIR, Settings, StepError, say
from comparison.venvs import ensure_venv


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

