"""Bad input is one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from click.testing import CliRunner

from edgeprefill.cli.main import main
from edgeprefill.errors import ExportError, RequestError
from edgeprefill.export.families import FAMILIES, REFUSED_TYPES

EDGEPREFILL = [sys.executable, "-m", "edgeprefill"]


def cli(*args: object, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`edgeprefill ARGS` through the console entry point, `main()` (its one-line errors and
    exit codes), in this process: a fresh interpreter costs about a second of imports per
    call. An exception main() lets out fails the test as a traceback would; what only a real
    process shows (the interpreter's exit, a closed pipe, signals) is `cli_process`'s."""
    argv = ["edgeprefill", *map(str, args)]
    with CliRunner().isolation(input=stdin) as (out, err, _), _console_script(argv), \
            _warnings_to_stderr():
        code = _exit_code(main)
        sys.stdout.flush()
        sys.stderr.flush()
        return subprocess.CompletedProcess(argv, code, out.getvalue().decode(),
                                           err.getvalue().decode())


def cli_process(*args: object, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`python -m edgeprefill ARGS` in a child process: the real entry point, end to end."""
    return subprocess.run([*EDGEPREFILL, *map(str, args)], capture_output=True, text=True,
                          input=stdin, timeout=120)


def _exit_code(entry) -> int:
    try:
        entry()
    except SystemExit as done:  # as the interpreter reads it: None is 0, a message is 1
        return 0 if done.code is None else done.code if isinstance(done.code, int) else 1
    return 0


@contextlib.contextmanager
def _console_script(argv: list[str]) -> Iterator[None]:
    """sys.argv and __main__ as the installed `edgeprefill` script has them: click names
    the program from them ("see `edgeprefill --help`", not pytest's `python -m pytest`).
    The signal handlers a command installs (export's SIGTERM) end with it, as its process
    would: pytest's own stay."""
    pytest_main = sys.modules["__main__"]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        with mock.patch.object(sys, "argv", argv):
            yield
    finally:
        sys.modules["__main__"] = pytest_main
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """Log records at WARNING and above go to stderr as the bare message, as the command's
    own process prints them (no handler configured: logging's last resort). Here pytest's
    capture handler sits on the root logger, so the last resort would never print."""
    handler = logging.StreamHandler(sys.stderr)  # the isolated stderr
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def hf_copy(hf_model, tmp_path) -> Path:
    dest = tmp_path / "hf"
    shutil.copytree(hf_model("llama"), dest)
    return dest


def test_unsupported_model_type_names_the_nearest_and_where_the_list_is(hf_copy, tmp_path):
    config = json.loads((hf_copy / "config.json").read_text())
    config["model_type"] = "mistrall"
    (hf_copy / "config.json").write_text(json.dumps(config))
    # In a child process: the real entry point's refusal, end to end.
    assert_one_line_error(cli_process("export", hf_copy, "-o", tmp_path / "b"),
                          "'mistrall' is not supported (nearest supported: mistral, ",
                          "`edgeprefill export --list-models`", "README.md's model table")


def test_list_models_prints_the_supported_types_then_the_refused_ones():
    result = cli("export", "--list-models")  # no HF_DIR nor -o asked for
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:len(FAMILIES)] == sorted(FAMILIES)
    assert lines[len(FAMILIES):] == [f"{name}: refused: {why}"
                                     for name, why in sorted(REFUSED_TYPES.items())]


@pytest.mark.parametrize("family, change, fragment", [
    ("ernie4_5_moe", {"use_bias": True}, "ernie4_5_moe: "),  # biases on every projection
    ("qwen3_5_moe_text", {"num_experts_per_tok": 9}, "num_experts_per_tok (9) must be 1 to"),
])
def test_a_mixture_of_experts_config_export_cannot_honour_is_one_line(
        family, change, fragment, hf_model, tmp_path):
    hf = shutil.copytree(hf_model(family), tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, **change}))
    assert_one_line_error(cli("export", hf, "-o", tmp_path / "b"), fragment,
                          next(iter(change)))


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_missing_file(hf_copy, tmp_path, missing):
    (hf_copy / missing).unlink()
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b"), missing)


def test_corrupt_files(hf_copy, tmp_path):
    (hf_copy / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b"), "safetensors")
    (hf_copy / "config.json").write_text("{not json")
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b"), "not valid JSON")


def test_max_context_beyond_the_model(hf_copy, tmp_path):
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b", "--max-context", 99999),
                          "exceeds the model's max_position_embeddings (1024)")


