"""`edgeprefill bench`: the mixed workload swept over policies and chunk sizes."""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.core import ParameterSource
from tqdm import tqdm

from edgeprefill.bench import (
    SWEEP_POLICIES,
    RunResult,
    RunSpec,
    Workload,
    report,
    sweep_specs,
    timeline,
)
from edgeprefill.bench.workload import check_fits, run_isolated
from edgeprefill.bundle import load_manifest
from edgeprefill.cli.options import engine_options, parse_int_list
from edgeprefill.sdk.priority import parse_priority

DEFAULT_PROMPT_CAP = 2048


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--sessions", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Interactive sessions decoding while the long prompt arrives.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=None,
              help=f"Length of the long prompt [default: 3/4 of the bundle's context, at "
              f"most {DEFAULT_PROMPT_CAP}].")
@click.option("--policies", default=",".join(SWEEP_POLICIES), show_default=True,
              help="Comma-separated policies to compare; adaptive = chunked+priority with "
              "the adaptive chunk size.")
@click.option("--chunk-sizes", default=None, callback=parse_int_list,
              help="Comma-separated fixed chunk sizes for chunked and chunked+priority "
              "[default: the bundle's chunk buckets].")
@click.option("--urgent/--no-urgent", default=True, show_default=True,
              help="A short request arrives while the long prompt prefills.")
@click.option("--urgent-tokens", type=click.IntRange(min=1), default=16, show_default=True,
              help="Prompt length of the short request.")
@click.option("--urgent-priority", default="high", show_default=True,
              help="Its priority (lower is served first; the long prompt has 0): an "
              "integer or high/normal/low; normal measures equal priority.")
@click.option("--reply-tokens", type=click.IntRange(min=1), default=8, show_default=True,
              help="Tokens the long prompt and the urgent request generate.")
# The sweep itself sets the policy and chunk size, and the KV slots from --sessions.
@engine_options("backend", "device", "threads", "spin", "compute", "max_context",
                "itl_target_ms", "fuse_steps", "prefill_rows")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Draw a timeline (PNG) of fcfs against one chunked run (an existing file "
              "is replaced, whole or not at all).")
@click.option("--plot-config", default=None,
              help="The chunked run drawn by --plot, by its table label, e.g. "
              "chunked+priority/64 [default: chunked+priority, smallest chunk].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write every number and each run's engine calls as JSON (an "
              "existing file is replaced, whole or not at all).")
