"""`edgeprefill bench` on the tiny model: a table, a PNG timeline and the raw JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgeprefill.cli.main import cli
from edgeprefill.errors import EdgeprefillError

pytest.importorskip("matplotlib")

LABELS = ["fcfs", "chunked/16", "chunked+priority/16", "adaptive"]


def test_bench_sweeps_policies_and_writes_table_png_and_json(bundle, tmp_path):
    png, raw = tmp_path / "timeline.png", tmp_path / "bench.json"
    result = CliRunner().invoke(cli, [
        "bench", str(bundle("llama")), "--sessions", "2", "--prompt-tokens", "200",
        "--chunk-sizes", "16", "--threads", "1", "--plot", str(png), "--json", str(raw),
    ])
    assert result.exit_code == 0, result.output
    table = result.stdout.splitlines()
    assert table[0].split()[:3] == ["config", "long", "TTFT"]
    assert [line.split()[0] for line in table[2:]] == LABELS

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    runs = {run["label"]: run for run in json.loads(raw.read_text())["runs"]}
    assert list(runs) == LABELS
    # Unchunked prefill is one call; 16-token chunks split 200 tokens into 13 calls.
    assert runs["fcfs"]["long_chunks"] == 1
    assert runs["chunked/16"]["long_chunks"] == math.ceil(200 / 16)
    for run in runs.values():
        assert run["itl_p50_s"] <= run["itl_p99_s"] <= run["itl_max_s"]
        assert run["urgent_ttft_s"] > 0 and run["prefill_tokens_per_s"] > 0
        kinds = {step["kind"] for step in run["steps"]}
        assert kinds == {"prefill", "decode"}
    # The timeline's lanes: under fcfs the long prompt is one call of all its tokens.
    fcfs_long = [s for s in runs["fcfs"]["steps"] if s["lanes"] == ["long prompt"]]
    assert len(fcfs_long) == 1 and fcfs_long[0]["tokens"] == 200


def test_bench_refuses_a_prompt_longer_than_the_context_with_the_fix(bundle):
    result = CliRunner().invoke(cli, ["bench", str(bundle("llama")), "--prompt-tokens", "5000"])
    assert isinstance(result.exception, EdgeprefillError)
    assert "--prompt-tokens 504 or less" in str(result.exception)


def test_bench_rejects_unknown_policies_with_the_valid_names(bundle):
    result = CliRunner().invoke(cli, ["bench", str(bundle("llama")), "--policies", "lifo"])
    assert result.exit_code == 2
    assert "choose from: fcfs, chunked, chunked+priority, adaptive" in result.output


@pytest.mark.parametrize("command", ["bench", "serve"])
def test_help_shows_an_example(command):
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output and f"edgeprefill {command} " in result.output


@pytest.mark.parametrize("args, message", [
    (["--json", "{tmp}/missing/bench.json"], "missing is not a folder"),
    (["--plot", "{tmp}/missing/x.png"], "missing is not a folder"),
    (["--plot", "{tmp}/timeline.txt"], "the suffix names no image format"),
    (["--plot", "{tmp}/t.png", "--plot-config", "chunked/16"],
     "this sweep has no chunked run to draw"),
])
def test_bench_refuses_outputs_it_could_not_write_before_the_sweep(bundle, tmp_path, monkeypatch,
                                                                    args, message):
    from edgeprefill.cli import bench_cmd

    def no_sweep(*_):
        raise AssertionError("the sweep ran before the outputs were checked")

    monkeypatch.setattr(bench_cmd, "_run_all", no_sweep)
    args = [a.format(tmp=tmp_path) for a in args]
    result = CliRunner().invoke(cli, ["bench", str(bundle("llama")), "--policies", "fcfs",
                                      *args])
    assert result.exit_code != 0
    assert message in (result.output + str(result.exception))


def test_bench_runs_a_policy_named_twice_once(bundle, monkeypatch):
    from edgeprefill.cli import bench_cmd

    seen = []
    monkeypatch.setattr(bench_cmd, "_run_all", lambda bundle, specs, workload, json_path:
                        seen.extend(s.label for s in specs) or [])
    monkeypatch.setattr(bench_cmd.report, "table", lambda results: "")
    CliRunner().invoke(cli, ["bench", str(bundle("llama")), "--policies", "fcfs,fcfs"])
    assert seen == ["fcfs"]


def test_the_plots_stall_is_the_tables_from_token_to_token():
    # A decode step fused with a long prefill chunk (fcfs) is the stall the table reports:
    # from one decode step's end to the next one's, as the engine's max_decode_stall_s.
    from edgeprefill.bench.timeline import _longest_stall
    from edgeprefill.bench.workload import Timeline
    from edgeprefill.sdk.config import StepTrace

    steps = [StepTrace("decode", 0.000, 0.001, (1,), 1),
             StepTrace("decode", 0.0015, 0.0025, (1,), 1),
             StepTrace("prefill", 0.003, 0.012, (2,), 512, fused=True),
             StepTrace("decode", 0.003, 0.012, (1,), 1, fused=True),
             StepTrace("decode", 0.0125, 0.0135, (1,), 1)]
    labels: list[str] = []

    class Axes:
        def fill_betweenx(self, *a, **k): pass
        def annotate(self, *a, **k): pass
        def text(self, x, y, s, **k): labels.append(s)

    _longest_stall(Axes(), Timeline(steps, {1: "session 1"}, {}, {}), [0], 0.0)
    assert labels == ["9.5 ms between tokens"]  # 2.5 ms -> 12 ms, the fused step's end
    # The longest gap may span the long prompt's arrival (here at 2 ms): the table counts
    # it, and the plot had left it out (it took only decode steps ending after the arrival).
    from edgeprefill.bench.workload import _max_stall

    labels.clear()
    _longest_stall(Axes(), Timeline(steps, {1: "session 1"}, {}, {}), [0], 0.0025)
    assert labels == ["9.5 ms between tokens"] and round(_max_stall(steps, 0.0025), 4) == 0.0095
    labels.clear()
    _longest_stall(Axes(), Timeline(steps, {1: "session 1"}, {}, {}), [0], 0.012)
    assert labels == ["9.5 ms between tokens"] and round(_max_stall(steps, 0.012), 4) == 0.0095


def test_ctrl_c_during_the_sweep_keeps_the_finished_runs_rows(bundle, monkeypatch, capsys,
                                                              tmp_path):
    # Ctrl-C (SIGINT) lands while the second run is under way: the first run's row is
    # printed and written to --json (it used to be lost), the command still ends as
    # interrupted (exit 130, no traceback) in one line that says what was kept.
    import json
    import sys

    from edgeprefill.cli import bench_cmd
    from edgeprefill.cli.main import main

    real_run = bench_cmd.run_isolated

    def interrupted_second(bundle, spec, workload):
        if spec.label != "fcfs":
            raise KeyboardInterrupt
        return real_run(bundle, spec, workload)

    monkeypatch.setattr(bench_cmd, "run_isolated", interrupted_second)
    monkeypatch.setattr(sys, "argv", [
        "edgeprefill", "bench", str(bundle("llama")), "--sessions", "1", "--prompt-tokens",
        "64", "--policies", "fcfs,chunked", "--chunk-sizes", "16", "--threads", "1",
        "--json", str(tmp_path / "bench.json")])
    with pytest.raises(SystemExit) as leaving:
        main()
    assert leaving.value.code == 130
    out, err = capsys.readouterr()
    rows = out.splitlines()
    assert rows[0].split()[:3] == ["config", "long", "TTFT"]
    assert [line.split()[0] for line in rows[2:]] == ["fcfs"]
    assert [line for line in err.splitlines()[-2:] if line.strip()] == [
        f"interrupted after 1 of 2 runs; the rows above are the finished ones, their numbers "
        f"in {tmp_path / 'bench.json'}"]
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert [run["label"] for run in saved["runs"]] == ["fcfs"]


def no_sweep(monkeypatch) -> list[str]:
    """bench with its sweep replaced by one that records the runs' labels and runs none."""
    from edgeprefill.cli import bench_cmd

    seen: list[str] = []
    monkeypatch.setattr(bench_cmd, "_run_all", lambda bundle, specs, workload, json_path:
                        seen.extend(s.label for s in specs) or [])
    monkeypatch.setattr(bench_cmd.report, "table", lambda results: "")
    return seen


