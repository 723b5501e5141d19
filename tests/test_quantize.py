"""Quantized exports compute with exactly the weights the quantizer says they hold."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from edgeprefill.engines import StepBatch
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import (
    QuantConfig,
    block_rows,
    in_row_chunks,
    int4_blockwise,
    int4_dequantize,
    int8_per_channel,
    int8_rows,
)
from edgeprefill.sdk import Engine
from tests.conftest import load_hf_model
from tests.test_exactness import recurrent_delta_rule

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_int4_round_trip_is_within_half_a_step():
    w = np.random.default_rng(0).normal(size=(48, 100)).astype(np.float32)
    packed, scales = int4_blockwise(w, 32)
    assert packed.shape == (48, 4, 16) and scales.shape == (48 * 4,)
    back = int4_dequantize(packed, scales, 100)
    step = np.repeat(scales.reshape(48, 4), 32, axis=1)[:, :100]
    assert np.all(np.abs(back - w) <= step / 2 + 1e-6)


def test_int4_scales_are_float16_values_where_float16_keeps_them_normal():
    """half_exact: a scale is rounded to float16 when that is a normal float16 (the native
    decode kernel then reads it in 2 bytes), kept in float32 when it would overflow or
    lose precision as a subnormal; each scale moves by at most 2^-11 of itself."""
    w = np.random.default_rng(2).normal(size=(6, 64)).astype(np.float32)
    w[1] *= 1e-6  # scales ~4e-7: subnormal in float16
    w[2] *= 1e6   # scales ~4e5: past float16's largest
    _, scales = int4_blockwise(w, 32)
    exact = np.abs(w).reshape(6, 2, 32).max(axis=2).reshape(-1) / 7.0
    with np.errstate(over="ignore"):
        as_half = scales.astype(np.float16).astype(np.float32)
    kept = np.zeros(12, bool)
    kept[2:6] = True  # rows 1 and 2
    assert np.array_equal(as_half[~kept], scales[~kept])
    assert np.array_equal(scales[kept], exact[kept].astype(np.float32))
    assert np.all(np.abs(scales - exact) <= exact * 2.0**-11)


def test_int8_round_trip_is_within_half_a_step():
    w = np.random.default_rng(1).normal(size=(64, 40)).astype(np.float32)
    q, scale = int8_per_channel(w)
    assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-6)


def test_int4_rows_are_the_projections_blocks_as_gather_block_quantized_takes_them():
    w = np.random.default_rng(3).normal(size=(5, 80)).astype(np.float32)
    data, scales = block_rows(w, 32)
    assert data.shape == (5, 48) and scales.shape == (5, 3)  # whole blocks: 96 codes a row
    q = np.empty((5, 96), np.float32)
    q[:, 0::2], q[:, 1::2] = data & 0x0F, data >> 4
    assert (q[:, 80:] == 8).all()  # the padding codes zero
    back = (q - 8) * np.repeat(scales, 32, axis=1)
    np.testing.assert_array_equal(back[:, :80], int4_dequantize(*int4_blockwise(w, 32), 80))


def test_int8_rows_round_trip_is_within_half_a_step():
    w = np.random.default_rng(4).normal(size=(40, 64)).astype(np.float32)
    data, scale = int8_rows(w)
    assert data.dtype == np.uint8 and scale.shape == (40, 1)
    assert np.all(np.abs((data.astype(np.float32) - 128) * scale - w) <= scale / 2 + 1e-6)


def test_row_chunks_quantize_as_the_whole_table():
    w = np.random.default_rng(5).normal(size=(10, 64)).astype(np.float32)
    for quantize in (int8_rows, lambda t: block_rows(t, 32)):
        for whole, chunked in zip(quantize(w), in_row_chunks(quantize, w, rows=3), strict=True):
            np.testing.assert_array_equal(whole, chunked)


def dequantized_table(w: np.ndarray, kind: str, block: int = 32) -> np.ndarray:
    """What a quantized bundle's GatherBlockQuantized gives for the table w [rows, width]."""
    if kind == "int4":
        return int4_dequantize(*int4_blockwise(w, block), w.shape[1])
    data, scale = int8_rows(w)
    return (data.astype(np.float32) - 128) * scale


