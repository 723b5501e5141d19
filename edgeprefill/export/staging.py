"""Atomic bundle writes: build in a folder beside the target, swap it in only when whole.

A failed or killed export must never cost the user the bundle they had, and must never
leave a folder that blocks the next `export --overwrite` (`make demo` runs one). So the
exporter writes into `.<name>.partial-<pid>` next to the target, marked by PARTIAL_MARKER
from its first moment to its last; only a complete bundle loses the marker and is renamed
into place. A folder that still holds the marker is known to be half-written: nothing in
it is worth keeping, and `--overwrite` replaces it like a bundle.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatchcase
from pathlib import Path

from edgeprefill.bundle import LICENSE_GLOBS, MANIFEST_FILE
from edgeprefill.engines.trt.cache import ENGINES_DIR
from edgeprefill.errors import ExportError

PARTIAL_MARKER = ".edgeprefill-partial"


def is_partial(folder: Path) -> bool:
    """A folder an export started and did not finish."""
    return (folder / PARTIAL_MARKER).is_file()


def check_target(out_dir: Path, overwrite: bool) -> None:
    """Refuse, before any work, a target that --overwrite may not or cannot replace."""
    if out_dir.is_symlink() and not out_dir.exists():
        raise ExportError(f"{out_dir} is a link to {os.readlink(out_dir)}, which does not exist")
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir} exists and is not a folder")
    here = Path.cwd()
    if out_dir.resolve() in (here, *here.parents):  # `-o .`, `-o ..`, `-o /`
        raise ExportError(f"{out_dir} holds the current folder: export to a folder of its own")
    nearest = next((p for p in out_dir.absolute().parents if p.exists()), None)
    if nearest is not None and not nearest.is_dir():
        raise ExportError(f"{nearest} is a file, not a folder: there can be no {out_dir}")
    if os.path.ismount(out_dir):  # a volume: the bundle could not be renamed onto it
        raise ExportError(f"{out_dir} is a mount point: export into a folder inside it (the "
                          "bundle is written beside its target, then renamed into place)")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        kind = "holds a half-written export" if is_partial(out_dir) else "exists and is not empty"
        raise ExportError(f"{out_dir} {kind} (use --overwrite to replace it)")
    if is_partial(out_dir):
        return  # half-written: nothing in it is worth keeping
    strays = _not_the_bundles(out_dir)
    if strays is None:
        raise ExportError(f"refusing to overwrite {out_dir}: it is not an edgeprefill bundle")
    if strays:
        shown = ", ".join(strays[:3]) + (f" and {len(strays) - 3} more" if len(strays) > 3
                                        else "")
        raise ExportError(f"refusing to overwrite {out_dir}: besides a bundle it holds "
                          f"{shown}; move them out or export elsewhere")


def _not_the_bundles(out_dir: Path) -> list[str] | None:
    """What `out_dir` holds beyond the bundle its manifest lists (folders with a `/`);
    None when it holds no readable manifest with a file list. --overwrite deletes the
    whole folder, so it replaces nothing of the user's: it had taken a folder with any
    file named edgeprefill.json, with every note, run or checkpoint beside it. The
    checkpoint's terms that export copied (LICENSE_GLOBS, unlisted) are the bundle's: a
    bundle of a licensed model had refused every re-export."""
    try:
        raw = json.loads((out_dir / MANIFEST_FILE).read_text())
        listed = {name.split("/")[0] for name in raw["files"]} \
            if isinstance(raw["files"], dict) else None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not listed:
        return None
    ours = listed | {MANIFEST_FILE, ENGINES_DIR}  # engines/: `edgeprefill build`'s cache
    return sorted(p.name + "/" * p.is_dir() for p in out_dir.iterdir()
                  if p.name not in ours and not _is_terms(p))


def _is_terms(path: Path) -> bool:
    return path.is_file() and any(fnmatchcase(path.name, g) for g in LICENSE_GLOBS)


def _cannot_stage(out_dir: Path, err: OSError) -> str:
    """Why the staging folder cannot be made, as the user sees it: a new bundle's folder
    cannot be created; an existing one's folder cannot be replaced, as the new bundle is
    written beside it first."""
    reason = err.strerror or str(err)
    if not out_dir.exists():
        return f"cannot create the output folder {out_dir}: {reason}"
    return (f"cannot write beside {out_dir} in {out_dir.parent}: {reason} (the bundle is "
            "written there first, then renamed into place)")


@contextmanager
def staged(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty marked folder beside `out_dir`; on success swap it into `out_dir`,
    on failure delete it and leave `out_dir` exactly as it was. A target that is a link
    to a folder is written where it points (`ln -s /mnt/ssd/models out`), the link kept."""
    if out_dir.is_symlink() and out_dir.is_dir():
        out_dir = out_dir.resolve()
    check_target(out_dir, overwrite)
    checked = _state(out_dir)
    stage = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(out_dir)
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
        (stage / PARTIAL_MARKER).write_text("an edgeprefill export is writing this folder\n")
    except OSError as err:  # a parent that is a file, a read-only or missing mount, ...
        raise ExportError(_cannot_stage(out_dir, err)) from None
    try:
        yield stage
        _sync(stage)
        (stage / PARTIAL_MARKER).unlink()
        if _state(out_dir) != checked:
            raise ExportError(f"{out_dir} changed while this export ran (another export to "
                              "it?): it is left as it is, and this export's bundle removed")
        _swap_in(stage, out_dir)
    except BaseException as err:
        shutil.rmtree(stage, ignore_errors=True)
        if isinstance(err, OSError):  # the disk filled up, the folder went away, ...
            raise ExportError(_failed(out_dir, err)) from None
        raise


def _state(out_dir: Path) -> tuple[int, int] | None:
    """What the target was when checked: a second export to the same place, or a folder
    made there meanwhile, is not replaced unasked (both exports had reported success)."""
    try:
        manifest = out_dir / MANIFEST_FILE
        return out_dir.stat().st_ino, manifest.stat().st_mtime_ns if manifest.exists() else 0
    except OSError:
        return None


def _failed(out_dir: Path, err: OSError) -> str:
    where = f" ({err.filename})" if err.filename else ""
    return f"cannot write the bundle {out_dir}: {err.strerror or err}{where}"


def _swap_in(stage: Path, out_dir: Path) -> None:
    # Two renames on one filesystem: the target is either the old bundle, absent for an
    # instant, or the new one; never a mix. The old one is deleted only afterwards.
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        os.rename(out_dir, old)
    try:
        os.rename(stage, out_dir)
    except OSError:
        if old.exists():
            os.rename(old, out_dir)  # put the old bundle back
        raise
    shutil.rmtree(old, ignore_errors=True)


def _remove_abandoned(out_dir: Path) -> None:
    """Delete what earlier exports to this target left when killed: marked staging
    folders, and the two folders of a swap cut between its renames (the old bundle moved
    aside, the new one unmarked beside it), twice the bundle's size for good."""
    for kind in ("partial", "old"):
        for folder in out_dir.parent.glob(f".{out_dir.name}.{kind}-*"):
            pid = folder.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)) and (
                    kind == "old" or is_partial(folder) or _not_the_bundles(folder) == []):
                shutil.rmtree(folder, ignore_errors=True)


def _sync(folder: Path) -> None:
    """Flush the bundle's files to the disk before it is renamed into place: after a
    power cut (a Jetson pulled from the wall) the rename may survive while the data,
    still in the page cache, did not, leaving a bundle of the right sizes and zeros."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftover (an earlier export in this process)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
