"""Checkpoints saved as PyTorch pickles (`pytorch_model.bin`, single or sharded) export to
the same bundle as their safetensors, read with torch's weights-only loader."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgeprefill.errors import ExportError  # noqa: E402
from edgeprefill.export.exporter import ExportOptions, export  # noqa: E402
from tests.conftest import build_hf_model  # noqa: E402

OPTIONS = ExportOptions(show_progress=False, max_context=128)


def as_torch_files(safetensors_dir: Path, out: Path, shards: int = 1) -> Path:
    """The checkpoint with its weights as pytorch_model.bin (or `shards` files and an
    index), as transformers wrote them before safetensors."""
    from safetensors.torch import load_file

    shutil.copytree(safetensors_dir, out)
    (out / "model.safetensors").unlink()
    weights = load_file(safetensors_dir / "model.safetensors")
    if shards == 1:
        torch.save(weights, out / "pytorch_model.bin")
        return out
    names = sorted(weights)
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {n: weights[n] for n in names[i::shards]}
        torch.save(part, out / file)
        weight_map.update(dict.fromkeys(part, file))
    (out / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return out


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory) -> Path:
    return build_hf_model("llama", tmp_path_factory.mktemp("bf16"), dtype=torch.bfloat16)


@pytest.mark.parametrize("shards", [1, 3])
def test_a_pytorch_checkpoint_exports_the_same_bundle_as_its_safetensors(
        bf16_model, tmp_path, shards):
    export(bf16_model, tmp_path / "from-safetensors", OPTIONS)
    pickled = as_torch_files(bf16_model, tmp_path / "hf", shards)
    export(pickled, tmp_path / "from-torch", OPTIONS)
    for name in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "from-torch" / name).read_bytes() == \
            (tmp_path / "from-safetensors" / name).read_bytes(), name


def test_a_pickle_that_is_not_weights_is_refused_in_one_line(bf16_model, tmp_path):
    pickled = as_torch_files(bf16_model, tmp_path / "hf")
    torch.save({"weights": Path("x")}, pickled / "pytorch_model.bin")  # not weights-only
    with pytest.raises(ExportError, match="not a readable PyTorch checkpoint") as err:
        export(pickled, tmp_path / "b", OPTIONS)
    assert "\n" not in str(err.value)


def test_without_torch_a_pytorch_checkpoint_says_what_to_install(
        bf16_model, tmp_path, monkeypatch):
    pickled = as_torch_files(bf16_model, tmp_path / "hf")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ExportError, match=r"needs torch to read: pip install 'edgeprefill\["):
        export(pickled, tmp_path / "b", OPTIONS)
