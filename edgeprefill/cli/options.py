"""Option parsing shared by several commands."""

from __future__ import annotations

import click


def parse_int_list(ctx: click.Context, param: click.Parameter, value: str | None):
    if value is None:
        return None
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not items or any(v < 1 for v in items):
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return items


spin_option = click.option(
    "--spin/--no-spin", default=False, show_default=True,
    help="Let idle compute threads busy-wait between ops. Off by default: on shared or "
    "virtual CPUs spinning threads often land in a 2-3x slower mode (docs/benchmarks.md).",
)