def test_export_refuses_to_overwrite_without_the_flag(hf_copy, tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert_one_line_error(cli("export", hf_copy, "-o", out), "--overwrite")
    assert_one_line_error(cli("export", hf_copy, "-o", out, "--overwrite"), "not an edgeprefill")
    assert (out / "notes.txt").read_text() == "mine"


def test_run_errors(bundle, tmp_path):
    path = bundle("llama")
    assert_one_line_error(cli("run", tmp_path, "--prompt", "w3"), "not an edgeprefill bundle")
    assert_one_line_error(cli("run", path, "--prompt", "w3 " * 600), "exceeds the context")
    assert_one_line_error(cli("run", path, "--prompt", ""), "empty")
    assert_one_line_error(cli("run", path, "--prompt", "w3", "--top-p", "0"), "--top-p")
    assert_one_line_error(cli("run", path), "exactly one of")
    assert_one_line_error(cli("run", path, "w3", "--prompt", "w4"), "not both")


@pytest.mark.parametrize("args, line", [
    (("run", "", "w3"), "the bundle path is empty"),
    (("inspect", ""), "the bundle path is empty"),
    (("export", "", "-o", "b"), "the model path is empty"),
    (("export", "m", "-o", ""), "the output path is empty"),
])
def test_an_empty_path_is_said_to_be_empty_not_the_current_folder(args, line):
    assert_one_line_error(cli(*args), f"error: {line}")


def test_a_prompt_starting_with_a_dash_is_refused_with_the_two_ways_to_give_it(bundle):
    """click reads `-say hi` as options; both ways the hint names take it as the prompt."""
    path = bundle("llama")
    hint = 'For a prompt that starts with "-", give it as --prompt "-..." or after --'
    assert_one_line_error(cli("run", path, "-say hi"), "No such option '-s'.", hint)
    near = cli("run", path, "--promt", "w3")  # a typo of an option: click's suggestion only
    assert_one_line_error(near, "Did you mean", "--prompt")
    assert "-..." not in near.stderr
    assert "-..." not in cli("run", path, "--bogus").stderr  # a long option is no prompt
    replies = [cli("run", path, "--max-new-tokens", "2", *args)
               for args in (["--prompt", "-say hi"], ["--", "-say hi"])]
    assert all(r.returncode == 0 for r in replies), [r.stderr for r in replies]
    assert replies[0].stdout == replies[1].stdout != ""  # greedy: the same prompt


def test_corrupt_bundle_is_refused(bundle, tmp_path):
    path = tmp_path / "b"
    shutil.copytree(bundle("llama"), path)
    with open(path / "model.onnx.data", "ab") as data:
        data.write(b"\0")
    assert_one_line_error(cli("run", path, "--prompt", "w3"), "wrong size")
    manifest = json.loads((path / "edgeprefill.json").read_text())
    manifest["format_version"] = 99
    (path / "edgeprefill.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli("inspect", path), "format version 99 is newer",
                          "upgrade edgeprefill")
    del manifest["format_version"]
    (path / "edgeprefill.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli("inspect", path), "edgeprefill.json has no format_version")


def test_a_newer_bundles_unknown_fields_are_ignored_with_a_warning(bundle, tmp_path):
    """Fields a newer edgeprefill adds without a format-version change are optional facts:
    this version runs the bundle as it would without them and names what it ignored."""
    path = tmp_path / "b"
    shutil.copytree(bundle("llama"), path)
    args = ("run", path, "--prompt", "w5 w6 w7", "--max-new-tokens", "4")
    want = cli_process(*args)  # the warning as a real process's logging prints it
    manifest = json.loads((path / "edgeprefill.json").read_text())
    manifest["graph"]["rows_share_a_call"] = True
    manifest["model"]["sliding_window_layers"] = []
    manifest["speculative"] = {"draft": "none"}
    (path / "edgeprefill.json").write_text(json.dumps(manifest))
    got = cli_process(*args)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout
    assert ("ignoring fields this edgeprefill does not know: model.sliding_window_layers, "
            "graph.rows_share_a_call, speculative") in got.stderr


def test_run_says_when_fuse_steps_cannot_apply(bundle):
    """A TensorRT-ready (standard) bundle never fuses: --fuse-steps says so on stderr and
    runs anyway; without the flag nothing is said."""
    args = ("run", bundle("llama", "standard"), "--prompt", "w5 w6", "--max-new-tokens", "2")
    asked = cli(*args, "--fuse-steps")
    assert asked.returncode == 0, asked.stderr
    assert "two calls here" in asked.stderr
    default = cli(*args)
    assert default.returncode == 0 and "two calls" not in default.stderr
    assert default.stdout == asked.stdout


def test_external_data_outside_the_bundle_is_refused(bundle, tmp_path):
    path = tmp_path / "b"
    shutil.copytree(bundle("llama"), path)
    manifest = json.loads((path / "edgeprefill.json").read_text())
    manifest["files"]["../outside"] = {"sha256": "0", "bytes": 1}
    (path / "edgeprefill.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli("inspect", path), "outside the bundle")


def test_run_streams_only_generated_text_to_stdout_and_stats_to_stderr(bundle):
    result = cli("run", bundle("llama"), "--prompt", "w5 w6 w7", "--max-new-tokens", "4",
                 "--stats")
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert len(words) == 4 and all(w.startswith("w") for w in words)
    assert "TTFT" in result.stderr and "decode" in result.stderr and "chunks" in result.stderr


def test_a_reader_that_closes_the_pipe_early_is_no_error(bundle):
    # `edgeprefill run ... | head`: the rest of the reply has nowhere to go, which is what
    # the reader asked for. Click had turned it into exit status 1.
    run = subprocess.Popen([*EDGEPREFILL, "run", str(bundle("llama")), "w5 w6",
                            "--ignore-eos", "--max-new-tokens", "500"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout is not None and run.stderr is not None
    assert run.stdout.read(2).startswith(b"w")  # the first words, then the reader leaves
    run.stdout.close()
    assert run.wait(timeout=120) == 0
    assert run.stderr.read() == b""


@pytest.mark.parametrize("command", ["run", "serve"])
@pytest.mark.parametrize("args, fragment", [
    (["--chunk-size", "16"], "--itl-target-ms steers the adaptive chunk size, which "
                             "--chunk-size replaces"),
    (["--policy", "fcfs"], "--itl-target-ms does not apply to the fcfs policy"),
], ids=["chunk-size", "fcfs"])
def test_an_itl_target_that_would_be_ignored_is_refused(bundle, command, args, fragment):
    # Adaptive chunking is the only reader of the target: beside a fixed chunk or fcfs it
    # had been dropped without a word. serve in a child process with a time limit: were the
    # refusal lost, it would serve on (TimeoutExpired fails the test).
    given = [*args, "--itl-target-ms", "5"]
    result = cli("run", bundle("llama"), "w5 w6", *given) if command == "run" else \
        subprocess.run([*EDGEPREFILL, "serve", str(bundle("llama")), "--port", "0", *given],
                       capture_output=True, text=True, timeout=60)
    assert_one_line_error(result, fragment)
    assert cli("run", bundle("llama"), "w5 w6", "--max-new-tokens", "1", *args).returncode \
        == 0  # the default target is no conflict
    shown = re.sub(r"-\s+", "-", " ".join(cli(command, "--help").stdout.split()))
    assert "under this (run and serve refuse it beside --chunk-size or --policy fcfs" in shown


def _closing(fd: int):
    """A child's set-up that closes its standard stream `fd` (a shell's `<&-`, `>&-`)."""
    return lambda: os.close(fd)


@pytest.mark.parametrize("args, closed, code, said", [
    (["--interactive"], 0, 0, ""),  # end of input: the chat ends
    (["--prompt-file", "-"], 0, 2, "error: the prompt is empty"),
    (["w5 w6", "--max-new-tokens", "2"], 1, 0, ""),  # as a reader that left
], ids=["interactive-stdin", "prompt-file-stdin", "stdout"])
def test_a_closed_standard_stream_is_no_traceback(bundle, args, closed, code, said):
    # Python makes a closed stream None: its first use had been an AttributeError.
    result = subprocess.run([*EDGEPREFILL, "run", str(bundle("llama")), *args],
                            stdout=subprocess.PIPE if closed != 1 else None,
                            stderr=subprocess.PIPE, stdin=None if closed == 0 else
                            subprocess.DEVNULL, preexec_fn=_closing(closed), timeout=120)
    err = result.stderr.decode()
    assert result.returncode == code and "Traceback" not in err, err
    assert said in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("command", ["run", "inspect"])
def test_output_to_a_full_device_is_one_line(bundle, command):
    args = ["w5 w6", "--max-new-tokens", "2"] if command == "run" else []
    with open("/dev/full", "w") as full:
        result = subprocess.run([*EDGEPREFILL, command, str(bundle("llama")), *args],
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr == "error: cannot write the output: No space left on device\n"


def test_inspect_refuses_a_corrupt_graph_in_one_line(tiny_int4_bundle, tmp_path):
    """inspect reads an int4 bundle's graph (for where its derived weights are cached):
    through bundle.load_graph, so a graph file of the right size but corrupt is one line."""
    bundle = tmp_path / "b"
    shutil.copytree(tiny_int4_bundle, bundle)
    graph = bundle / "model.onnx"
    graph.write_bytes(b"\xff" * graph.stat().st_size)
    assert_one_line_error(cli("inspect", bundle), "is not a readable ONNX model")


def test_inspect_shows_the_contract(bundle):
    result = cli("inspect", bundle("llama"), "--verify")
    assert result.returncode == 0, result.stderr
    for expected in ("input_ids", "past_lens", "valid_lens", "logits", "sha256 verified",
                     "16, 64"):
        assert expected in result.stdout


def test_export_refuses_what_would_make_a_bundle_no_load_accepts(hf_copy, tmp_path):
    (hf_copy / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5000]}))
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b"),
                          "generation_config.json: eos_token_id [5000] is outside the vocabulary")
    (hf_copy / "generation_config.json").unlink()
    config = json.loads((hf_copy / "config.json").read_text())
    config["vocab_size"] += 100  # the tokenizer still fits; the embedding table does not
    (hf_copy / "config.json").write_text(json.dumps(config))
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b"), "has shape",
                          f"vocab_size {config['vocab_size']}")
    assert not (tmp_path / "b").exists()


def test_export_to_a_place_it_cannot_write_is_one_line(hf_copy, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("mine")
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "afile" / "sub"),
                          "afile is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "mine"
    # the current folder: renaming it away would pull it from under the shell (a folder of
    # the test's own: were the check lost, the checkout must not be what is renamed)
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(cli("export", hf_copy, "-o", ".", "--overwrite"),
                          ". holds the current folder")


def test_export_beside_a_folder_it_cannot_write_in_says_where(hf_copy, tmp_path, monkeypatch):
    """The staging folder goes beside the target: a refusal there had named only the
    staging folder (Permission denied (ro2/.b.partial-7667))."""
    from edgeprefill.errors import ExportError
    from edgeprefill.export import staging

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    volume = tmp_path / "volume"  # a Docker volume, say: it had failed after the whole export
    volume.mkdir()
    with monkeypatch.context() as m:
        m.setattr(staging.os.path, "ismount", lambda path: Path(path) == volume)
        with pytest.raises(ExportError, match="is a mount point: export into a folder inside"):
            staging.check_target(volume, False)
    out = tmp_path / "ro" / "bundle"
    out.mkdir(parents=True)  # an existing bundle's folder, replaced: the stage goes beside
    monkeypatch.setattr(staging.Path, "mkdir", refuse)
    with pytest.raises(ExportError, match=r"cannot write beside .*bundle in .*ro: Permission "
                                          r"denied \(the bundle is written there first"):
        staging.check_target(out, False)
        with staging.staged(out, False):
            pass


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_export_to_a_folder_that_cannot_be_created_says_so_in_one_line(hf_copy):
    """/proc takes no new folder: the line names the folder asked for, not its staging."""
    result = cli("export", hf_copy, "-o", "/proc/x")
    assert_one_line_error(result)
    assert result.stderr == ("error: cannot create the output folder /proc/x: No such file "
                             "or directory\n")


@pytest.mark.parametrize("index, fragment", [
    ('{"weight_map": 5}', "weight_map must map tensor names to file names"),
    ('{"weight_map": {"model.embed_tokens.weight": 7}}', "weight_map must map"),
    ('{"weight_map": {"model.embed_tokens.weight": "shard-2.safetensors"}}',
     "shard-2.safetensors is listed in model.safetensors.index.json but missing"),
    ('{"metadata": {}}', "is malformed"),
    # a stale index: its shard holds no such tensor (it was a KeyError traceback)
    ('{"weight_map": {"model.bogus.weight": "model.safetensors"}}',
     "lists 'model.bogus.weight' in model.safetensors, which does not hold it"),
])
def test_a_malformed_shard_index_is_one_line(hf_copy, tmp_path, index, fragment):
    (hf_copy / "model.safetensors.index.json").write_text(index)
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b"), fragment)


def test_a_kv_cache_beyond_the_machines_memory_is_one_line_in_the_callers_names(bundle):
    """The CLI's advice names its flags; the SDK's its keywords, kv_budget_bytes too,
    which no command line has."""
    from edgeprefill.errors import SettingError
    from edgeprefill.sdk import Engine

    # In a child process: were the check lost, the allocation must not take pytest down.
    result = cli_process("run", bundle("llama"), "--prompt", "w3", "--kv-slots", "100000000")
    assert_one_line_error(result, "KV slots of", "exceed this machine's")
    assert result.stderr.rstrip().endswith(" of memory; lower --kv-slots or --max-context")
    with pytest.raises(SettingError) as raised:
        Engine.load(bundle("llama"), kv_slots=100_000_000)
    assert str(raised.value).endswith(" of memory; lower kv_slots or max_context, or give "
                                      "kv_budget_bytes")
    assert result.stderr == f"error: {raised.value.problem}; lower --kv-slots or --max-context\n"


def test_a_setting_error_names_only_the_flags_the_command_has():
    """bench sets the KV slots from --sessions: its advice leaves --kv-slots out. The error
    crosses bench's worker process whole (pickled)."""
    import pickle

    from edgeprefill.cli.bench_cmd import bench
    from edgeprefill.cli.main import _in_flags
    from edgeprefill.errors import SettingError

    err = pickle.loads(pickle.dumps(SettingError("too big", ("kv_slots", "max_context"),
                                                 ", or give kv_budget_bytes")))
    assert str(err) == "too big; lower kv_slots or max_context, or give kv_budget_bytes"
    assert _in_flags(err, bench) == "too big; lower --max-context"
    assert _in_flags(SettingError("too big", ("kv_slots",)), bench) == "too big"


@pytest.mark.parametrize("args, line", [
    (("--top-p", "0"), "--top-p must be in (0, 1]"),
    (("--top-k", "-1"), "--top-k must be an integer >= 0"),
    (("--temperature", "-1"), "--temperature must be a finite number >= 0"),
    (("--seed", "-1"), "--seed must be an integer >= 0"),
    (("--repetition-penalty", "0"), "--repetition-penalty must be a finite number > 0"),
    (("--max-context", "513"), "--max-context must be in 2..512 for this bundle"),
    (("--max-new-tokens", "600"), "prompt (1 tokens) + --max-new-tokens (600) exceeds the "
                                  "context of 512 tokens"),
    (("--thinking-budget", "3"), "--thinking-budget needs a model that thinks in <think>"),
])
def test_a_refusal_of_a_value_names_the_flag_it_was_given_by(bundle, args, line):
    """The SDK's message names the keyword (`top_p`), the CLI's the flag the user typed:
    the error carries the field, and the field is the option of its name."""
    result = cli("run", bundle("llama"), "w3", *args)
    assert_one_line_error(result, f"error: {line}")
    assert "_" not in result.stderr.split("(")[0], result.stderr  # no keyword left


def test_the_sdk_names_the_keyword_the_cli_rewrites():
    from edgeprefill.export.quantize import QuantConfig
    from edgeprefill.sdk import GenerationParams

    with pytest.raises(RequestError) as raised:
        GenerationParams(top_p=0)
    assert (str(raised.value), raised.value.field) == ("top_p must be in (0, 1]", "top_p")
    with pytest.raises(ExportError) as refused:
        QuantConfig("int4", block_size=48)
    assert refused.value.field == "block_size"
    assert str(refused.value) == "int4 block_size must be 16..256, a power of 2: 48"


def test_export_and_bench_name_their_flags_too(bundle, hf_copy, tmp_path):
    """--block-size is export's; bench's refusal crosses its worker process (pickled)."""
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b", "--quantize", "int4",
                              "--block-size", "48"),
                          "error: int4 --block-size must be 16..256, a power of 2: 48")
    result = cli("bench", bundle("llama"), "--max-context", "513")
    assert result.returncode == 2
    # The progress bar's \r-separated frames, then the line.
    last = result.stderr.splitlines()[-1]
    assert last == "error: --max-context must be in 2..512 for this bundle"