def dequantize_linears(model, block: int = 32, keep: Callable[[str], bool] = lambda _: False
                       ) -> None:
    """Puts into `model` every Linear's weight as an int4 bundle's MatMulNBits blocks of
    `block` give it back; a module whose name `keep` takes stays float (as its bundle
    keeps it). Call under torch.no_grad()."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not keep(name):
            w = module.weight.numpy()
            module.weight.copy_(torch.from_numpy(
                int4_dequantize(*int4_blockwise(w, block), w.shape[1])))


def dequantize_embeddings(model, kind: str, block: int = 32) -> None:
    """Puts into `model` the embedding tables a quantized bundle holds: every token table
    but a tied one (the LM head's) and GPT-2's positions, which stay float."""
    head = model.get_output_embeddings().weight
    for name, module in model.named_modules():
        if (isinstance(module, torch.nn.Embedding) and module.weight is not head
                and not name.endswith("wpe")):
            w = module.weight.numpy()
            module.weight.copy_(torch.from_numpy(dequantized_table(w, kind, block)))


def logits_at(bundle_dir, ids) -> np.ndarray:
    with Engine.load(bundle_dir, threads=2, background=False) as engine:
        return engine.backend.run(StepBatch(np.array([ids]), np.array([0], np.int32),
                                            np.array([len(ids)], np.int32), 0))[0]


@pytest.mark.parametrize("family", ("llama", "lfm2", "qwen3_5_text", "granitemoehybrid-mamba",
                                    "falcon_h1", "rwkv", "xlstm"))
def test_int4_graph_equals_transformers_with_dequantized_weights(hf_model, tmp_path, family):
    """Every projection of the bundle computes with its dequantized int4 weights and nothing
    else moves: the hybrids' conv, DeltaNet and Mamba-2 layers too (their logits drift further from
    fp32 than a transformer's on these fixtures; this says the drift is the model's, as
    transformers computes it, not the export's)."""
    hf_dir = hf_model(family)
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0),  # float compute: exact
    ))
    model = load_hf_model(hf_dir)
    ids = [1, 5, 9, 33, 70, 4, 18]
    with torch.no_grad(), recurrent_delta_rule():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):  # every projection and the LM head
                w = module.weight.numpy()
                packed, scales = int4_blockwise(w, 32)
                module.weight.copy_(torch.from_numpy(int4_dequantize(packed, scales, w.shape[1])))
        dequantize_embeddings(model, "int4")  # the fixtures' tables are untied
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind, max_rel_error", [("int8", 0.05), ("int4", 0.3)])
def test_quantized_logits_stay_close_to_fp32(hf_model, bundle, tmp_path, kind, max_rel_error):
    """The projections' drift (the quantized table's is checked exactly below: on this
    random fixture it takes int4's from 0.19 to 0.30, docs/design.md)."""
    export(hf_model("llama"), tmp_path / kind, ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig(kind, embeddings=False),
    ))
    ids = [1, 5, 9, 33, 70, 4, 18, 99, 100, 3]
    reference = logits_at(bundle("llama"), ids)
    got = logits_at(tmp_path / kind, ids)
    assert np.abs(got - reference).max() / np.abs(reference).max() < max_rel_error