# Each option that does nothing in the sweep the other options choose: it had been accepted
# and ignored.
@pytest.mark.parametrize("args, message", [
    (["--policies", "fcfs,adaptive", "--chunk-sizes", "16"],
     "--chunk-sizes sizes the chunked and chunked+priority runs, which --policies "
     "fcfs,adaptive leaves out"),
    (["--policies", "fcfs,chunked", "--itl-target-ms", "50"],
     "--itl-target-ms steers the adaptive run's chunk size, which --policies fcfs,chunked "
     "leaves out"),
    (["--policies", "fcfs", "--prefill-rows", "2"],
     "--prefill-rows caps the prompts of a chunked run's shared prefill step, which "
     "--policies fcfs leaves out"),
    (["--no-urgent", "--urgent-tokens", "8"],
     "--urgent-tokens describes the urgent request, which --no-urgent leaves out"),
    (["--no-urgent", "--urgent-priority", "low"],
     "--urgent-priority describes the urgent request, which --no-urgent leaves out"),
    (["--plot-config", "chunked/16"], "--plot-config chooses the run --plot draws; give "
                                      "--plot too"),
], ids=["chunk-sizes", "itl-target", "prefill-rows", "urgent-tokens", "urgent-priority",
      "plot-config"])
def test_bench_refuses_an_option_its_sweep_would_ignore_in_one_line(bundle, monkeypatch,
                                                                    capsys, args, message):
    import sys

    from edgeprefill.cli.main import main

    seen = no_sweep(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["edgeprefill", "bench", str(bundle("llama")), *args])
    capsys.readouterr()  # the bundle's export, where this test built it
    with pytest.raises(SystemExit) as leaving:
        main()
    assert leaving.value.code == 2 and seen == []
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message} (see `") and err.endswith(" bench --help`)\n")
    assert err.count("\n") == 1


