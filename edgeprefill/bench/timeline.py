"""The timeline picture: one lane per request, engine calls as bars over time.

One panel per run, stacked on a shared time axis (0 = the long prompt arrives): the
unchunked baseline shows one long prefill bar that every session's decode waits
behind; a chunked run shows short chunk bars with the sessions' decode steps between.
"""

from __future__ import annotations

from pathlib import Path

from edgeprefill.bench.output_file import replaced
from edgeprefill.bench.workload import RunResult, Timeline, longest_decode_gap
from edgeprefill.errors import EdgeprefillError

PREFILL_COLOR = "#e8772e"
DECODE_COLOR = "#3b75af"
STALL_COLOR = "#c0392b"
MIN_BAR_FRACTION = 0.0015  # of the time axis: a 1-ms decode step still shows as a bar


def require_matplotlib(path: Path | None = None) -> None:
    """Fail before a long sweep, not after it: no matplotlib, or a `path` whose suffix
    names no format matplotlib writes."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise EdgeprefillError(
            "--plot needs matplotlib: pip install 'edgeprefill[bench]'"
        ) from None
    if path is None:
        return
    formats = Figure().canvas.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise EdgeprefillError(f"--plot {path}: the suffix names no image format; use one "
                               f"of {', '.join('.' + f for f in sorted(formats))}")


def draw(results: list[RunResult], path: Path) -> None:
    """Write a PNG (or any format matplotlib knows from the suffix) of these runs."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    lanes = max(len(r.timeline.lanes) for r in results)
    fig, axes = plt.subplots(
        len(results), 1, sharex=True, squeeze=False,
        figsize=(13, 0.9 + len(results) * (0.42 * lanes + 0.9)),
    )
    span = max(_end(r.timeline) for r in results)
    start = -0.06 * span  # a few decode steps before the long prompt arrives
    for ax, result in zip(axes[:, 0], results, strict=True):
        _panel(ax, result, (start, span))
    axes[-1, 0].set_xlabel("time since the long prompt arrived (ms)")
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=PREFILL_COLOR, label="prefill call"),
        plt.Rectangle((0, 0), 1, 1, color=DECODE_COLOR, label="decode step"),
        plt.Line2D([], [], marker="v", color="black", linestyle="", label="request arrives"),
        plt.Line2D([], [], marker="o", color="#2a9d4b", linestyle="", label="first token"),
    ]
    fig.legend(handles=handles, loc="upper center", ncol=4, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    try:
        with replaced(path) as partial:  # the suffix names the format; the temporary's not
            fig.savefig(partial, dpi=120, format=path.suffix.lstrip(".").lower())
    finally:
        plt.close(fig)


def _panel(ax, result: RunResult, xlim: tuple[float, float]) -> None:
    timeline = result.timeline
    zero = timeline.arrivals["long prompt"]
    names = list(dict.fromkeys(timeline.lanes.values()))
    row = {name: len(names) - 1 - i for i, name in enumerate(names)}  # first lane on top
    min_width = MIN_BAR_FRACTION * (xlim[1] - xlim[0])
    for kind, color in (("decode", DECODE_COLOR), ("prefill", PREFILL_COLOR)):
        for name in names:
            bars = [
                ((t.start - zero) * 1000, max((t.end - t.start) * 1000, min_width))
                for t in timeline.steps
                if t.kind == kind and name in (timeline.lanes.get(i) for i in t.request_ids)
            ]
            ax.broken_barh(bars, (row[name] - 0.35, 0.7), facecolors=color, linewidth=0)
    _marks(ax, timeline, row, zero)
    _longest_stall(ax, timeline, [row[n] for n in names if n.startswith("session")], zero)
    ax.set_yticks(list(row.values()), list(row))
    ax.set_ylim(-0.6, len(names) - 0.1)  # headroom for the stall label
    ax.set_xlim(*xlim)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(_title(result), loc="left", fontsize=10)


def _marks(ax, timeline: Timeline, row: dict[str, int], zero: float) -> None:
    for name, arrival in timeline.arrivals.items():
        ax.plot((arrival - zero) * 1000, row[name] + 0.45, "v", color="black", markersize=7)
    for name, first in timeline.first_tokens.items():
        ax.plot((first - zero) * 1000, row[name], "o", color="#2a9d4b", markersize=7,
                markeredgecolor="white")


def _longest_stall(ax, timeline: Timeline, rows: list[int], zero: float) -> None:
    """Shade the longest wait of the sessions between two decode steps, from one's end
    (a token out) to the next one's (the next token): the cost that chunking is there to
    cut, measured as the table's max stall is (the engine's max_decode_stall_s). A decode
    step fused with a prefill chunk ends with it."""
    pair = longest_decode_gap(timeline.steps, zero)
    if pair is None or not rows:
        return
    before, after = pair
    x0, x1 = (before.end - zero) * 1000, (after.end - zero) * 1000
    low, high = min(rows) - 0.45, max(rows) + 0.45
    ax.fill_betweenx([low, high], x0, x1, color=STALL_COLOR, alpha=0.12, linewidth=0)
    ax.annotate("", xy=(x0, high - 0.1), xytext=(x1, high - 0.1),
                arrowprops={"arrowstyle": "<->", "color": STALL_COLOR, "lw": 1.2})
    ax.text((x0 + x1) / 2, high + 0.05, f"{x1 - x0:.1f} ms between tokens", ha="center",
            va="bottom", color=STALL_COLOR, fontsize=9)


def _title(r: RunResult) -> str:
    what = {"fcfs": "traditional prefill (fcfs: the whole prompt in one call)",
            "adaptive": "chunked prefill, adaptive chunk size (chunked+priority)"}.get(
        r.policy, f"chunked prefill, {r.chunk_size}-token chunks ({r.policy})")
    urgent = "" if r.urgent_ttft_s is None else f", urgent TTFT {r.urgent_ttft_s * 1000:.0f} ms"
    return (f"{what}: sessions' max inter-token latency {r.itl_max_s * 1000:.0f} ms, "
            f"long-prompt TTFT {r.long_ttft_s * 1000:.0f} ms{urgent}")


def _end(timeline: Timeline) -> float:
    """ms from the long prompt's arrival to the last engine call."""
    zero = timeline.arrivals["long prompt"]
    return (max(t.end for t in timeline.steps) - zero) * 1000
