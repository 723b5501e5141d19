"""The sweep's results as a fixed-width table and as JSON."""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path
from typing import NamedTuple

from edgeprefill.bench.output_file import replaced
from edgeprefill.bench.workload import RunResult, Workload


class Column(NamedTuple):
    title: str
    unit: str
    width: int


COLUMNS = (
    Column("config", "", 22),
    Column("long TTFT", "ms", 11),
    Column("urgent TTFT", "ms", 13),
    Column("ITL p50", "ms", 9),
    Column("ITL p99", "ms", 9),
    Column("ITL max", "ms", 9),
    Column("max stall", "ms", 11),
    Column("prefill", "tok/s", 10),
    Column("decode", "tok/s", 10),
    Column("peak RSS", "MiB", 10),
)


def table(results: list[RunResult]) -> str:
    lines = [_row([c.title for c in COLUMNS]), _row([c.unit for c in COLUMNS])]
    lines += [_row(_cells(r)) for r in results]
    return "\n".join(lines)


def _cells(r: RunResult) -> list[str]:
    return [
        r.label, _ms(r.long_ttft_s), _ms(r.urgent_ttft_s), _ms(r.itl_p50_s), _ms(r.itl_p99_s),
        _ms(r.itl_max_s), _ms(r.max_stall_s), f"{r.prefill_tokens_per_s:.0f}",
        f"{r.decode_tokens_per_s:.0f}",
        "-" if r.peak_rss_bytes is None else f"{r.peak_rss_bytes / 2**20:.0f}",
    ]


def _row(cells: list[str]) -> str:
    first, *rest = zip(COLUMNS, cells, strict=True)
    return first[1].ljust(first[0].width) + "".join(v.rjust(c.width) for c, v in rest)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def write_json(path: Path, bundle: Path, workload: Workload, results: list[RunResult]) -> None:
    """Every number of the table, unrounded, plus each run's engine calls (the timeline)."""
    runs = []
    for r in results:
        run = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "timeline"}
        run["steps"] = [
            {"kind": t.kind, "start_s": t.start, "end_s": t.end, "tokens": t.tokens,
             "lanes": [r.timeline.lanes[i] for i in t.request_ids if i in r.timeline.lanes]}
            for t in r.timeline.steps
        ]
        runs.append(run)
    document = {
        "bundle": str(bundle),
        "workload": dataclasses.asdict(workload),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "runs": runs,
    }
    with replaced(path) as partial:
        partial.write_text(json.dumps(document, indent=1))
