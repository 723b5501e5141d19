"""The benchmark reports name the edgeprefill they measure (benchmarks/comparison/
provenance.py): the folder the project's python imports it from, and a warning where that
is not this checkout (stop 46's runs measured another clone's package, docs/benchmarks.md
stop 47)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from comparison.provenance import describe, package_origin  # noqa: E402
from comparison.settings import REPO_DIR  # noqa: E402


def fake_python(tmp_path: Path, folder: Path) -> Path:
    """An executable that answers the package query with `folder`, as a venv whose
    editable install points there would."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho {folder}\n")
    script.chmod(0o755)
    return script


def test_the_package_of_another_clone_is_named_and_flagged(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    (clone / "edgeprefill").mkdir()
    (clone / "edgeprefill" / "x.py").write_text("")
    subprocess.run(["git", "-C", str(clone), "add", "."], check=True)
    subprocess.run(["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-qm", "x"], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    origin = package_origin(fake_python(tmp_path, clone))
    assert origin == {"folder": str(clone), "commit": commit, "modified": False}
    assert describe(origin) == (f"edgeprefill package: {clone} ({commit}) -- NOT this "
                                f"checkout ({REPO_DIR})")
    (clone / "edgeprefill" / "x.py").write_text("changed = 1\n")
    assert "uncommitted changes" in describe(package_origin(fake_python(tmp_path, clone)))


def test_this_checkout_s_package_is_not_flagged(tmp_path):
    origin = package_origin(fake_python(tmp_path, REPO_DIR))
    assert origin["folder"] == str(REPO_DIR)
    assert "NOT" not in describe(origin)


def test_a_python_without_the_package_says_so(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    assert describe(package_origin(broken)).startswith(
        f"edgeprefill package: cannot import edgeprefill with {broken}")
