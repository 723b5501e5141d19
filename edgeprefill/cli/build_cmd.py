"""`edgeprefill build`: compile a bundle's standard chunk graph into a TensorRT engine."""

from __future__ import annotations

from pathlib import Path

import click

from edgeprefill.engines.trt.build import BuildOptions, build_engine
from edgeprefill.engines.trt.cache import PRECISIONS


@click.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="engine precision (default: the bundle's dtype; a float32 bundle builds "
                   "at fp32 only; int8 needs a Q/DQ-quantized graph)")
@click.option("--workspace", "workspace_mib", type=click.IntRange(min=1), default=None,
              help="builder workspace limit in MiB (default: TensorRT's)")
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="most sessions decoded in one call (the decode profile's batch range)")
@click.option("--capacity", type=click.IntRange(min=2), default=None,
              help="KV positions per slot (default: the bundle's max context)")
@click.option("--force", is_flag=True, help="rebuild even when a matching engine is cached")
def build(
    bundle: Path, precision: str | None, workspace_mib: int | None, max_batch: int,
    capacity: int | None, force: bool,
) -> None:
    """Compile BUNDLE's standard chunk graph into one TensorRT engine: a profile per chunk
    bucket plus the decode profile, weights stored once, cached in BUNDLE/engines/ for this
    GPU and TensorRT version. Run it with `edgeprefill run BUNDLE --backend tensorrt`.

    \b
    Example:
      edgeprefill export ~/models/SmolLM2-135M -o build/smollm2-std --flavor standard --dtype fp16
      edgeprefill build build/smollm2-std --precision fp16
    """
    options = BuildOptions(precision, workspace_mib, max_batch, capacity, force)
    result = build_engine(bundle, options, click.echo)
    if result.reused:
        click.echo(f"engine up to date: {result.engine} (use --force to rebuild)")
    else:
        click.echo(f"built {result.engine} in {result.seconds:.1f} s")
