"""The sampling defaults a checkpoint ships in `generation_config.json`.

Export copies the file into the bundle. Its temperature, top_k, top_p and
repetition_penalty become the defaults of every request that does not set them (SDK,
`edgeprefill run`, the server), and its `eos_token_id` list joins the manifest's EOS ids.
Explicit values always win. As in vLLM, a value the file sets is a default even without
`do_sample: true`; an explicit `do_sample: false` (transformers' greedy search) makes the
default temperature 0.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from edgeprefill.errors import BundleError, ExportError
from edgeprefill.json_file import load_json_object
from edgeprefill.sdk.params import GenerationParams
from edgeprefill.values import is_finite, is_int

FILE = "generation_config.json"

_T = TypeVar("_T")


@dataclass(frozen=True)
class GenerationDefaults:
    """What the checkpoint sets; None: it says nothing, GenerationParams' default holds."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check("temperature", self.temperature, is_finite(self.temperature)
               and self.temperature >= 0, "a finite number >= 0")
        _check("top_k", self.top_k, is_int(self.top_k) and self.top_k >= 0, "an integer >= 0")
        _check("top_p", self.top_p, is_finite(self.top_p) and 0 < self.top_p <= 1,
               "a number in (0, 1]")
        _check("repetition_penalty", self.repetition_penalty,
               is_finite(self.repetition_penalty) and self.repetition_penalty > 0,
               "a finite number > 0")
        if not all(is_int(i) and i >= 0 for i in self.eos_token_ids):
            raise BundleError(f"{FILE}: eos_token_id must be an integer >= 0 or a list of them, "
                              f"got {list(self.eos_token_ids)!r:.80}")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GenerationDefaults:
        names = [f.name for f in fields(cls) if f.name != "eos_token_ids"]
        values = {name: raw.get(name) for name in names}
        if raw.get("do_sample") is False:
            values["temperature"] = 0.0
        eos = raw.get("eos_token_id")
        return cls(**values, eos_token_ids=tuple(eos) if isinstance(eos, list)
                   else () if eos is None else (eos,))

    @classmethod
    def load(cls, folder: str | Path) -> GenerationDefaults:
        """The defaults of a bundle (or checkpoint) folder; none if it has no such file."""
        path = Path(folder) / FILE
        if not path.is_file():
            return cls()
        return cls.from_dict(load_json_object(path, BundleError))

    def sampling(self) -> dict[str, float | int]:
        """The sampling fields the checkpoint sets, by GenerationParams field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "eos_token_ids" and getattr(self, f.name) is not None}

    def fill(self, params: GenerationParams, given: Collection[str] = ()) -> GenerationParams:
        """`params` with the checkpoint's values in every sampling field not in `given`
        (the fields the caller set explicitly)."""
        def pick(name: str, mine: _T | None, theirs: _T) -> _T:
            return theirs if mine is None or name in given else mine

        return replace(
            params,
            temperature=pick("temperature", self.temperature, params.temperature),
            top_k=pick("top_k", self.top_k, params.top_k),
            top_p=pick("top_p", self.top_p, params.top_p),
            repetition_penalty=pick("repetition_penalty", self.repetition_penalty,
                                    params.repetition_penalty))

    def describe(self) -> str:
        """One line for `inspect`."""
        parts = [f"{k} {v}" for k, v in self.sampling().items()]
        return ", ".join(parts) if parts else "none set"


def check_export_generation_config(hf_dir: Path) -> None:
    """Refuse, in one line, a checkpoint whose generation_config.json the runtime would
    refuse to load (export copies it into the bundle)."""
    try:
        GenerationDefaults.load(hf_dir)
    except BundleError as err:
        # A value's line names the file, not its folder; a file that is no JSON object is
        # named by its whole path already (json_file.py), so it is said once.
        said = str(err)
        raise ExportError(said if said.startswith(str(hf_dir)) else f"{hf_dir}: {said}") \
            from None


def _check(name: str, value: Any, ok: bool, what: str) -> None:
    if value is not None and not ok:
        raise BundleError(f"{FILE}: {name} must be {what}, got {value!r:.40}")
