"""The report: header with machine and ceilings, the metric table, the status lines."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.core_latency import FAR_NS

from comparison.ceilings import decode_floor_tok_s, params_without_embedding
from comparison.models import ModelInfo
from comparison.provenance import describe, package_origin
from comparison.registry import is_ours
from comparison.settings import REFERENCE_PRECISION, Settings
from comparison.targets import report_targets


@dataclass(frozen=True)
class Metric:
    label: str
    unit: str
    higher_is_better: bool


def metric_values(result: dict[str, Any], settings: Settings) -> dict[str, float | None]:
    """Each metric's value for one runtime; None where it was not measured (the run's own
    peak RSS in results from before it was, or where the kernel refused the reset)."""
    values: dict[str, float | None] = {
        f"ttft{n}": result["ttft"][str(n)]["median_s"] for n in settings.lengths}
    values["decode"] = result["decode_tok_s"]
    values["rss"] = result["peak_rss_mib"]
    values["rss_run"] = result.get("run_peak_rss_mib")
    values["load"] = result["load_s"]
    return values


def metrics(settings: Settings) -> dict[str, Metric]:
    table = {f"ttft{n}": Metric(f"TTFT {n} tok", "s", False) for n in settings.lengths}
    decode_label = f"decode {settings.decode_prompt_len}+{settings.new_tokens}"
    table["decode"] = Metric(decode_label, "tok/s", True)
    table["rss"] = Metric("peak RSS", "MiB", False)
    # The peak after the load: what generating holds (weights, KV cache, activations),
    # without a load's transient copies, which the process's peak above includes.
    table["rss_run"] = Metric("RSS generating", "MiB", False)
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
    if key in ("rss", "rss_run") and result["precision"] == "fp32":
        return floor["fp32_weight_bytes_resident"] / (value * 2**20)
    return None


def advantage(value: float, reference: float, higher_is_better: bool) -> float:
    """How many times better than the reference; > 1 means better, whatever the unit."""
    return value / reference if higher_is_better else reference / value



def best_reference(
    key: str,
    metric: Metric,
    values: dict[str, dict[str, float | None]],
    results: dict[str, dict[str, Any]],
    precision: str,
) -> tuple[str, float] | None:
    """Best comparator (not edgeprefill) of `precision`, or fp32 where none has it."""

    def candidates(wanted: str) -> list[tuple[str, float]]:
        return [
            (name, value)
            for name, v in values.items()
            if (value := v[key]) is not None and not is_ours(name)
            and results[name]["precision"] == wanted
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
        describe(machine["edgeprefill"]),
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
            value = v[key]
            row = f"{metric.label:<18}{name:<22}{ok[name]['precision']:<10}"
            if value is None:
                lines.append(f"{row}{'-':>14}{'-':>10}{'-':>10}")
                continue
            reference = best_reference(key, metric, values, ok, ok[name]["precision"])
            ratio = "-"
            if reference:
                ratio = f"{advantage(value, reference[1], metric.higher_is_better):.2f}x"
            fraction = floor_fraction(key, value, ok[name], floor)
            shown = "-" if fraction is None else f"{fraction:.0%}"
            if fraction is not None and fraction > 1.0:
                # Faster than the measured hardware allows: skipped work or a noisy ceiling.
                shown += " !"
            lines.append(f"{row}{format_value(value, metric.unit):>14}{ratio:>10}{shown:>10}")
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


def report_placement(results: dict[str, dict[str, Any]]) -> list[str]:
    """The core-to-core latency measured before and after each runtime's run of each round
    (probes/core_latency.py): on the 2-vCPU VMs the host sometimes places the two CPUs far
    apart, and edgeprefill's prefill is then ~30% slower (docs/benchmarks.md, 2026-11-25)."""
    seen = {name: r.get("core_ns", []) for name, r in results.items()}
    if not any(ns is not None for values in seen.values() for ns in values):
        return []
    lines = [f"core-to-core latency before/after each round's run, ns (> {FAR_NS:.0f}: the "
             "two CPUs were placed far apart; compare runtimes within one placement):"]
    width = max(22, *(len(name) + 2 for name in seen))
    for name, values in seen.items():
        shown = " ".join("n/a" if ns is None else f"{ns:.0f}" for ns in values)
        far = sum(ns is not None and ns > FAR_NS for ns in values)
        lines.append(f"  {name:<{width}}{shown}" + (f"  ({far} far)" if far else ""))
    return lines


def print_report(report: dict[str, Any], settings: Settings, model: ModelInfo) -> None:
    lines = report_header(settings, model, report["ceilings"], report["floors"], report["machine"])
    lines += ["", *report_table(settings, report["runtimes"], report["floors"])]
    lines += report_status(report["runtimes"])
    lines += ["", *report_targets(report["runtimes"])]
    placement = report_placement(report["runtimes"])
    lines += ["", *placement] if placement else []
    lines += [
        "",
        "vs best: times better than the best comparator (any runtime not edgeprefill) of the row's "
        "precision, fp32 where none has it (int8); >1.00x = better (less time/memory, more tok/s).",
        "of floor: hardware floor / measured (100% = at the machine's ceiling; ! = above 100%: "
        "work was skipped or a ceiling was under-measured); RSS floor = fp32 weights held once.",
        "peak RSS: the whole process's, the load's included; RSS generating: the peak after the "
        "load (weights as held, KV cache, activations).",
        "=torch: greedy tokens equal to torch's: first token of each TTFT prompt, then the "
        "common prefix of the last decode run.",
        f"total run time {report['timings']['total_s']:.0f} s; logs in {report['run_dir']}",
    ]
    print("\n".join(lines))


# ---------------------------------------------------------------------------------- main


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (every benchmark table names it), else
    what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_info(project_python: Path) -> dict[str, Any]:
    return {
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "edgeprefill": package_origin(project_python),
    }