def export_llama(hf_dir, out, kind: str, embeddings: bool = True):
    export(hf_dir, out, ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig(kind, 32, accuracy_level=0, embeddings=embeddings),
    ))
    return out


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_embedding_computes_with_its_dequantized_table(hf_model, tmp_path, kind):
    """The untied table read through GatherBlockQuantized gives the logits of the same bundle
    kind whose checkpoint holds the dequantized table, read float (int8's activations are
    quantized on the fly, so transformers can't be the reference at a tight tolerance; int4
    is checked against transformers above)."""
    hf_dir = hf_model("llama")
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        dequantize_embeddings(model, kind)
    model.save_pretrained(tmp_path / "hf")
    for f in hf_dir.iterdir():
        if f.name.startswith("tokenizer"):
            (tmp_path / "hf" / f.name).write_bytes(f.read_bytes())
    ids = [1, 5, 9, 33, 70, 4, 18, 127, 0]
    got = logits_at(export_llama(hf_dir, tmp_path / "q", kind), ids)
    expected = logits_at(export_llama(tmp_path / "hf", tmp_path / "f", kind, False), ids)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    fp32 = logits_at(export_llama(hf_dir, tmp_path / "e", kind, False), ids)
    assert not np.allclose(got, fp32, rtol=1e-5, atol=1e-5)  # the table did change


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_embedding_shrinks_the_bundle_by_the_tables_float_bytes(
        hf_model, tmp_path, kind):
    vocab, hidden = 128, 64  # the llama fixture's untied table
    quantized = vocab * hidden + vocab * 4 if kind == "int8" else (
        vocab * hidden // 2 + vocab * (hidden // 32) * 4)
    sizes = {}
    for embeddings in (True, False):
        out = export_llama(hf_model("llama"), tmp_path / str(embeddings), kind, embeddings)
        sizes[embeddings] = sum(f.stat().st_size for f in out.glob("*.data"))
    saved = sizes[False] - sizes[True]
    assert abs(saved - (vocab * hidden * 4 - quantized)) <= 2 * 64  # writer.ALIGN_SMALL, each


def int8_head_reference(model, head: np.ndarray, symmetric: bool) -> None:
    """Makes `model`'s LM head compute what an int8 head does: its own Linear (a tied one is
    untied) on the per-channel int8 weights, and its input quantized on the fly per
    position (the bundle's head reads one row per sequence, transformers' every position):
    `symmetric`, as the native MatMulInt8 does (codes -127..127, the row's largest magnitude
    / 127), else as ONNX Runtime's DynamicQuantizeMatMul does (uint8 with a zero point, the
    range widened to hold 0); both round half to even."""
    model.lm_head = int8_linear(head, symmetric)


def int8_linear(weight: np.ndarray, symmetric: bool) -> torch.nn.Linear:
    """A Linear of `weight` [out, in] computing as an int8 projection does (see
    int8_head_reference): per-channel int8 weights, its input quantized on the fly."""
    q, scale = int8_per_channel(weight.T)
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data = torch.from_numpy((q * scale).T.copy())

    def fake_quantized(module, args):
        x = args[0]
        if symmetric:
            step = x.abs().amax(dim=-1, keepdim=True) / 127
            step[step == 0] = 1  # an all-zero row (ZAYA's first delayed value) stays 0
            return torch.round(x / step) * step,
        low = x.amin(dim=-1, keepdim=True).clamp(max=0)
        high = x.amax(dim=-1, keepdim=True).clamp(min=0)
        step = (high - low) / 255
        step[step == 0] = 1
        zero = torch.clamp(torch.round(-low / step), 0, 255)
        return (torch.clamp(torch.round(x / step) + zero, 0, 255) - zero) * step,

    linear.register_forward_pre_hook(fake_quantized)
    return linear


def check_int4_logits(hf_dir, tmp_path, ids: list[int]) -> None:
    """An int4 bundle (blocks of 32, float compute) of the image-text checkpoint `hf_dir`
    equals transformers with every language-model projection and the LM head dequantized
    from the bundle's blocks and the embedding table as the bundle stores it, at the last
    token of `ids`."""
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0)))
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and "language_model" in name \
                    or name == "lm_head":
                w = module.weight.numpy()
                module.weight.copy_(torch.from_numpy(
                    int4_dequantize(*int4_blockwise(w, 32), w.shape[1])))
        dequantize_embeddings(model, "int4")
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), expected, rtol=1e-3, atol=1e-3)


def check_int8_decode_steps(hf_dir, bundle_dir, ids: list[int]) -> None:
    """The int8 bundle at `bundle_dir` of the image-text checkpoint `hf_dir`, one token per
    call (as decode, where the op's quantization of the whole input is each row's), equals
    transformers with every language-model projection and the LM head as int8_linear and
    the embedding table as the bundle stores it, at each position."""
    model = load_hf_model(hf_dir)
    symmetric = native_int8(bundle_dir)
    with torch.no_grad():
        for name, module in list(model.named_modules()):
            for child, linear in list(module.named_children()):
                path = f"{name}.{child}" if name else child
                if isinstance(linear, torch.nn.Linear) and (
                        "language_model" in path or path == "lm_head"):
                    setattr(module, child, int8_linear(linear.weight.numpy(), symmetric))
        dequantize_embeddings(model, "int8")
        expected = model(torch.tensor([ids])).logits[0].numpy()
    check_one_token_per_call(bundle_dir, ids, expected)


