"""A disk cache of the weights load-time rewrites derive (int8 from int4, MatMulInt4's
repacking, packed bf16), so that only a bundle's first load pays for deriving them.

Deriving is numpy work over every weight: 1.2 s of a 1.65 s int4 load for a 135M model,
and ten times that for a 1.5B one. A later load maps the cached arrays read-only instead:
ONNX Runtime reads them in place (no copy), and processes that load the same bundle share
their pages.

Where: `$EDGEPREFILL_DERIVED_CACHE` (an absolute folder), else
`$XDG_CACHE_HOME/edgeprefill/derived` (or `~/.cache/...`); `EDGEPREFILL_DERIVED_CACHE=off`
turns it off, any other value is refused in one line. One folder per bundle state:
its key hashes the bundle's resolved path, the size, modification time and recorded
sha256 of its weight files, and the source of the code that derives (an edit there, or a
re-export, gives a new key; the new folder replaces the ones the same bundle left, and
those of bundles that are gone). Each array is its own `.npy` file, written under a
temporary name and renamed into place, so concurrent loads never read half a file; beside
it a `.spec` file records its dtype and shape, so that a file replaced by another array
(which np.load reads without complaint) is derived again too, not handed to a rewrite
that expects another shape. The cache is a speed-up only: a cache that cannot be read or
written means the weights are derived as without it (a warning says why, once per load).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.cache_dir import user_cache_dir
from edgeprefill.errors import BackendError

CACHE_ENV = "EDGEPREFILL_DERIVED_CACHE"
BUNDLE_FILE = "bundle.txt"  # in each key's folder: the bundle it came from
SPEC = ".spec"  # beside each array: its dtype and shape

log = logging.getLogger(__name__)


def cache_root() -> Path | None:
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        if not Path(value).is_absolute():  # "0" or "false" would be a folder of that name
            raise BackendError(f"{CACHE_ENV}={value!r}: give an absolute folder, or off")
        return Path(value)
    try:
        return user_cache_dir("derived")
    except RuntimeError:  # no home folder (a service account): no cache
        return None


@functools.cache
def code_digest() -> str:
    """The source of the modules that derive weights (this package's ORT rewrites and the
    quantization helpers they call): a change there may change what they derive."""
    here = Path(__file__).resolve().parent
    sources = sorted(here.glob("*.py")) + [here.parent.parent / "export" / "quantize.py"]
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def spec(array: np.ndarray) -> str:
    """What the `.spec` file beside an array records: its dtype and shape."""
    return f"{array.dtype.str} {list(array.shape)}"


def file_name(name: str) -> str:
    """Initializer names hold dots and slashes: the file is named by the name's hash."""
    return hashlib.sha256(name.encode()).hexdigest()[:24] + ".npy"


