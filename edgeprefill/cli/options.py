"""Options shared by several commands, declared once.

The engine options (`--backend`, `--device`, `--threads`, ...) are the same for `run`,
`serve` and `bench`: each is one click option named after one `EngineConfig` or
`SchedulerConfig` field, so `@engine_options(...)` hands the command a dict it passes
straight to `Engine.load(bundle, **engine)`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from edgeprefill.engines import BACKENDS
from edgeprefill.engines.base import COMPUTES
from edgeprefill.errors import RequestError
from edgeprefill.sdk.scheduler import POLICIES

DEVICES = ("cpu", "cuda", "tensorrt")  # BackendOptions.device


def parse_int_list(ctx: click.Context | None, param: click.Parameter | None,
                   value: str | None) -> list[int] | None:
    """`16,64,256` -> [16, 64, 256]; a click callback, and the one integer-list parser."""
    if value is None:
        return None
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated positive integers like 16,64, "
                                 f"got {value!r}") from None
    if not items or any(v < 1 for v in items):
        raise click.BadParameter(f"expected comma-separated positive integers like 16,64, "
                                 f"got {value!r}")
    return items


spin_option = click.option(
    "--spin/--no-spin", default=None,
    help="Let compute threads busy-wait between ops while a step runs (never between "
    "steps). --no-spin for a CPU shared with other busy processes (docs/benchmarks.md). "
    "[default: spin, unless EDGEPREFILL_SPIN=off]",
)

# config field -> its click option. The parameter name is the field name.
ENGINE_OPTIONS: dict[str, Callable] = {
    "backend": click.option(
        "--backend", type=click.Choice(list(BACKENDS)), default="onnxruntime",
        show_default=True, help="Runtime that runs the graph (tensorrt: `edgeprefill build` "
        "first)."),
    "device": click.option(
        "--device", type=click.Choice(DEVICES), default="cpu", show_default=True,
        help="onnxruntime's execution provider: cpu or cuda (tensorrt, its TensorRT "
        "provider, is refused with the reason; for TensorRT use --backend tensorrt)."),
    "threads": click.option(
        "--threads", type=click.IntRange(min=1), default=None,
        help="CPU threads for the backend [default: physical cores]."),
    "spin": spin_option,
    "compute": click.option(
        "--compute", type=click.Choice(COMPUTES), default="fp32", show_default=True,
        help="Arithmetic of a float32 bundle's projections and of every bundle's prefill "
        "attention. bf16: operands rounded to bf16, sums in fp32 (OpenVINO's default on CPUs "
        "with bf16): ~2x faster prefill and decode with AVX512-BF16 (without it, on AVX2: "
        "faster decode only), not exact; needs the native kernels. With AVX512-BF16, where "
        "they run every attention layer, the KV cache is bf16 too: "
        "half the memory (EDGEPREFILL_BF16_KV=off keeps it fp32)."),
    "warm_up": click.option(
        "--warm-up/--no-warm-up", default=True, show_default=True,
        help="At load, run one call of the largest prefill chunk (or --chunk-size) and one "
        "decode call, so the first request does not pay for ONNX Runtime's lazy set-up "
        "(one chunk's compute at load: 0.12-0.5 s for a 135M bundle on 2 cores; 8-40 ms "
        "off the first TTFT)."),
    "kv_slots": click.option(
        "--kv-slots", type=click.IntRange(min=1), default=4, show_default=True,
        help="Conversations whose KV cache is held at once."),
    "max_context": click.option(
        "--max-context", type=click.IntRange(min=2), default=None,
        help="Positions per KV slot (prompt + reply) [default: the bundle's max context]."),
    "policy": click.option(
        "--policy", type=click.Choice(POLICIES), default="chunked+priority",
        show_default=True, help="Scheduling policy."),
    "chunk_size": click.option(
        "--chunk-size", type=click.IntRange(min=1), default=None,
        help="Fixed prefill chunk in tokens [default: adaptive over the bundle's buckets, "
        "see --itl-target-ms]."),
    "itl_target_ms": click.option(
        "--itl-target-ms", type=click.FloatRange(min=0, min_open=True), default=150.0,
        show_default=True, help="Adaptive chunking keeps decode inter-token latency under "
        "this (run and serve refuse it beside --chunk-size or --policy fcfs, which chunk by no "
        "target)."),
    "fuse_steps": click.option(
        "--fuse-steps/--no-fuse-steps", default=None,
        help="Run a prefill chunk and the decode rows in one call where the bundle and "
        "kernels allow it (`inspect` says), reading the weights once per step [default: "
        "where they allow it; --fuse-steps also warns where they do not]."),
    "prefill_rows": click.option(
        "--prefill-rows", type=click.IntRange(min=1), default=None,
        help="Prompts whose prefill chunks one fused step carries, each its own row, within "
        "one chunk's tokens; applies where steps fuse (see --fuse-steps); 1: one prompt a "
        "step, as --policy fcfs, which refuses more [default: as many as the slots "
        "allow]."),
}


def engine_options(*names: str) -> Callable:
    """Add the named engine options (all if none are named) to a click command; the
    command receives their values as one dict argument `engine`, keyed by config field."""
    chosen = names or tuple(ENGINE_OPTIONS)
    unknown = [n for n in chosen if n not in ENGINE_OPTIONS]
    if unknown:
        raise ValueError(f"unknown engine options {unknown}; known: {list(ENGINE_OPTIONS)}")

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)  # also shares click's list of the options below this one
        def gather(**kwargs: Any) -> Any:
            engine = {name: kwargs.pop(name) for name in chosen}
            _refuse_an_unused_itl_target(engine)
            return command(engine=engine, **kwargs)

        for name in reversed(chosen):
            gather = ENGINE_OPTIONS[name](gather)
        return gather

    return decorate


def _refuse_an_unused_itl_target(engine: dict[str, Any]) -> None:
    """--itl-target-ms steers adaptive chunking only: given beside a fixed --chunk-size or
    --policy fcfs it would be ignored without a word (as fcfs refuses --chunk-size)."""
    if "itl_target_ms" not in engine or click.get_current_context().get_parameter_source(
            "itl_target_ms") is not ParameterSource.COMMANDLINE:
        return
    if engine.get("chunk_size") is not None:
        raise RequestError("--itl-target-ms steers the adaptive chunk size, which --chunk-size "
                           "replaces; give one of them")
    if engine.get("policy") == "fcfs":
        raise RequestError("--itl-target-ms does not apply to the fcfs policy, which "
                           "prefills each prompt in one call; use chunked or chunked+priority")


class SectionedCommand(click.Command):
    """A command whose --help lists its options under headings, as the README groups
    them: `sections` maps a heading to parameter names; the rest (--help) follow under
    "Other options"."""

    def __init__(self, *args: Any, sections: dict[str, tuple[str, ...]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sections = sections

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Options only: click 8.2+ gives arguments a help record too, and BUNDLE is
        # already in the usage line.
        records = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx)
                   if isinstance(p, click.Option)}
        placed = {name for names in self.sections.values() for name in names}
        groups = [*self.sections.items(),
                  ("Other options", tuple(n for n in records if n not in placed))]
        for heading, names in groups:
            rows = [record for name in names if (record := records.get(name))]
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)
