"""QLoRA: `edgeprefill export BASE --adapter ADAPTER` where BASE is a bitsandbytes checkpoint
(the 4-bit or 8-bit base the adapter was trained on). The adapter's delta is added to the
weights bitsandbytes dequantizes, in float32, as over a float base; nothing is requantized.

The reference shares nothing with export's unpacking or merging: a float model holding
bitsandbytes' own dequantized weights (tests/test_bnb_checkpoints.py's `bnb_weights`), the
adapter merged into it by peft (`merge_and_unload`). The adapter is made on the float model
and its LoRA tensors randomized (peft starts B at zero, which any merge would pass)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("bitsandbytes")
pytest.importorskip("accelerate")  # transformers' bitsandbytes quantizer needs it

from safetensors.torch import load_file, save_file  # noqa: E402

from tests.conftest import build_hf_model, load_hf_model  # noqa: E402
from tests.test_bnb_checkpoints import WIDTHS, bnb_weights, save_bnb  # noqa: E402
from tests.test_cli_errors import assert_one_line_error, cli  # noqa: E402
from tests.test_lora import (  # noqa: E402
    IDS,
    LLAMA_TARGETS,
    export_with,
    peft_logits,
    trained_adapter,
)
from tests.test_qwen_vl import assert_chunks_match  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_hf_model("llama", tmp_path_factory.mktemp("float") / "llama", **WIDTHS)


def dequantized_copy(float_dir: Path, bnb_dir: Path, out: Path) -> Path:
    """`float_dir` with each weight bitsandbytes quantized replaced by bitsandbytes' own
    float32 dequantization of it, as `bnb_dir` stores it."""
    shutil.copytree(float_dir, out)
    tensors = load_file(out / "model.safetensors")
    dequantized = bnb_weights(bnb_dir)
    assert dequantized and set(dequantized) <= set(tensors)
    for name, weight in dequantized.items():
        assert not np.array_equal(weight, tensors[name].numpy())  # it is quantized
        tensors[name] = torch.from_numpy(weight)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def assert_merged_into_dequantized(llama: Path, tmp_path: Path, kind: str, caplog,
                                   **lora) -> None:
    trained_adapter(llama, tmp_path / "adapter", **lora)
    bnb_dir = save_bnb(llama, tmp_path / kind, kind)
    reference = dequantized_copy(llama, bnb_dir, tmp_path / "dequantized")
    expected = peft_logits(reference, tmp_path / "adapter", merged=True)
    with torch.no_grad():
        unadapted = load_hf_model(reference)(torch.tensor([IDS])).logits[0].numpy()
    assert np.abs(expected - unadapted).max() > 0.1  # the adapter changes the model
    out = export_with(bnb_dir, tmp_path / "adapter", tmp_path / "bundle")
    assert_chunks_match(out, IDS, expected)
    assert "merged into the dequantized bitsandbytes" in caplog.text
    assert "does not use" not in caplog.text  # every side tensor was read
    adapter = json.loads((out / "edgeprefill.json").read_text())["source"]["adapter"]
    assert adapter["path"] == str((tmp_path / "adapter").resolve())


@pytest.mark.parametrize("kind", ["nf4-double", "int8"])
def test_an_adapter_merges_into_the_dequantized_bitsandbytes_weights(llama, tmp_path, kind,
                                                                     caplog):
    assert_merged_into_dequantized(llama, tmp_path, kind, caplog, r=4, lora_alpha=8,
                                   target_modules=LLAMA_TARGETS)


def test_an_embedding_lora_and_a_saved_head_over_an_nf4_base(llama, tmp_path, caplog):
    # bitsandbytes keeps the embeddings and the head float: the embedding's LoRA and the
    # saved head apply to them as over a float base, beside an nf4 q_proj's LoRA
    assert_merged_into_dequantized(llama, tmp_path, "nf4", caplog, r=4, lora_alpha=8,
                                   target_modules=["embed_tokens", "q_proj"],
                                   modules_to_save=["lm_head"])


def test_an_adapter_over_an_fp8_base_is_refused_in_one_line(llama, tmp_path):
    trained_adapter(llama, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=["q_proj"])
    base = shutil.copytree(llama, tmp_path / "fp8")
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic",
        "weight_block_size": [32, 32]}}))
    assert_one_line_error(cli("export", base, "--adapter", tmp_path / "adapter", "-o",
                              tmp_path / "b"),
                          "is a fp8-quantized checkpoint: a LoRA adapter merges into float "
                          "weights only (or a bitsandbytes base's, dequantized)")
    assert not (tmp_path / "b").exists()
