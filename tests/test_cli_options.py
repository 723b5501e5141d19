"""Engine options are declared once: each is one config field, with the config's default,
and `run`, `serve` and `bench` pass them to the engine unchanged."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest
from click.testing import CliRunner

from edgeprefill.cli import bench_cmd, run_cmd, serve_cmd
from edgeprefill.cli.main import cli
from edgeprefill.cli.options import ENGINE_OPTIONS, parse_int_list
from edgeprefill.sdk import EngineConfig, SchedulerConfig

CONFIG_DEFAULTS = {f.name: f.default for c in (EngineConfig, SchedulerConfig)
                   for f in dataclasses.fields(c)}


def params(command: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in command.params}


def test_each_engine_option_is_one_config_field_with_the_configs_default():
    for name in ENGINE_OPTIONS:
        assert name in CONFIG_DEFAULTS, name
        for command in (run_cmd.run, serve_cmd.serve):
            assert params(command)[name].default == CONFIG_DEFAULTS[name], (command, name)


def test_run_serve_and_bench_take_the_same_declarations():
    run, serve, bench = params(run_cmd.run), params(serve_cmd.serve), params(bench_cmd.bench)
    for name in ENGINE_OPTIONS:
        assert run[name].opts == serve[name].opts
    for name in ("backend", "device", "threads", "spin", "max_context", "itl_target_ms"):
        assert bench[name].opts == run[name].opts


def test_bench_hands_the_engine_options_to_every_run(bundle, monkeypatch):
    seen = []

    def capture(bundle_path, specs, workload, json_path):
        seen.append(workload)
        raise SystemExit(0)

    monkeypatch.setattr(bench_cmd, "_run_all", capture)
    CliRunner().invoke(cli, ["bench", str(bundle("llama")), "--backend", "onnxruntime",
                             "--device", "cpu", "--threads", "1", "--no-spin",
                             "--max-context", "256", "--chunk-sizes", "16"])
    (workload,) = seen
    assert (workload.backend, workload.device, workload.threads, workload.spin,
            workload.max_context) == ("onnxruntime", "cpu", 1, False, 256)
    assert workload.prompt_tokens == 256 * 3 // 4  # the default follows --max-context


def test_a_wrong_device_or_backend_is_refused_by_every_command(bundle):
    for command in ("run", "serve", "bench"):
        result = CliRunner().invoke(cli, [command, str(bundle("llama")), "--device", "tpu"])
        assert result.exit_code == 2 and "'tpu' is not one of" in result.output


@pytest.mark.parametrize("text, expected", [("16,64", [16, 64]), ("8, 32,", [8, 32])])
def test_the_integer_list_parser_reads_lists(text, expected):
    assert parse_int_list(None, None, text) == expected


@pytest.mark.parametrize("text", ["", "a,b", "0,16", "-4"])
def test_the_integer_list_parser_refuses_anything_else(text):
    with pytest.raises(click.BadParameter, match="positive integers like 16,64"):
        parse_int_list(None, None, text)


@pytest.mark.parametrize("command", ["export", "run", "inspect", "serve", "bench", "build"])
def test_every_option_of_every_command_has_a_help_text(command):
    from edgeprefill.cli.main import LazyGroup

    options = LazyGroup().get_command(click.Context(cli), command).params
    assert [o.name for o in options if isinstance(o, click.Option) and not o.help] == []


@pytest.mark.parametrize("command, said", [
    ("serve", ["/v1/embeddings", "/api/embed", "/v1/rerank and /rerank"]),
    ("inspect", ["task (generate; embed: its pooling and named prompts; score: its head, "
                 "labels, relevance and pair format)"]),
    ("export", ["It replaces a GGUF reranker's own rerank template; without it a classifier "
                "reads a pair as its tokenizer's pair encoding."]),
])
def test_help_names_the_embedding_and_score_bundles(command, said):
    # what each command does with the other tasks' bundles, as README's Embeddings and
    # Reranking say (hyphenated words wrap at their hyphen)
    shown = re.sub(r"-\s+", "-", " ".join(CliRunner().invoke(cli, [command, "--help"])
                                        .output.split()))
    assert [text for text in said if text not in shown] == []


def test_serve_help_lists_every_option_once_under_its_heading():
    help_text = CliRunner().invoke(cli, ["serve", "--help"]).output
    headings = ["Server options:", "Engine options (as run's):", "Limits and timeouts:",
                "Other options:"]
    starts = [help_text.index(h) for h in headings]
    assert starts == sorted(starts)
    ends = [*starts[1:], len(help_text)]
    sections = {h: help_text[a:b] for h, a, b in zip(headings, starts, ends, strict=True)}
    assert "--api-key" in sections["Server options:"]
    assert "--kv-slots" in sections["Engine options (as run's):"]
    assert "--max-pending" in sections["Limits and timeouts:"]
    assert "--reasoning-budget" in sections["Server options:"]
    # --help alone: no argument (BUNDLE) listed as if it were an option
    assert sections["Other options:"].split()[:4] == ["Other", "options:", "-h,", "--help"]
    assert len(sections["Other options:"].strip().splitlines()) == 2
    for param in serve_cmd.serve.params:
        if isinstance(param, click.Option):
            flag = max(param.opts, key=len)
            assert help_text.count(f"  {flag} ") + help_text.count(f"  {flag}\n") == 1, flag
