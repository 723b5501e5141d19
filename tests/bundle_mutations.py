"""Damaged and mismatched bundles, as people end up with them (a copy cut short, a file
edited by hand, another bundle's graph copied in, a cache folder that cannot be written),
and what each command makes of one: a run, a one-line refusal, or a crash (a traceback, a
refusal of several lines, a hang).

Used by tests/test_bundle_damage.py; `python -m tests.bundle_mutations [COMMAND...]`
prints the crashes of the whole sweep (every command without arguments)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.errors import EdgeprefillError

REMOVED = object()  # the key deleted rather than set
HUGE = 2**40
HANG_SECONDS = 60  # far beyond a load of the tiny bundles: a command still going hangs

# kind -> the edited value of a manifest key holding `value` (None: does not apply).
VALUE_EDITS: dict[str, Callable[[Any], Any]] = {
    "null": lambda value: None if value is not None else REMOVED,
    "string": lambda value: "x",
    "negative": lambda value: -1,
    "zero": lambda value: 0,
    "float": lambda value: value + 0.5 if type(value) is int else None,
    "huge": lambda value: HUGE,
    "true": lambda value: True,
    "list": lambda value: [1, 2],
    "object": lambda value: {},
    "removed": lambda value: REMOVED,
}
# Where the manifest's keys are edited: every key of these objects, one level down (the
# graph's inputs and outputs get edits of their own, KV_EDITS).
EDITED_OBJECTS = ((), ("model",), ("graph",), ("tokenizer",), ("files", "model.onnx"))


def _unchanged(bundle: Path) -> None:
    pass


@dataclass(frozen=True)
class Mutation:
    name: str  # "model.onnx=truncated", "manifest:model.num_layers=negative"
    edit: Callable[[Path], None]  # applied to a copy of the bundle
    # The machine around the bundle while the commands run (its derived-weights cache):
    # given the copy, it sets things up and puts them back.
    setting: Callable[[Path], contextlib.AbstractContextManager[None]] | None = None

    def __str__(self) -> str:
        return self.name

    def apply(self, bundle: Path, dest: Path) -> Path:
        shutil.copytree(bundle, dest)
        self.edit(dest)
        return dest


# -- damage to the files ---------------------------------------------------------------


def _missing(name: str) -> Callable[[Path], None]:
    return lambda b: (b / name).unlink()


def _written(name: str, content: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(b: Path) -> None:
        (b / name).write_bytes(content((b / name).read_bytes()))
    return edit


def _garbage(data: bytes) -> bytes:
    """Bytes of the same length that are none of the file's formats (a disk error, a
    download of something else cut to size): the size check passes them."""
    return bytes((i * 151 + 7) % 256 for i in range(len(data)))


def _recorded(name: str, edit: Callable[[Path], None]) -> Callable[[Path], None]:
    """`edit`, then the manifest's size and sha256 of `name` brought up to date (a bundle
    whose file was edited and re-recorded by hand, or by a script): only the later checks
    see the damage."""
    def both(b: Path) -> None:
        from edgeprefill.bundle import file_record

        edit(b)
        manifest = json.loads((b / MANIFEST_FILE).read_text())
        manifest["files"][name] = file_record(b / name)._asdict()
        (b / MANIFEST_FILE).write_text(json.dumps(manifest))
    return both


FILE_DAMAGE: dict[str, Callable[[str], Callable[[Path], None]]] = {
    "missing": _missing,
    "empty": lambda name: _written(name, lambda data: b""),
    "truncated": lambda name: _written(name, lambda data: data[:len(data) // 2]),
    "garbage": lambda name: _written(name, _garbage),
    "binary": lambda name: _written(name, lambda data: b"\x89PNG\r\n\x1a\n\x00\xff" * 8),
}
# The damage whose record is then updated: what gets past the size check.
RECORDED_DAMAGE = ("empty", "truncated", "binary")


def file_mutations(bundle: Path) -> list[Mutation]:
    names = sorted(p.name for p in bundle.iterdir() if p.is_file())
    listed = set(json.loads((bundle / MANIFEST_FILE).read_text())["files"])
    out = []
    for name in names:
        for kind, make in FILE_DAMAGE.items():
            out.append(Mutation(f"{name}={kind}", make(name)))
            if kind in RECORDED_DAMAGE and name in listed:
                out.append(Mutation(f"{name}={kind}+record", _recorded(name, make(name))))
    return out


# -- edits of the manifest ---------------------------------------------------------------


def _edit_manifest(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(b: Path) -> None:
        manifest = json.loads((b / MANIFEST_FILE).read_text())
        change(manifest)
        (b / MANIFEST_FILE).write_text(json.dumps(manifest))
    return edit


def _set(path: tuple[str, ...], value: Any) -> Callable[[Path], None]:
    def change(manifest: dict[str, Any]) -> None:
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        if value is REMOVED:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return _edit_manifest(change)


def _kv_shape(index: int, size: Any) -> Callable[[dict[str, Any]], None]:
    """past_key.0's declared shape with one axis changed (its present_key.0's too, so that
    the pair agrees and only the graph disagrees)."""
    def change(manifest: dict[str, Any]) -> None:
        for table, name in (("inputs", "past_key.0"), ("outputs", "present_key.0")):
            manifest["graph"][table][name][1][index] = size
    return change


def _rename(table: str, old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        graph = manifest["graph"]
        graph[table] = {new if k == old else k: v for k, v in graph[table].items()}
    return change


def _dtype(name: str, dtype: str) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        manifest["graph"]["inputs"][name][0] = dtype
    return change


# Edits of the graph's declared inputs and outputs (each one line of the manifest).
KV_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "kv_heads=3": _kv_shape(1, 3),
    "kv_heads=negative": _kv_shape(1, -2),
    "head_dim=32": _kv_shape(3, 32),
    "kv_axis=string": _kv_shape(1, "heads"),
    "kv_shape=short": lambda m: m["graph"]["inputs"]["past_key.0"].__setitem__(1, ["batch"]),
    "kv_dtype=float16": _dtype("past_key.0", "float16"),
    "input_ids_dtype=int3": _dtype("input_ids", "int3"),
    "input_renamed": _rename("inputs", "past_lens", "past_length"),
    "output_renamed": _rename("outputs", "logits", "scores"),
    "input_spec=string": lambda m: m["graph"]["inputs"].__setitem__("past_lens", "int32"),
    "dtype=bfloat16": lambda m: m["graph"].__setitem__("dtype", "bfloat16"),
    "dtype=int8": lambda m: m["graph"].__setitem__("dtype", "int8"),
    "flavor=tensorrt": lambda m: m["graph"].__setitem__("flavor", "tensorrt"),
    "file=self": lambda m: m["graph"].__setitem__("file", MANIFEST_FILE),
    "file=missing": lambda m: m["graph"].__setitem__("file", "other.onnx"),
    "file=folder": lambda m: m["graph"].__setitem__("file", "."),
    "tokenizer_file=graph": lambda m: m["tokenizer"].__setitem__("file", "model.onnx"),
    "tokenizer_file=missing": lambda m: m["tokenizer"].__setitem__("file", "gone.json"),
    "vocab_size=larger": lambda m: m["model"].__setitem__("vocab_size",
                                                          m["model"]["vocab_size"] * 2),
    "num_layers=more": lambda m: m["model"].__setitem__("num_layers",
                                                        m["model"]["num_layers"] + 1),
    "chunks=unsorted": lambda m: m.__setitem__("chunks", m["chunks"][::-1] + [1]),
    "format_version=future": lambda m: m.__setitem__("format_version", 2),
    "format_version=past": lambda m: m.__setitem__("format_version", 0),
    "opsets=future": lambda m: m["graph"]["opsets"].__setitem__("", 99),
    "files=extra": lambda m: m["files"].__setitem__("extra.bin", {"sha256": "0", "bytes": 1}),
}


def _values_of(manifest: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], Any]]:
    for parent in EDITED_OBJECTS:
        record: Any = manifest
        for key in parent:
            record = record[key]
        for key, value in record.items():
            yield (*parent, key), value


def manifest_mutations(bundle: Path) -> list[Mutation]:
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    out = []
    for path, value in _values_of(manifest):
        for kind, make in VALUE_EDITS.items():
            new = make(value)
            if new is None and kind != "null" or new is REMOVED and kind == "null":
                continue
            if new is not REMOVED and new == value and type(new) is type(value):
                continue
            out.append(Mutation(f"manifest:{'.'.join(path)}={kind}", _set(path, new)))
    out += [Mutation(f"manifest:{name}", _edit_manifest(change))
            for name, change in KV_EDITS.items()]
    out.append(Mutation("manifest=list", lambda b: (b / MANIFEST_FILE).write_text("[1]")))
    out.append(Mutation("manifest=not-json",
                        lambda b: (b / MANIFEST_FILE).write_text('{"model": {')))
    return out


# -- another bundle's graph ----------------------------------------------------------------


def swapped_graph(other: Path, recorded: bool) -> Mutation:
    """`other`'s graph and weights in place of the bundle's; with `recorded`, their sizes
    and digests written into the manifest too (only the graph's shapes then differ)."""
    def edit(b: Path) -> None:
        for name in ("model.onnx", "model.onnx.data"):
            shutil.copyfile(other / name, b / name)
            if recorded:
                _recorded(name, lambda _: None)(b)
    return Mutation(f"graph=swapped{'+record' if recorded else ''}", edit)


# -- the derived-weights cache (engines/ort/derived_cache.py) of an int4 bundle ----------


@contextlib.contextmanager
def _cache_at(folder: str) -> Iterator[None]:
    from edgeprefill.engines.ort.derived_cache import CACHE_ENV

    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = folder
    try:
        yield
    finally:
        if before is None:
            del os.environ[CACHE_ENV]
        else:
            os.environ[CACHE_ENV] = before


@contextlib.contextmanager
def _writes_fail(code: int) -> Iterator[None]:
    """Every cache write fails with `code` (ENOSPC: a full disk; EROFS: a read-only one;
    the tests run as root, whom chmod does not stop)."""
    from edgeprefill.engines.ort.derived_cache import DerivedCache

    def fail(path: Path, content: Any) -> None:
        raise OSError(code, os.strerror(code), str(path))

    write = DerivedCache.__dict__["_write"]
    DerivedCache._write = staticmethod(fail)  # type: ignore[method-assign]
    try:
        yield
    finally:
        DerivedCache._write = write  # type: ignore[method-assign]


def _filled_cache(damage: Callable[[Path], None]) -> Callable[[Path], Any]:
    """A cache folder an earlier load filled, each of its arrays then damaged."""
    @contextlib.contextmanager
    def setting(bundle: Path) -> Iterator[None]:
        from edgeprefill.sdk import Engine

        with _cache_at(str(bundle.parent / "derived")):
            Engine.load(bundle, warm_up=False).close()
            arrays = sorted((bundle.parent / "derived").glob("*/*.npy"))
            assert arrays, "the int4 bundle's load derived nothing to cache"
            for path in arrays:
                damage(path)
            try:
                yield
            finally:
                shutil.rmtree(bundle.parent / "derived")
    return setting


def _in_fresh_cache(inner: Callable[[], Any]) -> Callable[[Path], Any]:
    @contextlib.contextmanager
    def setting(bundle: Path) -> Iterator[None]:
        with _cache_at(str(bundle.parent / "derived")), inner():
            yield
        shutil.rmtree(bundle.parent / "derived", ignore_errors=True)
    return setting


def _wrong_shape(path: Path) -> None:
    import numpy as np

    np.save(path, np.zeros((3, 5), np.int8))


def _as_file(bundle: Path) -> Any:
    (bundle.parent / "cache-file").write_text("not a folder")
    return _cache_at(str(bundle.parent / "cache-file"))


CACHE_DAMAGE: dict[str, Callable[[Path], Any]] = {
    "is-a-file": _as_file,
    "cannot-be-made": lambda b: _cache_at("/proc/edgeprefill-derived"),
    "relative": lambda b: _cache_at("derived"),
    "full": _in_fresh_cache(lambda: _writes_fail(errno.ENOSPC)),
    "read-only": _in_fresh_cache(lambda: _writes_fail(errno.EROFS)),
    "arrays-empty": _filled_cache(lambda p: p.write_bytes(b"")),
    "arrays-truncated": _filled_cache(lambda p: p.write_bytes(p.read_bytes()[:100])),
    "arrays-garbage": _filled_cache(lambda p: p.write_bytes(_garbage(p.read_bytes()))),
    "arrays-wrong-shape": _filled_cache(_wrong_shape),
}


def cache_mutations() -> list[Mutation]:
    """For an int4 bundle, whose load derives weights."""
    return [Mutation(f"cache={name}", _unchanged, setting)
            for name, setting in CACHE_DAMAGE.items()]


def all_mutations(bundle: Path, other: Path) -> list[Mutation]:
    return [*file_mutations(bundle), *manifest_mutations(bundle),
            swapped_graph(other, False), swapped_graph(other, True)]


# -- running the commands on a bundle ---------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    kind: str  # "ok", "refused" or "crash"
    message: str  # the refusal's line, or what crashed and where


class Hang(Exception):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# name -> the command's arguments after the bundle (the small workloads of the tiny bundles)
COMMANDS: dict[str, tuple[str, ...]] = {
    "run": ("--prompt", "w3 w4", "--max-new-tokens", "2"),
    "inspect": (),
    "bench": ("--sessions", "1", "--prompt-tokens", "16", "--reply-tokens", "2",
              "--policies", "fcfs", "--no-urgent"),
    "serve": ("--port", "{port}"),  # a free one, found at each run
    "sdk": (),  # Engine.load and one generate, not the CLI
}
# serve's lines before the model loads, which a refusal follows.
SERVE_PREAMBLE = "loading "


def try_command(command: str, bundle: Path) -> Outcome:
    """`command` on `bundle` in this process: its exit and what it wrote to stderr."""
    stderr = io.StringIO()
    code: Any = 0
    previous = signal.signal(signal.SIGALRM, _hang)
    signal.alarm(HANG_SECONDS)
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = _sdk(bundle) if command == "sdk" else _cli(command, bundle)
    except Hang:
        return Outcome("crash", f"still running after {HANG_SECONDS} s")
    except Exception as err:  # what the sweep is for: anything escaping main is a crash
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"
        return Outcome("crash", f"{type(err).__name__}: {err} [{where}]")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return _judged(command, code, stderr.getvalue())


def _hang(signum: int, frame: Any) -> None:
    raise Hang


def _sdk(bundle: Path) -> int:
    """Engine.load and one generate: 2 and the error's line where either refuses."""
    from edgeprefill.sdk import Engine, GenerationParams

    try:
        engine = Engine.load(bundle)
        try:
            engine.generate("w3 w4", GenerationParams(max_new_tokens=2)).result()
        finally:
            engine.close()
    except EdgeprefillError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _cli(command: str, bundle: Path) -> Any:
    import edgeprefill.server.shutdown as shutdown
    from edgeprefill.cli.main import main

    argv, run = sys.argv, shutdown.run_until_signalled
    args = [a.format(port=free_port()) for a in COMMANDS[command]]
    sys.argv = ["edgeprefill", command, str(bundle), *args]
    shutdown.run_until_signalled = lambda *_: None  # serve: its startup, no serving
    try:
        main()
    except SystemExit as exit_:
        return exit_.code
    finally:
        sys.argv, shutdown.run_until_signalled = argv, run
    return 0


def _judged(command: str, code: Any, stderr: str) -> Outcome:
    if code in (0, None):
        return Outcome("ok", "")
    # A progress bar (bench's) ends in a carriage return that the next line writes over.
    lines = [line.rsplit("\r", 1)[-1] for line in stderr.split("\n")]
    lines = [line for line in lines if line.strip()
             and not (command == "serve" and line.startswith(SERVE_PREAMBLE))]
    if code in (1, 2) and len(lines) == 1 and lines[0].startswith("error: ") \
            and "Traceback" not in stderr:
        return Outcome("refused", lines[0].removeprefix("error: "))
    return Outcome("crash", f"exit {code}: {stderr.strip()[-600:]}")


def sweep(bundle: Path, mutations: list[Mutation], work: Path, commands: list[str]
          ) -> Iterator[tuple[Mutation, str, Outcome]]:
    """Each mutation of `bundle` under each command, and what the command made of it."""
    for mutation in mutations:
        copy = mutation.apply(bundle, work / "b")
        try:
            for command in commands:
                setting = mutation.setting(copy) if mutation.setting else contextlib.nullcontext()
                with setting:
                    outcome = try_command(command, copy)
                yield mutation, command, outcome
        finally:
            shutil.rmtree(copy)


def bad(outcome: Outcome) -> bool:
    return outcome.kind == "crash" or "\n" in outcome.message


def main(commands: list[str]) -> None:
    """Print each crash, and the counts of each command's outcomes."""
    import logging
    import tempfile
    from dataclasses import replace

    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.export.quantize import QuantConfig
    from tests.conftest import build_hf_model

    logging.disable(logging.WARNING)
    options = ExportOptions(chunks=(16, 64), max_context=512, show_progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["EDGEPREFILL_DERIVED_CACHE"] = str(root / "derived")  # not ~/.cache
        hf, other = (build_hf_model("llama", root / "hf"),
                     build_hf_model("llama", root / "hf-other", num_key_value_heads=4))
        export(hf, root / "llama", options)
        export(other, root / "other", options)
        export(hf, root / "int4", replace(options, quant=QuantConfig("int4")))
        runs = [*((root / "llama", m) for m in all_mutations(root / "llama", root / "other")),
                *((root / "int4", m) for m in cache_mutations())]
        counts: dict[str, dict[str, int]] = {c: {} for c in commands}
        for mutation, command, outcome in (
                found for bundle, m in runs for found in sweep(bundle, [m], root, commands)):
            counts[command][outcome.kind] = counts[command].get(outcome.kind, 0) + 1
            if os.environ.get("SWEEP_VERBOSE"):
                print(f"{outcome.kind} {command} {mutation}: {outcome.message}", flush=True)
            elif bad(outcome):
                print(f"CRASH {command} {mutation}: {outcome.message}", flush=True)
        print(counts)


if __name__ == "__main__":
    main(sys.argv[1:] or list(COMMANDS))