def test_export_options_that_would_be_ignored_are_refused_or_reported(hf_copy, tmp_path):
    blocks_only = "--block-size applies to --quantize int4, or int8 at --dtype fp16, only"
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b", "--block-size", "64"),
                          blocks_only)
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b", "--quantize", "int8",
                              "--block-size", "64"), blocks_only)  # float32: per channel
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b", "--quantize", "int8",
                              "--accuracy-level", "2"),
                          "--accuracy-level applies to --quantize int4 only")
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b", "--chunks", "5000"),
                          "exceeds the max context 1024")
    done = cli("export", hf_copy, "-o", tmp_path / "b", "--chunks", "16,5000", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "warning: chunk sizes [5000] exceed the max context 1024 and were left out" \
        in done.stderr


def test_inspect_says_what_a_path_is_when_it_is_no_bundle(hf_copy, tmp_path):
    assert_one_line_error(cli("inspect", tmp_path / "nope"), "nope does not exist")
    assert_one_line_error(cli("inspect", hf_copy), "is a Hugging Face model folder",
                          f"edgeprefill export {hf_copy} -o BUNDLE")
    gguf = tmp_path / "model-Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    for args in (["inspect", gguf], ["run", gguf, "w5"]):
        assert_one_line_error(cli(*args), f"{gguf} is a GGUF file, not an edgeprefill "
                              f"bundle: make one with `edgeprefill export {gguf} -o BUNDLE`")


def test_a_file_of_a_bundle_given_for_the_bundle_names_the_folder(bundle):
    """It said the manifest file was no bundle for want of a manifest."""
    folder = bundle("llama")
    for name in ("edgeprefill.json", "model.onnx"):
        for args in (["inspect", folder / name], ["run", folder / name, "w5"]):
            assert_one_line_error(cli(*args), f"{folder / name} is a file of the bundle "
                                  f"{folder}: give the folder")


@pytest.mark.parametrize("field, value, fragment", [
    ("quantization", "fp8", "graph.quantization must be int8, int4 or null, got 'fp8'"),
    ("format_version", "1", "bundle format version '1' is not supported"),
])
def test_a_manifest_with_an_unknown_quantization_or_a_text_version_is_one_line(
        bundle, tmp_path, field, value, fragment):
    copy = tmp_path / "b"
    shutil.copytree(bundle("llama"), copy)
    manifest = json.loads((copy / "edgeprefill.json").read_text())
    (manifest["graph"] if field == "quantization" else manifest)[field] = value
    (copy / "edgeprefill.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli("inspect", copy), fragment)


def test_a_manifest_with_fewer_kv_outputs_than_layers_is_one_line(bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle("llama"), copy)
    manifest = json.loads((copy / "edgeprefill.json").read_text())
    manifest["graph"]["kv_outputs"] = manifest["graph"]["kv_outputs"][:1]
    (copy / "edgeprefill.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli("inspect", copy), "one [key, value] pair per layer")


def test_a_chat_template_file_that_is_not_utf8_is_one_line(hf_copy, tmp_path):
    (hf_copy / "chat_template.jinja").write_bytes(b"{{ messages }} \xf5\xff")
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "out"),
                          "chat_template.jinja is not UTF-8 text")


def test_a_json_file_that_cannot_be_read_is_the_callers_error(tmp_path):
    """A private file of another user's (umask 077, sudo export) had been a traceback."""
    from edgeprefill.errors import BundleError
    from edgeprefill.json_file import load_json

    with pytest.raises(BundleError, match="cannot read"):
        load_json(tmp_path, BundleError)  # a folder: read_text raises an OSError too


@pytest.mark.parametrize("path", ["model", "chunks", "max_context", "eos_token_ids",
                                  "model.num_heads", "graph.kv_inputs", "tokenizer.file"])
def test_a_manifest_missing_a_field_names_it(bundle, tmp_path, path):
    """A record or a required field removed: its name in the manifest and the advice, not
    a dataclass's "__init__() missing 1 required positional argument"."""
    copy = tmp_path / "b"
    shutil.copytree(bundle("llama"), copy)
    manifest = json.loads((copy / "edgeprefill.json").read_text())
    *parents, key = path.split(".")
    record = manifest
    for parent in parents:
        record = record[parent]
    del record[key]
    (copy / "edgeprefill.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli("inspect", copy),
                          f"the field '{path}' is missing; re-export the bundle")


def test_export_refuses_weights_holding_nan(hf_copy, tmp_path):
    from safetensors.numpy import load_file, save_file

    weights = load_file(hf_copy / "model.safetensors")
    name = next(n for n in weights if n.endswith("mlp.down_proj.weight"))
    weights[name][0, 0] = float("nan")
    save_file(weights, hf_copy / "model.safetensors", metadata={"format": "pt"})
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b", "--quiet"),
                          "holds NaN or Inf")