@pytest.mark.parametrize("args, labels", [
    (["--policies", "chunked", "--chunk-sizes", "16,32"], ["chunked/16", "chunked/32"]),
    (["--policies", "fcfs,adaptive", "--itl-target-ms", "50"], ["fcfs", "adaptive"]),
    (["--policies", "fcfs", "--urgent-tokens", "8", "--urgent-priority", "low"], ["fcfs"]),
    (["--policies", "fcfs", "--no-urgent"], ["fcfs"]),
    (["--policies", "fcfs,adaptive", "--prefill-rows", "2"], ["fcfs", "adaptive"]),
])
def test_bench_takes_each_option_where_its_sweep_uses_it(bundle, monkeypatch, args, labels):
    seen = no_sweep(monkeypatch)
    result = CliRunner().invoke(cli, ["bench", str(bundle("llama")), *args])
    assert result.exit_code == 0, result.output
    assert seen == labels


def one_run():
    from edgeprefill.bench import RunResult, Timeline
    from edgeprefill.sdk.config import StepTrace

    steps = [StepTrace("decode", 0.0, 0.001, (1,), 1), StepTrace("prefill", 0.002, 0.01, (2,), 64),
             StepTrace("decode", 0.011, 0.012, (1,), 1)]
    timeline = Timeline(steps, {1: "session 1", 2: "long prompt"}, {"long prompt": 0.002},
                        {"long prompt": 0.01})
    return RunResult("fcfs", "fcfs", None, 0.01, None, 0.001, 0.01, 0.01, 0.01, 6400.0, 100.0,
                     None, 1, 0.012, timeline)


def fails_half_way(monkeypatch, owner, method: str) -> None:
    """owner.method writes half a file, then fails as a full disk does: the file is its
    first argument (Figure.savefig's) or, for a Path's own method, the Path."""
    import errno

    def half(self, target, *args, **kwargs):
        (self if isinstance(self, Path) else Path(target)).write_bytes(b"half a fi")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(owner, method, half)


@pytest.mark.parametrize("output", ["json", "png"])
def test_an_output_whose_write_fails_leaves_the_older_file_and_no_partial_one(
        tmp_path, monkeypatch, output):
    """bench replaces an existing --json or --plot file (as most CLIs do with an output
    they are told to write), but only whole: a write that fails part-way had left a
    truncated file where the older one had been."""
    import pathlib

    from matplotlib.figure import Figure

    from edgeprefill.bench import Workload, report, timeline

    path = tmp_path / f"bench.{output}"
    path.write_bytes(b"the older file")
    if output == "json":
        fails_half_way(monkeypatch, pathlib.Path, "write_text")
        write = lambda: report.write_json(path, tmp_path, Workload(), [one_run()])  # noqa: E731
    else:
        fails_half_way(monkeypatch, Figure, "savefig")
        write = lambda: timeline.draw([one_run()], path)  # noqa: E731
    with pytest.raises(OSError, match="No space left"):
        write()
    assert path.read_bytes() == b"the older file"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("output", ["json", "png"])
def test_an_output_that_exists_is_replaced_whole(tmp_path, output):
    from edgeprefill.bench import Workload, report, timeline

    path = tmp_path / f"bench.{output}"
    path.write_bytes(b"the older file")
    if output == "json":
        report.write_json(path, tmp_path, Workload(), [one_run()])
        assert [run["label"] for run in json.loads(path.read_text())["runs"]] == ["fcfs"]
    else:
        timeline.draw([one_run()], path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("policy, rows", [("fcfs", None), ("adaptive", 2), ("chunked", 2)])
def test_bench_gives_prefill_rows_to_its_chunked_runs_only(monkeypatch, policy, rows):
    # fcfs refuses prefill_rows (one whole prompt per call): the sweep's fcfs run must not
    # pass it on, and its chunked runs must.
    from edgeprefill.bench import RunSpec, Workload, workload

    loaded: list[dict] = []

    def load(bundle, **options):
        loaded.append(options)
        raise KeyboardInterrupt  # stop before the run

    monkeypatch.setattr(workload.Engine, "load", load)
    with pytest.raises(KeyboardInterrupt):
        workload.run_mixed(Path("unused"), RunSpec(policy, 16 if policy == "chunked" else None),
                           Workload(prefill_rows=2))
    assert loaded[0]["prefill_rows"] == rows
