"""int8 bundles at --dtype fp16 (a GPU's int8: DynamicQuantizeMatMul, the float32 int8
bundle's op, is float32-only and ONNX Runtime's CUDA provider has none): 8-bit weights in
blocks (MatMulNBits bits 8, GatherBlockQuantized bits 8) with float16 activations. The
reference is transformers' float model with the dequantized weights put in; the blocks'
decoding is checked against the float weights they hold."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import (
    QuantConfig,
    int4_blockwise,
    int4_dequantize,
    int8_blockwise,
    int8_dequantize,
)
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import load_hf_model
from tests.test_cli_errors import cli
from tests.test_exactness import recurrent_delta_rule
from tests.test_int4_fp16 import initializers
from tests.test_quantize import logits_at

IDS = [1, 5, 9, 33, 70, 4, 18]


def export_int8(hf_dir, out, accuracy_level: int = 0, **quant):
    export(hf_dir, out, ExportOptions(
        dtype="fp16", chunks=(4,), max_context=128, show_progress=False,  # IDS in two chunks
        quant=QuantConfig(quant.pop("kind", "int8"), 32, accuracy_level=accuracy_level,
                          **quant),
    ))
    return out


def int8_blocks(w: np.ndarray) -> np.ndarray:
    return int8_dequantize(*int8_blockwise(w, 32), w.shape[1])


def dequantized_model(hf_dir, head: str = "int8"):
    """transformers' model of `hf_dir` with the bundle's weights: every projection and the
    untied embedding tables in 8-bit blocks of 32, the LM head as `head` says."""
    model = load_hf_model(hf_dir)
    out = model.get_output_embeddings()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear | torch.nn.Embedding) and module is not out:
                module.weight.copy_(torch.from_numpy(int8_blocks(module.weight.numpy())))
        w = out.weight.numpy()
        if head == "int4":
            w = int4_dequantize(*int4_blockwise(w, 32), w.shape[1])
        else:
            w = int8_blocks(w)
        out.weight.copy_(torch.from_numpy(w))
    return model


def test_int8_blocks_hold_the_weights_to_half_a_step():
    """Symmetric codes -127..127 (stored plus 128, MatMulNBits' implicit zero point for 8
    bits), one scale per 32 inputs of a row (float16-exact where float16 holds it): each
    weight decodes to within half its block's step (a 100-wide row: a partial last block,
    padded with zeros)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 100)).astype(np.float32) * np.array([[1e-3], [1], [30], [0],
                                                                     [1], [5]], np.float32)
    data, scales = int8_blockwise(w, 32)
    assert data.shape == (6, 4, 32) and data.dtype == np.uint8
    assert data.min() >= 1  # the code -128 is unused
    normal = scales >= np.finfo(np.float16).tiny  # as an fp16 bundle stores them
    np.testing.assert_array_equal(scales[normal].astype(np.float16).astype(np.float32),
                                  scales[normal])
    steps = np.repeat(scales.reshape(6, 4), 32, axis=1)[:, :100]
    back = (data.reshape(6, -1)[:, :100].astype(np.float32) - 128) * steps
    assert (np.abs(back - w) <= steps * 0.5 + 1e-7).all()
    np.testing.assert_array_equal(back, int8_dequantize(data, scales, 100))
    assert (data.reshape(6, -1)[:, 100:] == 128).all()  # the padding is zeros


def test_an_fp16_int8_bundle_is_8_bit_blocks_throughout(hf_model, tmp_path):
    """Every projection and the LM head are MatMulNBits with bits 8 (no float32-only
    DynamicQuantizeMatMul), the untied embedding table GatherBlockQuantized with bits 8 in
    whole blocks, the scales float16."""
    bundle = export_int8(hf_model("llama"), tmp_path / "b")
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    ops = {n.op_type for n in model.graph.node}
    assert "DynamicQuantizeMatMul" not in ops and "MatMul" not in ops and "Gemm" not in ops
    for node in model.graph.node:
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized"):
            attrs = {a.name: a.i for a in node.attribute}
            assert attrs["bits"] == 8 and attrs["block_size"] == 32, node.name
    weights = initializers(bundle)
    assert weights["lm_head.int8"].dtype == np.uint8
    assert weights["lm_head.scale"].dtype == np.float16
    assert weights["model.embed_tokens.weight.int8"].shape[1] % 32 == 0


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text", "rwkv", "xlstm"])
def test_an_fp16_int8_bundle_computes_transformers_with_the_dequantized_weights(
        hf_model, tmp_path, family):
    """At accuracy level 0 the logits are transformers' on the dequantized weights, to
    float16's rounding; a hybrid's state layers too."""
    hf_dir = hf_model(family)
    export_int8(hf_dir, tmp_path / "b")
    with torch.no_grad(), recurrent_delta_rule():
        expected = dequantized_model(hf_dir)(torch.tensor([IDS])).logits[0, -1].numpy()
        floats = load_hf_model(hf_dir)(torch.tensor([IDS])).logits[0, -1].numpy()
    got = logits_at(tmp_path / "b", IDS)
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() < 0.01 * scale
    # and nearer the dequantized model than the float one is (the weights are the int8 ones)
    assert np.abs(got - expected).max() < np.abs(floats - expected).max()