def test_export_warns_of_checkpoint_tensors_the_config_leaves_out(hf_copy, tmp_path):
    """num_hidden_layers 1 over two layers' weights had exported one layer silently."""
    whole = cli("export", hf_copy, "-o", tmp_path / "whole", "--quiet")
    assert whole.returncode == 0 and "does not use" not in whole.stderr
    config = json.loads((hf_copy / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    config["num_hidden_layers"] = 1
    (hf_copy / "config.json").write_text(json.dumps(config))
    done = cli("export", hf_copy, "-o", tmp_path / "b", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "tensors config.json does not use (model.layers.1." in done.stderr
    # a tied model with its lm_head saved too: transformers ties it without a word
    from safetensors.numpy import load_file, save_file

    config.update(num_hidden_layers=2, tie_word_embeddings=True)
    (hf_copy / "config.json").write_text(json.dumps(config))
    weights = load_file(hf_copy / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].copy()
    save_file(weights, hf_copy / "model.safetensors", metadata={"format": "pt"})
    tied = cli("export", hf_copy, "-o", tmp_path / "tied", "--quiet")
    assert tied.returncode == 0 and "does not use" not in tied.stderr, tied.stderr


def test_a_prompt_with_a_lone_surrogate_is_refused_in_one_line(bundle):
    from edgeprefill.errors import RequestError
    from edgeprefill.sdk import Engine

    with Engine.load(bundle("llama"), warm_up=False) as engine:
        with pytest.raises(RequestError, match="lone surrogate"):
            engine.generate("w5 \ud800 w6")


# HunYuan's ort graph rotates q and k outside GroupQueryAttention (RotaryEmbedding).
@pytest.mark.parametrize("family", ("llama", "hunyuan_v1_dense"))
def test_a_manifest_claiming_more_context_than_the_graph_holds_is_refused(
        family, bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle(family), copy)
    manifest = json.loads((copy / "edgeprefill.json").read_text())
    exported = manifest["max_context"]
    manifest["max_context"] = exported * 2
    (copy / "edgeprefill.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli("run", copy, "--prompt", "w3"),
                          f"max_context {exported * 2}, but the graph's rotary tables hold "
                          f"{exported} positions")


def test_a_manifest_with_an_unknown_graph_flavour_is_refused(bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle("llama"), copy)
    manifest = json.loads((copy / "edgeprefill.json").read_text())
    manifest["graph"]["flavor"] = "weird"
    (copy / "edgeprefill.json").write_text(json.dumps(manifest))
    assert_one_line_error(cli("inspect", copy), "graph.flavor must be one of ort, standard")


def test_export_embeddings_float_keeps_the_table_float_and_needs_quantize(hf_copy, tmp_path):
    import onnx

    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b", "--embeddings", "float"),
                          "--embeddings applies with --quantize")
    ops = {}
    for embeddings in ("quantized", "float"):
        out = tmp_path / embeddings
        done = cli("export", hf_copy, "-o", out, "--quantize", "int4", "--embeddings",
                   embeddings, "--quiet")
        assert done.returncode == 0, done.stderr
        graph = onnx.load(out / "model.onnx", load_external_data=False).graph
        ops[embeddings] = sum(n.op_type == "GatherBlockQuantized" for n in graph.node)
    assert ops == {"quantized": 1, "float": 0}


def test_export_lm_head_values_are_checked_in_one_line(hf_copy, tmp_path):
    out = tmp_path / "b"
    assert_one_line_error(cli("export", hf_copy, "-o", out, "--lm-head", "int8"),
                          "--lm-head applies with --quantize")
    assert_one_line_error(cli("export", hf_copy, "-o", out, "--quantize", "int8",
                              "--lm-head", "int4"), "an int8 bundle's LM head is int8 or float")
    refused = cli("export", hf_copy, "-o", out, "--quantize", "int4", "--lm-head", "int2")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "'int2' is not one of 'int8', 'int4', 'float'" in refused.stderr
    assert not out.exists()


def inspect_lines(bundle) -> dict[str, str]:
    """`inspect`'s embeddings and lm head lines, by their first word."""
    shown = cli("inspect", bundle)
    assert shown.returncode == 0, shown.stderr
    return {line.split()[0]: line for line in shown.stdout.splitlines()
            if line.startswith(("embeddings ", "lm head "))}


def test_inspect_says_whether_the_tables_and_the_head_are_quantized(hf_copy, bundle,
                                                                   tmp_path):
    """One line each, read off the graph: a float bundle's, the default int4 bundle's of a
    tied model (the table stays float), and with `--lm-head int8 --embeddings all`."""
    assert inspect_lines(bundle("llama")) == {
        "embeddings": "embeddings  model.embed_tokens.weight float32 (Gather)",
        "lm": "lm head     float32 (Gemm)"}
    from safetensors.numpy import load_file, save_file

    config = json.loads((hf_copy / "config.json").read_text())
    (hf_copy / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    weights = load_file(hf_copy / "model.safetensors")
    del weights["lm_head.weight"]  # tied: the head is the table
    save_file(weights, hf_copy / "model.safetensors", metadata={"format": "pt"})
    lines = {}
    for name, options in (("int4", ()), ("mixed", ("--lm-head", "int8", "--embeddings", "all"))):
        done = cli("export", hf_copy, "-o", tmp_path / name, "--quantize", "int4", *options,
                   "--quiet")
        assert done.returncode == 0, done.stderr
        lines[name] = inspect_lines(tmp_path / name)
    assert lines["int4"] == {
        "embeddings": "embeddings  model.embed_tokens.weight float32 (Gather)",
        "lm": "lm head     int4 (MatMulNBits, blocks of 32)"}
    assert lines["mixed"]["embeddings"] == ("embeddings  model.embed_tokens.weight int4 "
                                            "(GatherBlockQuantized, blocks of 32)")
    assert lines["mixed"]["lm"].startswith(
        "lm head     int8 (DynamicQuantizeMatMul, one scale per vocabulary row); here ")


@pytest.mark.parametrize("model_type, fragment", [
])
def test_a_mixture_of_experts_type_export_refuses_says_why_in_one_line(
        model_type, fragment, hf_copy, tmp_path):
    config = json.loads((hf_copy / "config.json").read_text())
    (hf_copy / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    assert_one_line_error(cli("export", hf_copy, "-o", tmp_path / "b"),
                          f"model_type '{model_type}': {fragment}")


@pytest.mark.parametrize("family, overrides, context, reason", [
    ("llama4_text", {"attention_chunk_size": 32}, 64,
     "attention_chunk_size (32): chunked attention past one chunk is not supported"),
    # config.json's 4096 positions past its longrope's window, 1024 (the fixture's)
    ("phimoe", {"max_position_embeddings": 4096}, 2048,
     "original_max_position_embeddings (1024): longrope's short factors are exact only "
     "within the original window"),
])
def test_a_context_past_a_models_cap_is_one_line_naming_the_reason(
        family, overrides, context, reason, hf_model, tmp_path):
    """What caps the context, not the positions config.json states (PhiMoE's 4096 here)."""
    hf = shutil.copytree(hf_model(family), tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, **overrides}))
    result = cli("export", hf, "-o", tmp_path / "b", "--max-context", context)
    assert_one_line_error(result, f"--max-context {context} exceeds {reason}")
    assert "the model's max_position_embeddings" not in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["run", "--bogus"], "No such option '--bogus'. (see `"),
    (["runn"], "No such command 'runn'."),
    (["run"], "Missing argument 'BUNDLE'."),
    (["run", "x", "-p"], "Option '-p' requires an argument. (see `"),  # raised without ctx
    (["serve", "x", "--port", "abc"], "Invalid value for '--port'"),
])
def test_a_usage_error_is_one_line_with_clicks_exit_code_and_a_help_pointer(args, fragment):
    result = cli(*args)
    assert_one_line_error(result, fragment, "--help`)")
    assert result.returncode == 2


