"""int4 bundles at --dtype fp16 (the GPU's int4: ONNX Runtime's CUDA provider runs
MatMulNBits, GatherBlockQuantized and GroupQueryAttention in float16, not the ort flavour's
float32 attention). The reference is transformers' float model with the dequantized weights
put in, and the float32 int4 bundle of the same checkpoint."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int4_dequantize
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import load_hf_model
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_exactness import recurrent_delta_rule
from tests.test_quantize import dequantize_embeddings, logits_at

IDS = [1, 5, 9, 33, 70, 4, 18]


def export_int4(hf_dir, out, dtype: str, accuracy_level: int = 0):
    export(hf_dir, out, ExportOptions(
        dtype=dtype, chunks=(4,), max_context=128, show_progress=False,  # IDS in two chunks
        quant=QuantConfig("int4", 32, accuracy_level=accuracy_level),
    ))
    return out


def initializers(bundle) -> dict[str, np.ndarray]:
    model = onnx.load(bundle / "model.onnx")
    return {t.name: numpy_helper.to_array(t, bundle) for t in model.graph.initializer}


def dequantized_model(hf_dir):
    """transformers' model of `hf_dir` with the int4 bundle's weights: every projection and
    the LM head dequantized, the untied embedding table too."""
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight.numpy()
                packed, scales = int4_blockwise(w, 32)
                module.weight.copy_(torch.from_numpy(int4_dequantize(packed, scales, w.shape[1])))
        dequantize_embeddings(model, "int4")  # the fixtures' tables are untied
    return model


def test_an_fp16_int4_bundle_holds_the_float32_bundles_weights(hf_model, tmp_path):
    """The same 4-bit codes, and scales that are the float32 bundle's exactly (export rounds
    them to float16 values already, quantize.half_exact): an fp16 int4 bundle computes with
    the very weights of the float32 one, only its activations are float16."""
    hf_dir = hf_model("llama")
    fp32 = initializers(export_int4(hf_dir, tmp_path / "fp32", "fp32"))
    fp16 = initializers(export_int4(hf_dir, tmp_path / "fp16", "fp16"))
    quantized = [name for name in fp32 if name.endswith((".int4", ".scale"))]
    assert any(n.startswith("model.embed_tokens") for n in quantized)  # GatherBlockQuantized's
    assert any(n.startswith("lm_head") for n in quantized)
    for name in quantized:
        if name.endswith(".int4"):
            np.testing.assert_array_equal(fp16[name], fp32[name])
        else:
            assert fp16[name].dtype == np.float16
            np.testing.assert_array_equal(fp16[name].astype(np.float32), fp32[name])


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text", "rwkv", "xlstm"])
def test_an_fp16_int4_bundle_computes_transformers_with_the_dequantized_weights(
        hf_model, tmp_path, family):
    """At accuracy level 0 (float activations) the logits are transformers' on the
    dequantized weights, to float16's rounding; a hybrid's state layers too."""
    hf_dir = hf_model(family)
    export_int4(hf_dir, tmp_path / "b", "fp16")
    with torch.no_grad(), recurrent_delta_rule():
        expected = dequantized_model(hf_dir)(torch.tensor([IDS])).logits[0, -1].numpy()
    got = logits_at(tmp_path / "b", IDS)
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() < 0.02 * scale
    assert np.argmax(got) == np.argmax(expected)


def test_an_fp16_int4_bundle_at_level_4_stays_near_level_0(hf_model, tmp_path):
    """The default accuracy level (int8 activations inside MatMulNBits where the kernel
    takes them) moves the logits no further than it does in a float32 bundle's league."""
    hf_dir = hf_model("llama")
    level0 = logits_at(export_int4(hf_dir, tmp_path / "l0", "fp16"), IDS)
    level4 = logits_at(export_int4(hf_dir, tmp_path / "l4", "fp16", accuracy_level=4), IDS)
    assert np.abs(level4 - level0).max() < 0.05 * np.abs(level0).max()


def test_greedy_decode_of_an_fp16_int4_bundle_follows_transformers(hf_model, tmp_path):
    """The SDK's chunked prefill and decode steps on the fp16 KV cache: every token it picks
    is transformers' best on the dequantized weights, or within float16's rounding of it (a
    random model's near ties may go either way; a wrong cache or position would not)."""
    hf_dir = hf_model("llama")
    export_int4(hf_dir, tmp_path / "b", "fp16")
    with Engine.load(tmp_path / "b", threads=2, background=False) as engine:
        got = engine.generate(IDS, GenerationParams(max_new_tokens=12, ignore_eos=True),
                              chunk_size=4).result().token_ids
    model = dequantized_model(hf_dir)
    with torch.no_grad():
        logits = model(torch.tensor([IDS + got])).logits[0].numpy()
    for i, token in enumerate(got):
        step = logits[len(IDS) - 1 + i]
        assert step.max() - step[token] < 0.02 * np.abs(step).max(), (i, token)


def test_quantization_of_a_standard_bundle_is_one_line(hf_model, tmp_path):
    result = cli("export", hf_model("llama"), "-o", tmp_path / "b", "--quiet",
                 "--quantize", "int4", "--flavor", "standard")
    assert_one_line_error(result, "needs --flavor ort")
    assert not (tmp_path / "b").exists()


def test_every_quantized_table_holds_whole_blocks_and_slices_the_padding_off(hf_model,
                                                                             tmp_path):
    """Gemma 4's per-layer table is 48 wide in the fixture, a block and a half: it is stored
    padded to whole blocks (ONNX Runtime's CUDA GatherBlockQuantized dequantizes a partial
    last block wrong, 0.3-0.4 of the values' scale off on an H200), and the rows gathered
    are cut back to the width: the logits stay the float32 twin's."""
    hf_dir = hf_model("gemma4_text")
    fp16 = export_int4(hf_dir, tmp_path / "fp16", "fp16")
    model = onnx.load(fp16 / "model.onnx", load_external_data=False)
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    gathers = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    widths = []
    for node in gathers:
        block = next(a.i for a in node.attribute if a.name == "block_size")
        rows, half = inits[node.input[0]]
        assert 2 * half % block == 0, node.input[0]
        widths.append(2 * half)
    assert widths == [64, 64]  # the main table (64 wide) and the per-layer one (48, padded)
    fp32 = export_int4(hf_dir, tmp_path / "fp32", "fp32")
    want, got = logits_at(fp32, IDS), logits_at(fp16, IDS)
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()
