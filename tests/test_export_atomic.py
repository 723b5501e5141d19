"""`export` is atomic: a failed export keeps the old bundle, a killed one leaves nothing
that blocks the next `export --overwrite` (which `make demo` runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.errors import ExportError
from edgeprefill.export import exporter
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.staging import PARTIAL_MARKER

OPTIONS = dict(chunks=(16,), max_context=64, show_progress=False)


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_failure_mid_export_leaves_the_old_bundle_intact(hf_model, tmp_path, monkeypatch):
    out = tmp_path / "bundle"
    export(hf_model("llama"), out, ExportOptions(**OPTIONS))
    before = snapshot(out)
    write = exporter.write_external_data

    def write_then_fail(weights, path, show_progress=True):
        write(weights[:2], path, show_progress)  # half the weights are on disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(exporter, "write_external_data", write_then_fail)
    # One line for the user, not an OSError traceback.
    with pytest.raises(ExportError, match="cannot write the bundle .*: No space left on device"):
        export(hf_model("llama"), out, ExportOptions(overwrite=True, **OPTIONS))
    assert snapshot(out) == before
    load_manifest(out, verify_checksums=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no staging left


def test_a_half_written_folder_is_replaced_by_overwrite_only(hf_model, tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / PARTIAL_MARKER).write_text("")
    (out / "model.onnx.data").write_bytes(b"\0" * 100)  # what a killed export left
    with pytest.raises(ExportError, match="half-written.*--overwrite"):
        export(hf_model("llama"), out, ExportOptions(**OPTIONS))
    export(hf_model("llama"), out, ExportOptions(overwrite=True, **OPTIONS))
    assert not (out / PARTIAL_MARKER).exists()
    load_manifest(out, verify_checksums=True)


def test_a_folder_that_is_no_bundle_is_never_overwritten(hf_model, tmp_path):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"keep me")
    with pytest.raises(ExportError, match="not an edgeprefill bundle"):
        export(hf_model("llama"), out, ExportOptions(overwrite=True, **OPTIONS))
    assert snapshot(out) == {"holiday.jpg": b"keep me"}


def test_overwrite_replaces_a_bundle_never_what_the_user_keeps_beside_it(hf_model, tmp_path):
    """--overwrite deletes the whole folder: it had taken any folder holding a file named
    edgeprefill.json (even `{}`), with the notes, runs and checkpoints beside it."""
    options = ExportOptions(overwrite=True, **OPTIONS)
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    (home / "Documents" / "thesis.tex").write_text("keep me")
    (home / MANIFEST_FILE).write_text("{}")
    with pytest.raises(ExportError, match="not an edgeprefill bundle"):
        export(hf_model("llama"), home, options)
    assert (home / "Documents" / "thesis.tex").read_text() == "keep me"

    bundle = tmp_path / "bundle"
    export(hf_model("llama"), bundle, options)
    (bundle / "NOTES.md").write_text("keep me")
    (bundle / "runs").mkdir()
    with pytest.raises(ExportError, match=r"besides a bundle it holds NOTES.md, runs/"):
        export(hf_model("llama"), bundle, options)
    assert (bundle / "NOTES.md").read_text() == "keep me" and (bundle / "runs").is_dir()
    (bundle / "NOTES.md").unlink()
    (bundle / "runs").rmdir()
    (bundle / "engines").mkdir()  # `edgeprefill build`'s engines: the bundle's own
    export(hf_model("llama"), bundle, options)
    assert not (bundle / "engines").exists()


def test_a_killed_export_leaves_the_target_alone_and_its_staging_is_cleaned(
    hf_model, tmp_path
):
    out = tmp_path / "bundle"
    export(hf_model("llama"), out, ExportOptions(**OPTIONS))
    before = snapshot(out)
    # A real kill: the child stops itself with SIGKILL while writing weights.
    script = (
        "import os, signal, sys\n"
        "from edgeprefill.export import exporter\n"
        "def die(*a, **k): os.kill(os.getpid(), signal.SIGKILL)\n"
        "exporter.onnx.save_model = die\n"
        "exporter.export(sys.argv[1], sys.argv[2], exporter.ExportOptions("
        "chunks=(16,), max_context=64, show_progress=False, overwrite=True))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script, str(hf_model("llama")), str(out)],
                          env=env, timeout=120)
    assert done.returncode == -9
    leftovers = [p for p in tmp_path.iterdir() if p.name != "bundle"]
    assert len(leftovers) == 1 and (leftovers[0] / PARTIAL_MARKER).is_file()
    assert snapshot(out) == before  # the old bundle was never touched
    export(hf_model("llama"), out, ExportOptions(overwrite=True, **OPTIONS))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
    assert (out / MANIFEST_FILE).is_file()


@pytest.mark.parametrize("sent, ignored", [("SIGTERM", False), ("SIGHUP", False),
                                           ("SIGHUP", True)])
def test_sigterm_stops_an_export_as_ctrl_c_does(hf_model, tmp_path, sent, ignored):
    """timeout, docker stop and systemd send SIGTERM, a closed terminal SIGHUP: their
    default action had left the staging folder behind, up to a whole bundle, until the
    next export to that place (a GGUF's conversion folder, named at random, for good).
    A SIGHUP the process ignores (nohup) stays ignored: the export goes on."""
    out = tmp_path / "bundle"
    script = (
        "import os, signal, sys\n"
        "from edgeprefill.export import exporter\n"
        # as a terminal's child has it, or nohup's (the suite may itself run under nohup)
        f"signal.signal(signal.SIGHUP, signal.{'SIG_IGN' if ignored else 'SIG_DFL'})\n"
        "save = exporter.onnx.save_model\n"
        f"def term(*a, **k): os.kill(os.getpid(), signal.{sent}); return save(*a, **k)\n"
        "exporter.onnx.save_model = term\n"  # the signal arrives mid-export
        "from edgeprefill.cli.main import main\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script, "export", str(hf_model("llama")),
                           "-o", str(out), "--chunks", "16", "--max-context", "64", "--quiet"],
                          env=env, timeout=120, capture_output=True, text=True)
    assert "Traceback" not in done.stderr
    if ignored:
        assert done.returncode == 0 and [p.name for p in tmp_path.iterdir()] == ["bundle"]
    else:
        assert done.returncode == 130
        assert list(tmp_path.iterdir()) == []  # no bundle, no staging folder


@pytest.mark.parametrize("fails", [False, True])
def test_an_export_in_process_puts_the_sigterm_handler_back(hf_model, tmp_path, fails):
    """The command run in a process that goes on (a test, an app) left its SIGTERM handler
    installed: a later SIGTERM raised KeyboardInterrupt wherever that process stood."""
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    def mine(signum, frame):  # the process's own handler, before the export
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        if fails:
            (tmp_path / "hf").mkdir()  # no config.json: the export fails
        hf = tmp_path / "hf" if fails else hf_model("llama")
        result = CliRunner().invoke(cli, ["export", str(hf), "-o", str(tmp_path / "b"),
                                          "--chunks", "16", "--max-context", "64",
                                          "--quiet"])
        assert (result.exit_code != 0) == fails, result.output
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("existing", [False, True])
def test_a_target_another_export_wrote_meanwhile_is_left_alone(hf_model, tmp_path,
                                                                 monkeypatch, existing):
    """Two exports to one place had both reported success, the first one's bundle gone."""
    out = tmp_path / "bundle"
    if existing:
        export(hf_model("llama"), out, ExportOptions(**OPTIONS))
    real = exporter.write_external_data

    def meanwhile(*args, **kwargs):  # another export finishes while this one writes
        script = ("import sys\nfrom edgeprefill.export import exporter\n"
                  "exporter.export(sys.argv[1], sys.argv[2], exporter.ExportOptions("
                  "chunks=(16,), max_context=64, show_progress=False, overwrite=True))\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        subprocess.run([sys.executable, "-c", script, str(hf_model("qwen2")), str(out)],
                       env=env, timeout=120, check=True)
        return real(*args, **kwargs)

    monkeypatch.setattr(exporter, "write_external_data", meanwhile)
    with pytest.raises(ExportError, match="changed while this export ran"):
        export(hf_model("llama"), out, ExportOptions(overwrite=True, **OPTIONS))
    assert load_manifest(out).model.family == "qwen2"  # the other export's bundle stands
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_a_swap_cut_between_its_renames_leaves_nothing_for_good(hf_model, tmp_path):
    """Killed between the swap's two renames, an export left the old bundle moved aside and
    the new one unmarked beside it: twice the bundle, never removed."""
    out = tmp_path / "bundle"
    export(hf_model("llama"), out, ExportOptions(**OPTIONS))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    out.rename(tmp_path / f".bundle.old-{dead}")
    export(hf_model("llama"), tmp_path / "new", ExportOptions(**OPTIONS))
    (tmp_path / "new").rename(tmp_path / f".bundle.partial-{dead}")  # complete, unmarked
    export(hf_model("llama"), out, ExportOptions(**OPTIONS))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_the_bundle_reaches_the_disk_before_it_is_renamed_into_place(hf_model, tmp_path,
                                                                      monkeypatch):
    """A power cut after the rename had been able to leave files of the right sizes and
    zeros (nothing was flushed)."""
    from edgeprefill.export import staging

    synced, renamed = [], []
    real_fsync, real_swap = os.fsync, staging._swap_in
    monkeypatch.setattr(staging.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    monkeypatch.setattr(staging, "_swap_in",
                        lambda *a: renamed.append(len(synced)) or real_swap(*a))
    export(hf_model("llama"), tmp_path / "bundle", ExportOptions(**OPTIONS))
    files = [p for p in (tmp_path / "bundle").iterdir() if p.is_file()]
    assert renamed == [len(files) + 2]  # every file, the marker, the folder: before the swap


def test_a_target_inside_the_current_folder_is_exported_and_its_parents_refused(
        hf_model, tmp_path, monkeypatch):
    """The current-folder check had been the wrong way round: every target inside the
    current folder was refused (make demo's `-o build/tiny-recall` from the repo root)."""
    monkeypatch.chdir(tmp_path)
    export(hf_model("llama"), Path("build") / "b", ExportOptions(**OPTIONS))
    assert (tmp_path / "build" / "b" / MANIFEST_FILE).is_file()
    monkeypatch.chdir(tmp_path / "build")
    for holding in (".", "..", str(tmp_path)):
        with pytest.raises(ExportError, match="holds the current folder"):
            export(hf_model("llama"), Path(holding), ExportOptions(overwrite=True, **OPTIONS))


def test_a_link_to_a_folder_is_exported_where_it_points(hf_model, tmp_path):
    """`ln -s /mnt/ssd/models out`: the bundle goes where the link points and the link
    stays. The link had been moved aside and replaced by a folder (and `.link.old-PID`,
    the moved link, stayed for good); a dangling link failed after the whole export,
    naming the staging folder."""
    real = tmp_path / "real"
    export(hf_model("llama"), real, ExportOptions(**OPTIONS))
    (tmp_path / "link").symlink_to(real)
    export(hf_model("qwen2"), tmp_path / "link", ExportOptions(overwrite=True, **OPTIONS))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
    assert (tmp_path / "link").is_symlink() and load_manifest(real).model.family == "qwen2"
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ExportError, match="is a link to .*nowhere, which does not exist"):
        export(hf_model("llama"), tmp_path / "dangling", ExportOptions(**OPTIONS))


def test_the_root_folder_is_refused_in_one_line(hf_model, tmp_path):
    with pytest.raises(ExportError, match="holds the current folder"):
        export(hf_model("llama"), Path("/"), ExportOptions(**OPTIONS))