def test_help_and_no_arguments_print_the_help_page_and_exit_0():
    """Bare `edgeprefill` is a request for the help, as `--help` is (pip's and docker's
    answer), not a usage error: the same page on stdout, exit 0 (the bare call in a child
    process: the real entry point)."""
    for args in (["run", "--help"], ["--help"]):
        result = cli(*args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Usage: ") and result.stderr == ""
    bare, asked = cli_process(), cli_process("--help")
    assert bare.returncode == 0 and bare.stderr == "", bare.stderr
    assert bare.stdout == asked.stdout and bare.stdout.startswith("Usage: ")


def test_prefill_rows_reaches_the_scheduler_and_fcfs_refuses_it(bundle, tmp_path):
    # --prefill-rows had no option: the CLI always shared steps as widely as the slots let.
    # The engine's own count of prefill steps is the reference: one prompt a step with 1.
    # (How many prompts the default puts in a step depends on when they arrive.)
    from edgeprefill.sdk import Engine

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w5 w6\nw7 w8 w9\nw1 w2\nw3 w4 w5 w6\n")
    common = ["run", bundle("llama"), "--prompts", prompts, "--max-new-tokens", "1", "--stats"]
    alone = cli(*common, "--prefill-rows", "1")
    assert alone.returncode == 0, alone.stderr
    assert "engine: prefill 11 tok in 4 steps at" in alone.stderr
    loaded = []
    real_load = Engine.load
    with mock.patch.object(Engine, "load", lambda path, **options: loaded.append(options)
                           or real_load(path, **options)):
        assert cli(*common, "--prefill-rows", "3").returncode == 0
    assert loaded[0]["prefill_rows"] == 3
    assert_one_line_error(cli(*common, "--policy", "fcfs", "--prefill-rows", "2"),
                          "--prefill-rows 2 (prompts per shared prefill step) does not apply "
                          "to the fcfs policy")
    fcfs_alone = cli(*common, "--policy", "fcfs", "--prefill-rows", "1")
    assert fcfs_alone.returncode == 0, fcfs_alone.stderr  # 1 is what fcfs does
    shown = " ".join(cli("serve", "--help").stdout.split())
    assert "--prefill-rows" in shown and "applies where steps fuse" in shown