def bench(
    bundle: Path, sessions: int, prompt_tokens: int | None, policies: str,
    chunk_sizes: list[int] | None, urgent: bool, urgent_tokens: int, urgent_priority: str,
    reply_tokens: int, plot: Path | None, plot_config: str | None, json_path: Path | None,
    engine: dict,
) -> None:
    """Measure how BUNDLE serves interactive sessions while a long prompt arrives: TTFT,
    inter-token latency of the sessions (p50/p99/max), the longest decode stall, prefill
    and decode tokens/s and peak memory, for unchunked prefill (fcfs) against chunked
    prefill at each chunk size and the adaptive chunk size.

    \b
    Example:
      edgeprefill bench build/tiny-recall --sessions 3 --prompt-tokens 1024 \\
          --plot timeline.png --json bench.json
    """
    chosen = _policies(policies)
    _refuse_unused(chosen, urgent, plot is not None)
    manifest = load_manifest(bundle, False)
    context = engine["max_context"] or manifest.max_context
    workload = Workload(
        sessions=sessions, urgent=urgent, reply_tokens=reply_tokens,
        urgent_prompt_tokens=urgent_tokens, urgent_priority=parse_priority(urgent_priority),
        prompt_tokens=prompt_tokens or min(DEFAULT_PROMPT_CAP, context * 3 // 4), **engine,
    )
    sizes = chunk_sizes or list(manifest.chunks)
    specs = sweep_specs(chosen, sizes)
    _check_plot_config(plot_config, specs)
    check_fits(context, workload)
    # The sweep takes minutes: an output it could not write must fail now, not after it.
    for path, option in ((json_path, "--json"), (plot, "--plot")):
        if path is not None:
            _check_writable(path, option)
    if plot is not None:
        timeline.require_matplotlib(plot)
    results = _run_all(bundle, specs, workload, json_path)
    click.echo(report.table(results))
    if json_path is not None:
        report.write_json(json_path, bundle, workload, results)
        click.echo(f"wrote {json_path}", err=True)
    if plot is not None:
        timeline.draw(_plotted(results, plot_config), plot)
        click.echo(f"wrote {plot}", err=True)


def _run_all(bundle: Path, specs: list[RunSpec], workload: Workload,
             json_path: Path | None) -> list[RunResult]:
    results: list[RunResult] = []
    try:
        with tqdm(specs, desc="bench", unit="run", leave=False) as progress:
            for spec in progress:
                progress.set_postfix_str(spec.label)
                results.append(run_isolated(bundle, spec, workload))
    except KeyboardInterrupt:
        # Ctrl-C minutes into a sweep: the finished runs' rows and numbers are still worth
        # having. The one line main() prints says so.
        if not results:
            raise
        click.echo(report.table(results))
        kept = "the rows above are the finished ones"
        if json_path is not None:
            report.write_json(json_path, bundle, workload, results)
            kept += f", their numbers in {json_path}"
        raise KeyboardInterrupt(f"after {len(results)} of {len(specs)} runs; {kept}") from None
    return results


def _plotted(results: list[RunResult], label: str | None) -> list[RunResult]:
    """fcfs (if it ran) above the chosen chunked run."""
    baseline = [r for r in results if r.policy == "fcfs"]
    others = [r for r in results if r.policy != "fcfs"]
    if label is not None:
        chosen = [r for r in others if r.label == label]
    else:
        fixed = sorted((r for r in others if r.policy == "chunked+priority"),
                       key=lambda r: r.chunk_size)
        chosen = (fixed or others)[:1]
    return baseline[:1] + chosen


# option -> (what it does, the policies it needs, or none) for _refuse_unused
FIXED = ("chunked", "chunked+priority")
POLICY_OPTIONS = {
    "chunk_sizes": ("--chunk-sizes", "sizes the chunked and chunked+priority runs", FIXED),
    "itl_target_ms": ("--itl-target-ms", "steers the adaptive run's chunk size", ("adaptive",)),
    "prefill_rows": ("--prefill-rows", "caps the prompts of a chunked run's shared prefill "
                     "step", (*FIXED, "adaptive")),
}
URGENT_OPTIONS = {"urgent_tokens": "--urgent-tokens", "urgent_priority": "--urgent-priority"}


def _refuse_unused(policies: list[str], urgent: bool, plot: bool) -> None:
    """An option given on the command line that the chosen sweep would ignore is refused
    in one line naming both (it had been accepted and ignored: --chunk-sizes beside
    --policies fcfs,adaptive, --urgent-tokens beside --no-urgent, --plot-config without
    --plot)."""
    ctx = click.get_current_context()

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE

    for name, (option, does, needs) in POLICY_OPTIONS.items():
        if given(name) and not set(needs) & set(policies):
            raise click.UsageError(f"{option} {does}, which --policies "
                                   f"{','.join(policies)} leaves out")
    for name, option in URGENT_OPTIONS.items():
        if given(name) and not urgent:
            raise click.UsageError(f"{option} describes the urgent request, which "
                                   "--no-urgent leaves out")
    if given("plot_config") and not plot:
        raise click.UsageError("--plot-config chooses the run --plot draws; give --plot too")


def _check_plot_config(label: str | None, specs: list[RunSpec]) -> None:
    labels = [s.label for s in specs if s.policy != "fcfs"]
    if label is not None and not labels:
        raise click.BadParameter("this sweep has no chunked run to draw; add a chunked "
                                 "policy to --policies", param_hint="--plot-config")
    if label is not None and label not in labels:
        raise click.BadParameter(f"{label!r} is not in this sweep; choose one of: "
                                 f"{', '.join(labels)}", param_hint="--plot-config")


def _check_writable(path: Path, option: str) -> None:
    folder = path.parent
    if not folder.is_dir():
        raise click.BadParameter(f"{folder} is not a folder", param_hint=option)
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise click.BadParameter(f"cannot write {path}", param_hint=option)


def _policies(text: str) -> list[str]:
    names = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in names if p not in SWEEP_POLICIES]
    if unknown or not names:
        raise click.BadParameter(f"unknown policy {', '.join(unknown) or '(none)'}; choose from: "
                                 f"{', '.join(SWEEP_POLICIES)}", param_hint="--policies")
    return names