class DerivedCache:
    """The cache folder of one bundle state."""

    def __init__(self, folder: Path, bundle_dir: Path) -> None:
        self.folder = folder
        self.bundle = str(bundle_dir.resolve())
        self.warned = False
        self.prepared = False

    @classmethod
    def for_bundle(cls, bundle_dir: Path, weight_files: Sequence[str]) -> DerivedCache | None:
        root = cache_root()
        if root is None:
            return None
        key = hashlib.sha256(code_digest().encode())
        key.update(str(bundle_dir.resolve()).encode())
        recorded = _recorded_digests(bundle_dir)
        for name in sorted(set(weight_files)):
            try:
                stat = (bundle_dir / name).stat()
            except OSError:
                return None  # the session's load reports a missing weight file
            # The export's digest of the file too: a copy that keeps modification times
            # (cp -a, rsync -a, tar) of another export the same size is another key.
            key.update(f"\0{name}\0{stat.st_size}\0{stat.st_mtime_ns}"
                       f"\0{recorded.get(name, '')}".encode())
        return cls(root / key.hexdigest()[:32], bundle_dir)

    def load(self, names: Sequence[str]) -> list[np.ndarray] | None:
        """The arrays under `names`, mapped read-only, or None when any is missing,
        unreadable, or not the dtype and shape recorded when it was stored."""
        try:
            if not self.folder.is_dir():
                return None  # nothing cached yet (or no folder can be: store says so)
            arrays = []
            for name in names:
                path = self.folder / file_name(name)
                array = np.load(path, mmap_mode="r", allow_pickle=False)
                if path.with_suffix(SPEC).read_text() != spec(array):
                    self._warn(f"cannot read it ({path.name} is not the array it recorded)",
                               "deriving them again")
                    return None
                arrays.append(array)
            return arrays
        except FileNotFoundError:
            return None
        # A folder the user may not enter, a truncated, empty or foreign file: derive again.
        except (OSError, ValueError, EOFError) as err:
            self._warn(f"cannot read it ({err})", "deriving them again")
            return None

    def store(self, names: Sequence[str], arrays: Sequence[np.ndarray]) -> None:
        try:
            self._prepare()
            for name, array in zip(names, arrays, strict=True):
                path = self.folder / file_name(name)
                # the array first: an array left without its spec (a failed write) is
                # derived again, as a missing one
                self._write(path, array)
                self._write(path.with_suffix(SPEC), spec(array).encode())
        except OSError as err:
            self._warn(f"cannot write it ({err})", "deriving them at each load instead")

    @staticmethod
    def _write(path: Path, content: np.ndarray | bytes) -> None:
        """An array (as .npy) or bytes, under a temporary name renamed into place."""
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        try:
            with open(partial, "wb") as out:
                if isinstance(content, bytes):
                    out.write(content)
                else:
                    np.save(out, content, allow_pickle=False)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)  # a full disk leaves no half file behind

    def _prepare(self) -> None:
        """Creates this key's folder and removes the folders the same bundle left under
        other keys (an older export or older code) and those of bundles that are gone: one
        state per bundle stays."""
        if self.prepared:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / BUNDLE_FILE).write_text(self.bundle)
        for other in self.folder.parent.iterdir():
            bundle = _bundle_of(other)
            if other != self.folder and bundle is not None and (
                    bundle == self.bundle or not Path(bundle).is_dir()):
                shutil.rmtree(other, ignore_errors=True)
        self.prepared = True

    def _warn(self, why: str, then: str) -> None:
        """`then`: what the load does instead: a file that cannot be read is derived again
        and stored anew (the next load reads it); a folder that cannot be written means
        deriving at every load."""
        if not self.warned:
            log.warning("derived-weights cache %s: %s; %s (%s=off turns the cache off)",
                        self.folder, why, then, CACHE_ENV)
            self.warned = True


def describe(bundle_dir: Path, weight_files: Sequence[str]) -> str:
    """What `inspect` says of this bundle's derived-weights cache."""
    cache = DerivedCache.for_bundle(bundle_dir, weight_files)
    if cache is None:
        return f"not cached ({CACHE_ENV}=off, or no cache folder here)"
    files = list(cache.folder.glob("*.npy")) if cache.folder.is_dir() else []
    if not files:
        return f"{cache.folder} (empty: the first load that derives weights fills it)"
    size = sum(f.stat().st_size for f in files) / 1e6
    shown = f"{size:.0f}" if size >= 10 else f"{size:.2f}"  # a small model's: not "0 MB"
    return f"{cache.folder} ({len(files)} arrays, {shown} MB from an earlier load)"


def _recorded_digests(bundle_dir: Path) -> dict[str, str]:
    """The sha256 the manifest records for each file ({} where it cannot be read: the
    load reports that)."""
    try:
        files = json.loads((bundle_dir / MANIFEST_FILE).read_text())["files"]
        return {name: str(entry["sha256"]) for name, entry in files.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def _bundle_of(folder: Path) -> str | None:
    try:
        return (folder / BUNDLE_FILE).read_text()
    except OSError:
        return None
