"""What an export copies beside the graph: the tokenizer files, and the checkpoint's
license and notices as they are (a model's terms go wherever its weights go)."""

from __future__ import annotations

import shutil

import pytest

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export

OPTIONS = ExportOptions(chunks=(16,), max_context=64, show_progress=False)
TERMS = {
    "LICENSE": "Llama 3.2 Community License Agreement\n",
    "NOTICE": "Llama 3.2 is licensed under the Llama 3.2 Community License\n",
    "USE_POLICY.md": "# Acceptable Use Policy\n",
}


def test_the_checkpoints_license_and_notices_are_copied_into_the_bundle(hf_model, tmp_path):
    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_model("llama"), hf_dir)
    for name, text in TERMS.items():
        (hf_dir / name).write_text(text)
    (hf_dir / "README.md").write_text("a model card is not a term of use\n")

    export(hf_dir, tmp_path / "bundle", OPTIONS)

    copied = {p.name: p.read_text() for p in (tmp_path / "bundle").iterdir()
              if p.name in TERMS or p.name == "README.md"}
    assert copied == TERMS


def test_a_checkpoint_without_terms_gives_a_bundle_without_them(hf_model, tmp_path):
    export(hf_model("llama"), tmp_path / "bundle", OPTIONS)

    names = {p.name for p in (tmp_path / "bundle").iterdir()}
    assert not names & set(TERMS)


def test_a_bundle_with_the_checkpoints_terms_is_replaced_by_overwrite(hf_model, tmp_path):
    """export --overwrite replaces "a bundle folder (one holding only a bundle)": the terms
    export copied into it are the bundle's (it had refused: "besides a bundle it holds
    LICENSE, NOTICE, USE_POLICY.md"), a file of the user's beside them is still not."""
    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_model("llama"), hf_dir)
    for name, text in TERMS.items():
        (hf_dir / name).write_text(text)
    options = ExportOptions(overwrite=True, chunks=(16,), max_context=64, show_progress=False)
    export(hf_dir, tmp_path / "bundle", options)
    (hf_dir / "LICENSE").write_text("the new terms\n")

    export(hf_dir, tmp_path / "bundle", options)

    assert (tmp_path / "bundle" / "LICENSE").read_text() == "the new terms\n"
    (tmp_path / "bundle" / "NOTES.md").write_text("keep me")
    with pytest.raises(ExportError, match=r"besides a bundle it holds NOTES.md;"):
        export(hf_dir, tmp_path / "bundle", options)
