"""One-key edits of a checkpoint's config.json, as people bring them (hand edits, configs
of other transformers versions), and what `export` makes of each: a bundle, a one-line
refusal, or a crash (anything else escaping).

Used by tests/test_config_fuzz.py; `python -m tests.config_mutations FAMILY...` prints the
crashes of the whole sweep of those families (all of FAMILIES without arguments)."""

from __future__ import annotations

import json
import shutil
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeprefill.errors import EdgeprefillError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.staging import PARTIAL_MARKER

OPTIONS = ExportOptions(chunks=(16,), max_context=64, show_progress=False)
# Keys whose value is an object a config may hold empty: each also becomes {}.
DICT_KEYS = ("rope_parameters", "rope_scaling", "quantization_config", "text_config")
# Objects whose own keys are edited too (one level down): where transformers 5 writes
# rope_theta, and the language model of an image-text config. A vision tower's keys are
# left alone: export leaves the tower out.
NESTED = ("rope_parameters", "rope_scaling", "text_config")
REMOVED = object()  # the key deleted rather than set
HUGE = 2**40


@dataclass(frozen=True)
class Mutation:
    path: tuple[str, ...]  # ("hidden_size",) or ("text_config", "hidden_size")
    kind: str  # a key of MUTATIONS
    value: Any  # the new value, or REMOVED

    def __str__(self) -> str:
        return f"{'.'.join(self.path)}={self.kind}"

    def apply(self, config: dict[str, Any]) -> dict[str, Any]:
        """A copy of `config` with this one edit."""
        out = json.loads(json.dumps(config))
        parent = out
        for key in self.path[:-1]:
            parent = parent[key]
        if self.value is REMOVED:
            del parent[self.path[-1]]
        else:
            parent[self.path[-1]] = self.value
        return out


def _float_for_int(value: Any) -> Any:
    # bool is an int to Python, not to a config: a float for it is no "float for an int"
    return value + 0.5 if isinstance(value, int) and not isinstance(value, bool) else None


# kind -> the edited value of a key holding `value` (None: the kind does not apply).
MUTATIONS = {
    "null": lambda value: None if value is not None else REMOVED,  # null of null: dropped
    "string": lambda value: "x",
    "negative": lambda value: -1,
    "zero": lambda value: 0,
    "float": _float_for_int,
    "huge": lambda value: HUGE,
    "list": lambda value: [1, 2],
    "empty_dict": lambda value: {} if isinstance(value, dict) else None,
    "removed": lambda value: REMOVED,
}


def mutations(config: dict[str, Any]) -> list[Mutation]:
    """Every one-key edit of `config` (and of its NESTED objects' keys) that changes it."""
    out = []
    for path, value in _keys(config):
        for kind, make in MUTATIONS.items():
            new = make(value)
            if kind == "empty_dict" and path[-1] not in DICT_KEYS:
                continue
            if new is None and kind != "null" or (new is not REMOVED and new == value
                                                 and type(new) is type(value)):
                continue
            if kind == "null" and new is REMOVED:
                continue  # already null: "removed" covers it
            out.append(Mutation(path, kind, new))
    return out


def _keys(config: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in config.items():
        yield (key,), value
        if key in NESTED and isinstance(value, dict):
            for inner, inner_value in value.items():
                yield (key, inner), inner_value
                # per layer type (Gemma 3's rope_parameters): their keys too
                if isinstance(inner_value, dict) and key != "text_config":
                    for leaf, leaf_value in inner_value.items():
                        yield (key, inner, leaf), leaf_value


@dataclass(frozen=True)
class Outcome:
    kind: str  # "ok", "refused" or "crash"
    message: str  # the refusal's message, or the crash's type, message and place


def try_export(hf_dir: Path, config: dict[str, Any], work: Path,
               baseline: ModelConfig | None = None) -> Outcome:
    """Export `hf_dir` with `config` as its config.json into a fresh folder under `work`.

    Where `baseline` (the unmutated checkpoint's config, which exports) equals the edited
    config's ModelConfig, the export is not run: export reads config.json only through
    ModelConfig.from_dir, so its outcome is the baseline's. The check that the folder
    holds no partial bundle runs either way."""
    src = _linked_copy(hf_dir, work / "hf")
    (src / "config.json").write_text(json.dumps(config))
    out = work / "out"
    try:
        if baseline is not None and ModelConfig.from_dir(src) == baseline:
            return Outcome("ok", "as the unmutated config")
        export(src, out, OPTIONS)
        outcome = Outcome("ok", "")
    except EdgeprefillError as err:
        outcome = Outcome("refused", str(err))
    except Exception as err:  # what the sweep is for: anything else is a crash
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"
        outcome = Outcome("crash", f"{type(err).__name__}: {err} [{where}]")
    finally:
        leftovers = [p.name for p in work.iterdir() if ".partial-" in p.name or
                     ".old-" in p.name]
    assert not leftovers, f"staging folders left: {leftovers}"
    if outcome.kind == "ok" and out.exists():
        assert not (out / PARTIAL_MARKER).exists()
        assert (out / "edgeprefill.json").is_file()
    if outcome.kind != "ok":
        assert not out.exists(), f"{out} exists after a failed export"
    if out.exists():
        shutil.rmtree(out)
    return outcome


def _linked_copy(hf_dir: Path, dest: Path) -> Path:
    """`hf_dir` as links to its files (the weights are read, never written), its
    config.json left to the caller."""
    if not dest.exists():
        dest.mkdir()
        for path in hf_dir.iterdir():
            if path.name != "config.json":
                (dest / path.name).symlink_to(path.resolve())
    return dest


def sweep(family: str, hf_dir: Path, work: Path) -> Iterator[tuple[Mutation, Outcome]]:
    """Every mutation of `family`'s config and what export makes of it."""
    config = json.loads((hf_dir / "config.json").read_text())
    baseline = ModelConfig.from_dir(hf_dir)
    for mutation in mutations(config):
        yield mutation, try_export(hf_dir, mutation.apply(config), work, baseline)


def main(families: list[str], models: Path | None = None) -> None:
    """Print each crash and each family's counts; the tiny models are built under
    `models` (kept there for the next run) or a temporary folder."""
    import tempfile

    from edgeprefill.export import staging
    from tests.conftest import FAMILIES, build_hf_model

    staging._sync = lambda folder: None  # the sweep's bundles need not survive a power cut
    with tempfile.TemporaryDirectory() as tmp:
        for family in families or list(FAMILIES):
            hf_dir = (models or Path(tmp)) / family
            if not (hf_dir / "config.json").is_file():
                hf_dir.mkdir(parents=True, exist_ok=True)
                build_hf_model(family, hf_dir)
            work = Path(tmp) / f"work-{family}"
            work.mkdir()
            counts = {"ok": 0, "refused": 0, "crash": 0}
            for mutation, outcome in sweep(family, hf_dir, work):
                counts[outcome.kind] += 1
                if outcome.kind == "crash" or "\n" in outcome.message:
                    print(f"CRASH {family} {mutation}: {outcome.message}", flush=True)
            print(f"done {family} {counts}", flush=True)


if __name__ == "__main__":
    import logging
    import os
    import sys

    logging.disable(logging.WARNING)
    cache = os.environ.get("FUZZ_MODELS")
    main(sys.argv[1:], Path(cache) if cache else None)
