"""Which edgeprefill a benchmark measures: the folder the project's python imports the
package from, that folder's commit, and whether its package has uncommitted changes.

A report names it beside the machine. Stop 46's tables named the checkout's commits while
the venv's editable install pointed at another clone (docs/benchmarks.md, stop 47): the
checkout is not necessarily what runs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from comparison.settings import REPO_DIR

# Run from "/", so that the current folder does not shadow the installed package.
FIND = ("import pathlib, edgeprefill; "
        "print(pathlib.Path(edgeprefill.__file__).resolve().parent.parent)")


def package_origin(python: Path) -> dict[str, Any]:
    """{"folder", "commit", "modified"} of the package `python` imports, or {"error"}."""
    try:
        folder = _output([str(python), "-c", FIND])
    except (OSError, subprocess.CalledProcessError) as error:
        return {"error": f"cannot import edgeprefill with {python}: {error}"}
    origin: dict[str, Any] = {"folder": folder}
    try:
        origin["commit"] = _output(["git", "-C", folder, "rev-parse", "--short", "HEAD"])
        changes = _output(["git", "-C", folder, "status", "--porcelain",
                           "--untracked-files=no", "--", "edgeprefill"])
        origin["modified"] = bool(changes)
    except (OSError, subprocess.CalledProcessError):
        origin["commit"] = "not a git checkout"
    return origin


def describe(origin: dict[str, Any]) -> str:
    """One line: the folder, its commit and state, and a warning where it is not this
    checkout."""
    if "error" in origin:
        return f"edgeprefill package: {origin['error']}"
    state = ", uncommitted changes" if origin.get("modified") else ""
    line = f"edgeprefill package: {origin['folder']} ({origin['commit']}{state})"
    if Path(origin["folder"]).resolve() != REPO_DIR.resolve():
        line += f" -- NOT this checkout ({REPO_DIR})"
    return line


def _output(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, cwd="/",
                          timeout=60).stdout.strip()
