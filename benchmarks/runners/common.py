"""Measurement loop shared by the runtime runners.

Each runner runs in its own virtualenv, so this module uses the standard library only.
A runner supplies a `load(spec) -> Loaded`; `run_runner` times it, measures TTFT and decode
the same way for every runtime, and prints one JSON line with the results on stdout.
"""

from __future__ import annotations

import importlib.metadata
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# generate(prompt_ids, max_new_tokens) -> [(seconds since the call started, token id), ...]
# with one entry per generated token, recorded the moment the token is known.
GenerateFn = Callable[[list[int], int], list[tuple[float, int]]]


@dataclass
class Loaded:
    generate: GenerateFn
    # Extra facts for the report known at load (for example the chunk size used).
    extra: dict[str, Any] = field(default_factory=dict)
    # Called after the measurements, outside every timing; what it returns joins the result
    # (cache hit counts, weight bytes read per decoded token).
    report: Callable[[], dict[str, Any]] | None = None


def log(message: str) -> None:
    """Progress goes to stderr with a prefix, so compare.py can echo it and keep stdout clean."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def package_versions(names: list[str]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def rss_mib() -> dict[str, float]:
    """Current (VmRSS) and peak (VmHWM) resident set size of this process, in MiB."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values


def reset_peak_rss() -> bool:
    """Restarts this process's peak RSS (VmHWM) from its current RSS (Linux >= 4.0's
    /proc/self/clear_refs "5"), so that the next reading is the peak since: False where the
    kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def measure_ttft(
    generate: GenerateFn, prompts: list[list[int]], warmup: int
) -> tuple[list[float], list[int]]:
    """TTFT = prompt ids in, first generated token out (full prefill + first logits).

    Every run gets its own prompt (the first `warmup` ones only warm up): repeating a prompt
    would let a runtime with a prefix cache skip the prefill it is being timed on."""
    for prompt in prompts[:warmup]:
        generate(prompt, 1)
    times, first_tokens = [], []
    for prompt in prompts[warmup:]:
        (seconds, token), *_ = generate(prompt, 1)
        times.append(seconds)
        first_tokens.append(token)
    return times, first_tokens


def measure_decode(
    generate: GenerateFn, prompts: list[list[int]], new_tokens: int
) -> tuple[list[float], list[int]]:
    """Decode rate excludes the first token (that one is prefill): (n - 1) / (t_last - t_first).
    Returns the rates and the tokens of the last run."""
    rates = []
    token_ids: list[int] = []
    for prompt in prompts:
        stamps = generate(prompt, new_tokens)
        if len(stamps) != new_tokens:
            raise RuntimeError(f"asked for {new_tokens} new tokens, got {len(stamps)}")
        rates.append((len(stamps) - 1) / (stamps[-1][0] - stamps[0][0]))
        token_ids = [token for _, token in stamps]
    return rates, token_ids


def run_runner(load: Callable[[dict[str, Any]], Loaded], packages: list[str]) -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    name = spec["runtime"]
    prompts = spec["prompts"]

    start = time.perf_counter()
    loaded = load(spec)
    load_s = time.perf_counter() - start
    after_load = rss_mib()
    rss_after_load = after_load["VmRSS"]
    log(f"{name}: loaded in {load_s:.2f} s, RSS {rss_after_load:.0f} MiB")
    # The load's peak (a runtime may hold a second copy of its weights while converting
    # them) hides what generating holds, the KV cache and the activations: the peak
    # restarts here, and the run's own peak is reported beside the process's.
    run_peak_known = reset_peak_rss()

    ttft: dict[str, dict[str, Any]] = {}
    for length, length_prompts in prompts["ttft"].items():
        runs, first_tokens = measure_ttft(loaded.generate, length_prompts, spec["warmup"])
        ttft[length] = {
            "median_s": statistics.median(runs),
            "runs_s": runs,
            "first_tokens": first_tokens,
        }
        log(f"{name}: TTFT {length} tokens: " + ", ".join(f"{r:.3f}" for r in runs) + " s")

    rates, token_ids = measure_decode(loaded.generate, prompts["decode"], spec["new_tokens"])
    log(f"{name}: decode " + ", ".join(f"{r:.1f}" for r in rates) + " tok/s")

    run_peak = rss_mib()["VmHWM"]  # since the reset, or the whole process's without it
    result = {
        "runtime": name,
        "threads": spec["threads"],
        "load_s": load_s,
        "ttft": ttft,
        "decode_tok_s": statistics.median(rates),
        "decode_runs_tok_s": rates,
        "generated_ids": token_ids,
        "rss_after_load_mib": rss_after_load,
        # The whole process's peak: the load's or the run's, whichever is higher (ru_maxrss,
        # in KiB, may follow the reset above, so both readings are kept).
        "peak_rss_mib": max(after_load["VmHWM"], run_peak,
                            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "run_peak_rss_mib": run_peak if run_peak_known else None,
        "versions": package_versions(packages),
        **loaded.extra,
        **(loaded.report() if loaded.report else {}),
    }
    print(json.dumps(result), flush=True)