def test_greedy_decode_of_an_fp16_int8_bundle_follows_transformers(hf_model, tmp_path):
    """The SDK's chunked prefill and decode steps at the default accuracy level: every token
    it picks is transformers' best on the dequantized weights, or within rounding of it."""
    hf_dir = hf_model("llama")
    export_int8(hf_dir, tmp_path / "b", accuracy_level=4)
    with Engine.load(tmp_path / "b", threads=2, background=False) as engine:
        got = engine.generate(IDS, GenerationParams(max_new_tokens=12, ignore_eos=True),
                              chunk_size=4).result().token_ids
    with torch.no_grad():
        logits = dequantized_model(hf_dir)(torch.tensor([IDS + got])).logits[0].numpy()
    for i, token in enumerate(got):
        step = logits[len(IDS) - 1 + i]
        assert step.max() - step[token] < 0.02 * np.abs(step).max(), (i, token)


def test_an_int8_lm_head_in_an_fp16_int4_bundle(hf_model, tmp_path):
    """`--lm-head int8` at fp16: the head is 8-bit blocks (MatMulNBits bits 8) beside the
    4-bit body, and the logits are transformers' with those weights."""
    hf_dir = hf_model("llama")
    bundle = export_int8(hf_dir, tmp_path / "b", kind="int4", head="int8", embeddings=False)
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    bits = {next(a.i for a in n.attribute if a.name == "bits")
            for n in model.graph.node if n.op_type == "MatMulNBits"}
    assert bits == {4, 8}
    reference = load_hf_model(hf_dir)
    head = reference.get_output_embeddings()
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, torch.nn.Linear) and module is not head:
                w = module.weight.numpy()
                module.weight.copy_(torch.from_numpy(
                    int4_dequantize(*int4_blockwise(w, 32), w.shape[1])))
        head.weight.copy_(torch.from_numpy(int8_blocks(head.weight.numpy())))
        expected = reference(torch.tensor([IDS])).logits[0, -1].numpy()
    got = logits_at(bundle, IDS)
    assert np.abs(got - expected).max() < 0.01 * np.abs(expected).max()


def test_a_tied_tables_int8_copy_decodes_to_the_heads_weights(hf_model, tmp_path):
    """`--embeddings all` with a tied table: its 8-bit copy (GatherBlockQuantized) holds the
    head's very codes and scales, so a token's row is the head's row."""
    bundle = export_int8(hf_model("llama-tied-llama3rope"), tmp_path / "b", tied_embeddings=True)
    weights = initializers(bundle)
    table = next(n for n in weights if n.endswith("embed_tokens.weight.int8"))
    np.testing.assert_array_equal(weights[table],
                                  weights["lm_head.int8"].reshape(weights[table].shape))
    np.testing.assert_array_equal(weights[table.replace(".int8", ".scale")].reshape(-1),
                                  weights["lm_head.scale"])


def test_a_partial_last_block_is_stored_whole_and_sliced_off(hf_model, tmp_path):
    """Gemma 4's per-layer table is 48 wide in the fixture: stored padded to whole blocks of
    32 (CUDA's GatherBlockQuantized dequantizes a partial last block wrong: quantize.block_rows)
    and the gathered rows cut back to the width: the logits are transformers' on the
    dequantized weights (this fixture's quantized logits move far from its float ones)."""
    hf_dir = hf_model("gemma4_text")
    bundle = export_int8(hf_dir, tmp_path / "b")
    model = onnx.load(bundle / "model.onnx", load_external_data=False)
    dims = {t.name: list(t.dims) for t in model.graph.initializer}
    widths = [dims[n.input[0]][1] for n in model.graph.node
              if n.op_type == "GatherBlockQuantized"]
    assert widths == [64, 64]  # the main table (64 wide) and the per-layer one (48, padded)
    with torch.no_grad():
        want = dequantized_model(hf_dir)(torch.tensor([IDS])).logits[0, -1].numpy()
    got = logits_at(bundle, IDS)
    assert np.abs(got - want).max() < 0.01 * np.abs(want).max()


def test_export_and_inspect_an_fp16_int8_bundle_from_the_command_line(hf_model, tmp_path):
    """`export --quantize int8 --dtype fp16` (refused before: DynamicQuantizeMatMul is
    float32-only) makes a bundle `inspect` describes as what it holds and `run` answers from."""
    bundle = tmp_path / "b"
    made = cli("export", hf_model("llama"), "-o", bundle, "--quiet", "--quantize", "int8",
               "--dtype", "fp16", "--chunks", "4", "--max-context", "64")
    assert made.returncode == 0, made.stderr
    shown = cli("inspect", bundle)
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert "int8 (GatherBlockQuantized, blocks of 32)" in lines["embeddings"]
    assert "int8 (MatMulNBits, blocks of 32)" in lines["lm"]
    assert "MatMulNBits (8-bit weights in blocks" in lines["int8"]
    ran = cli("run", bundle, "--prompt", "hello", "--max-new-tokens", "3", "--ignore-eos")
    assert ran.returncode == 0, ran.stderr


def test_the_cli_s_block_size_sets_an_fp16_int8_bundle_s_blocks(hf_model, tmp_path):
    """export --help: --block-size is "int4, and int8 at --dtype fp16: weights per scale"
    (the CLI had refused it for int8 whatever the dtype)."""
    result = cli("export", hf_model("llama"), "-o", tmp_path / "b", "--quantize", "int8",
                 "--dtype", "fp16", "--block-size", "64", "--chunks", "4", "--max-context", "64",
                 "--quiet")
    assert result.returncode == 0, result.stderr
    model = onnx.load(tmp_path / "b" / "model.onnx", load_external_data=False)
    blocks = [{a.name: a.i for a in n.attribute} for n in model.graph.node
              if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
    assert blocks and all(b["bits"] == 8 and b["block_size"] == 64 for b in blocks)