def check_one_token_per_call(bundle_dir, ids: list[int], expected: np.ndarray) -> None:
    """The bundle's logits at each position of `ids`, fed one token per call (as decode
    does), equal `expected` [len(ids), vocab] to 1e-3."""
    from tests.state_models import run_padded

    with Engine.load(bundle_dir, threads=2, background=False) as engine:
        got = run_padded(engine.backend, ids, 1, split=len(ids))
    for position, logits in got.items():
        np.testing.assert_allclose(logits, expected[position], rtol=1e-3, atol=1e-3,
                                   err_msg=f"position {position}")


def native_int8(bundle_dir) -> bool:
    """Whether the bundle's int8 projections load as the native MatMulInt8 here (VNNI)."""
    with Engine.load(bundle_dir, threads=2, background=False) as engine:
        return engine.backend.int8_rows.rewritten > 0


def test_an_int8_head_and_a_quantized_tied_table_in_an_int4_bundle(hf_model, tmp_path):
    """`--lm-head int8 --embeddings all`: the int4 bundle's head computes with per-channel
    int8 weights (and int8 activations, by whichever op runs it here), its tied table is
    read quantized (int4, as the projections), its projections stay int4: transformers with
    those dequantized weights, the head and table untied, computes the same logits."""
    hf_dir = hf_model("llama-tied-llama3rope")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0, tied_embeddings=True, head="int8")))
    model = load_hf_model(hf_dir)
    ids = [1, 5, 9, 33, 70, 4, 18]
    with torch.no_grad():
        table = model.get_input_embeddings().weight.numpy().copy()
        dequantize_linears(model, keep=lambda name: name == "lm_head")
        int8_head_reference(model, table, symmetric=native_int8(tmp_path / "b"))
        model.model.embed_tokens.weight = torch.nn.Parameter(
            torch.from_numpy(dequantized_table(table, "int4")))
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    got = logits_at(tmp_path / "b", ids)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_tied_table_shrinks_the_bundle_and_reads_the_heads_values(
        hf_model, tmp_path, kind):
    """`--embeddings all` on a tied model: the table, float by default, is stored quantized
    (its own copy beside the head's), the bundle smaller by the table's float bytes less its
    quantized ones, and its rows are the head's dequantized rows: exported from a checkpoint
    holding those values, the float-table bundle gives the same logits."""
    hf_dir = hf_model("llama-tied-llama3rope")
    vocab, hidden = 128, 64
    quantized = vocab * hidden + vocab * 4 if kind == "int8" else (
        vocab * hidden // 2 + vocab * (hidden // 32) * 4)
    sizes = {}
    for tied in (True, False):
        export(hf_dir, tmp_path / str(tied), ExportOptions(
            chunks=(16,), max_context=128, show_progress=False,
            quant=QuantConfig(kind, 32, accuracy_level=0, tied_embeddings=tied)))
        sizes[tied] = sum(f.stat().st_size for f in (tmp_path / str(tied)).glob("*.data"))
    assert abs(sizes[False] - sizes[True] - (vocab * hidden * 4 - quantized)) <= 2 * 64
    # The reference: the table's dequantized values, kept apart from the float head.
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        table = model.get_input_embeddings().weight.numpy().copy()
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(torch.from_numpy(table))
        model.model.embed_tokens.weight = torch.nn.Parameter(
            torch.from_numpy(dequantized_table(table, kind)))
    model.save_pretrained(tmp_path / "hf")
    for f in hf_dir.iterdir():
        if f.name.startswith("tokenizer"):
            (tmp_path / "hf" / f.name).write_bytes(f.read_bytes())
    export(tmp_path / "hf", tmp_path / "ref", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig(kind, 32, accuracy_level=0, embeddings=False)))
    ids = [1, 5, 9, 33, 70, 4, 18, 127, 0]
    np.testing.assert_allclose(logits_at(tmp_path / "True", ids),
                               logits_at(tmp_path / "ref", ids), rtol=1e-5, atol=1e-5)
