"""FP8 checkpoints (transformers' "fp8" quantization: Ministral 3's Instruct releases, the
-FP8 releases of Qwen3 and others) export as transformers loads them on a CPU: each float8
weight times its `weight_scale_inv`, block by block or per weight.

The checkpoints are quantized here from the random fixtures, the way the releases store
them (float8 e4m3 weights, float32 scales of amax / 448 per block); the reference is
transformers' own loading of that checkpoint (its FP8 quantizer dequantizes where it has
no FP8 kernels), so nothing in the test shares export's reading of float8 or its scaling."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")  # transformers' FP8 quantizer needs it to load

from edgeprefill.export.exporter import ExportOptions, export  # noqa: E402
from tests.conftest import build_hf_model, load_hf_model  # noqa: E402
from tests.test_cli_errors import assert_one_line_error, cli  # noqa: E402
from tests.test_families import last_logits  # noqa: E402

E4M3_MAX = 448.0
IDS = list(range(3, 40))


def quantize_fp8(src: Path, out: Path, block: list[int] | None, static: bool = False,
                 scale_dtype=None) -> Path:
    """`src` saved as an FP8 release: every projection weight (`*_proj.weight`, also under
    an image-text prefix) as float8 e4m3 with its scales; a static scheme adds each
    projection's activation scale, which a dequantized model does not use."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.name != "model.safetensors":
            shutil.copy(path, out / path.name)
    tensors = {}
    for name, weight in load_file(src / "model.safetensors").items():
        if not name.endswith("_proj.weight") or "vision" in name:
            tensors[name] = weight
            continue
        q, scale = _quantized(weight.float(), block)
        tensors[name] = q
        tensors[name + "_scale_inv"] = scale if scale_dtype is None else scale.to(scale_dtype)
        if static:
            tensors[name.removesuffix("weight") + "activation_scale"] = torch.tensor(0.5)
    save_file(tensors, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": block,
                                     "activation_scheme": "static" if static else "dynamic"}
    (out / "config.json").write_text(json.dumps(config))
    return out


def _quantized(weight, block):
    rows, cols = weight.shape
    if block is None:
        scale = weight.abs().max() / E4M3_MAX
        return (weight / scale).to(torch.float8_e4m3fn), scale.reshape(())
    block_rows, block_cols = block
    grid = (math.ceil(rows / block_rows), math.ceil(cols / block_cols))
    padded = torch.zeros(grid[0] * block_rows, grid[1] * block_cols)
    padded[:rows, :cols] = weight
    blocks = padded.reshape(grid[0], block_rows, grid[1], block_cols)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
    q = (blocks / scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
    return q.to(torch.float8_e4m3fn), scale


def transformers_logits(hf_dir: Path) -> np.ndarray:
    """transformers' logits of the checkpoint, an FP8 one dequantized by its loader."""
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0, -1].numpy()


def dequantized_logits(float_dir: Path, fp8_dir: Path, block: list[int]) -> np.ndarray:
    """transformers' logits of the float model with each FP8 weight replaced by
    transformers' own _dequantize_fp8_weight of it: where blocks do not divide a weight,
    its loader reads the scales as an even grid instead (blocks of rows // grid rows),
    which is not how the weights were quantized, so it is no reference there."""
    from safetensors.torch import load_file
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    stored = load_file(fp8_dir / "model.safetensors")
    model = load_hf_model(float_dir)
    state = model.state_dict()
    for name, weight in stored.items():
        if weight.dtype == torch.float8_e4m3fn:
            state[name] = _dequantize_fp8_weight(weight, stored[name + "_scale_inv"], block,
                                                 torch.float32)
    model.load_state_dict(state)
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0, -1].numpy()


@pytest.mark.parametrize("family, block, static", [
    ("llama", [32, 32], False),
    ("llama", [48, 40], False),  # blocks that do not divide the weights: partial edges
    ("llama", None, True),  # one scale per weight, a static scheme's activation scales
    ("mistral3", None, True),  # Ministral 3's release: nested, prefixed, static
])
def test_an_fp8_checkpoint_exports_as_transformers_dequantizes_it(tmp_path, family, block,
                                                                  static):
    hf = quantize_fp8(build_hf_model(family, tmp_path / "float"), tmp_path / "fp8", block,
                      static)
    divides = block is None or all(64 % b == 0 and 96 % b == 0 for b in block)
    expected = (transformers_logits(hf) if divides
                else dequantized_logits(tmp_path / "float", hf, block))
    # The float8 rounding matters (else the test could not tell a reader that ignores it).
    assert np.abs(expected - transformers_logits(tmp_path / "float")).max() > 1e-2
    out = tmp_path / "bundle"
    export(hf, out, ExportOptions(chunks=(16,), max_context=64, show_progress=False))
    np.testing.assert_allclose(last_logits(out, IDS), expected, rtol=1e-4, atol=1e-4)
    scales = "one scale per weight" if block is None else f"a scale per {block[0]}x{block[1]} block"
    described = f"FP8 weights ({scales}), dequantized to float"  # the manifest and inspect
    assert described in json.loads((out / "edgeprefill.json").read_text())["source"]["quirks"]
    assert described in cli("inspect", out).stdout


def test_bf16_scales_read_as_transformers_reads_them(tmp_path):
    hf = quantize_fp8(build_hf_model("llama", tmp_path / "float"), tmp_path / "fp8", [32, 32],
                      scale_dtype=torch.bfloat16)
    out = tmp_path / "bundle"
    export(hf, out, ExportOptions(chunks=(16,), max_context=64, show_progress=False))
    np.testing.assert_allclose(last_logits(out, IDS), transformers_logits(hf), rtol=1e-4,
                               atol=1e-4)


def test_other_quantizations_and_bad_fp8_configs_are_one_line(tmp_path):
    hf = quantize_fp8(build_hf_model("llama", tmp_path / "float"), tmp_path / "fp8", [32, 32])
    path = hf / "config.json"
    config = json.loads(path.read_text())
    for quant, fragment in (({"quant_method": "hqq", "nbits": 4},
                             "quantized (quantization_config, hqq)"),
                            ({"quant_method": "fp8", "weight_block_size": [32]},
                             "weight_block_size must be two positive integers")):
        path.write_text(json.dumps({**config, "quantization_config": quant}))
        assert_one_line_error(cli("export", hf, "-o", tmp_path / "out"), fragment)
    # float8 weights without the config that says how they are scaled
    path.write_text(json.dumps({k: v for k, v in config.items()
                                if k != "quantization_config"}))
    assert_one_line_error(cli("export", hf, "-o", tmp_path / "out"),
                          "stored as F8_E4M3, but config.json has no fp8 quantization_config")
    # scales of the wrong shape for the block size
    path.write_text(json.dumps({**config, "quantization_config": {
        "quant_method": "fp8", "weight_block_size": [16, 16]}}))
    assert_one_line_error(cli("export", hf, "-o", tmp_path / "out"),
                          "weight_block_size [16, 16] implies")
