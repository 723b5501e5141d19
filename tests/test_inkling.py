"""Inkling's language model (export/families/inkling.py, export/inkling.py): a learned
relative bias per backward distance from each query's state (7 distances on the full
layers, the window's 5 on the sliding ones, so a 40-token prompt clamps and masks it),
residual short convolutions of keys, values and each sublayer's output (one conv state per
layer beside its KV), sliding layers of their own head shapes, experts weighed in one
softmax with the shared ones, dense MLPs times their scale, a normed embedding and the
logits divided by the muP multiplier. Its fixture (conftest.FAMILIES: inkling_text) runs
in the generic suites too. Here: chunks that do not divide the prompt, decode steps and a
padded chunk against transformers' logits of the whole prompt, rows of other lengths in
one call, the image-text checkpoint in its stored names and layouts, and what export
refuses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from safetensors import safe_open

from edgeprefill.errors import ExportError
from edgeprefill.export import families, interleaved_halves
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.families import inkling
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.kernels import graph, select
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, build_hf_model, load_hf_model
from tests.flavour_bundles import check_chunks_against, flavour_fixtures, hf_logits
from tests.test_exactness import prompt_ids
from tests.test_mla import dequantized_int4_but_kv_b
from tests.test_openelm import (
    check_chunk_ends,
    check_chunks_and_padding,
    check_rows_decode_together,
    run_chunks,
)

hf, bundle = flavour_fixtures("inkling_text", max_context=64)


def test_chunks_of_5_match_transformers(hf, bundle):
    """A 23-token prompt (past both reaches) in chunks of 5: each chunk's last logits are
    transformers' at its position (the `standard` flavour; `ort` below)."""
    ids = prompt_ids(23)
    engine = Engine.load(bundle("standard"), threads=2, background=False)
    check_chunk_ends(engine, ids, hf_logits(load_hf_model(hf), ids), (5,))
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_chunked_decoded_and_padded_as_transformers(flavor, hf, bundle):
    """Chunks of 1, 3 and 16 of a 40-token prompt, then a padded chunk."""
    ids = prompt_ids(40)
    check_chunks_and_padding(bundle(flavor), ids, hf_logits(load_hf_model(hf), ids))


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_rows_of_other_lengths_decode_together(flavor, hf, bundle):
    model = load_hf_model(hf)
    check_rows_decode_together(bundle(flavor), lambda ids: hf_logits(model, ids)[-1], 3)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_an_unembedding_padded_past_the_vocabulary_gives_its_first_rows_logits(flavor,
                                                                                tmp_path):
    """unpadded_vocab_size 100 of vocab_size 128 (the released model: 200058 of 201024):
    the embedding reads all 128 rows, the logits are transformers' 100 (the LM head's
    first rows)."""
    hf = build_hf_model("inkling_text", tmp_path / "hf", unpadded_vocab_size=100)
    export(hf, tmp_path / "b", ExportOptions(flavor=flavor, chunks=(16,), max_context=64,
                                             show_progress=False))
    ids = prompt_ids(30)  # (ids past 100 among them: read, never predicted)
    expected = hf_logits(load_hf_model(hf), ids)
    assert expected.shape[1] == 100 and max(ids) >= 100
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    check_chunk_ends(engine, ids, expected, (7,))
    engine.close()


@pytest.mark.slow
def test_int4_computes_transformers_forward_with_dequantized_weights(hf, tmp_path):
    """Every projection quantized by blocks (the routed experts' too) but the router, the
    shared experts and the relative bias's bank, which stay float: the bundle computes what
    transformers does with the others dequantized."""
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False,
                                             quant=QuantConfig("int4", accuracy_level=0)))
    model = load_hf_model(hf)
    dequantized_int4_but_kv_b(model, keep=("shared_experts", "rel_logits_proj"))
    check_chunks_against(tmp_path / "b", model, prompt_ids(40))


@pytest.mark.slow
def test_the_native_kernels_leave_the_biased_attention_to_onnx_runtime(bundle, monkeypatch):
    """Every layer's GroupQueryAttention takes the relative bias as its attention_bias
    input; the native kernels' softmax adds none, so the kernel choice keeps them stock."""
    model = onnx.load(str(bundle("ort") / "model.onnx"), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(nodes) == 4 and all(len(n.input) == 11 and n.input[10] for n in nodes)
    assert [graph.why_not_eligible(n) for n in nodes] == [graph.ATTENTION_BIAS_WHY] * 4
    monkeypatch.setattr(select, "why_not", lambda *args: None)  # as if the library ran here
    assert select.choose(model, "ort", "float32", "cpu").library is None
    assert graph.add_native_attention(model) == 0


@pytest.fixture(scope="module")
def mm(tmp_path_factory) -> Path:
    """InklingForConditionalGeneration (tiny vision and audio towers beside the fixture's
    language model) as transformers saves it: its conversion mapping reversed, so the
    language model under its stored names and layouts."""
    out = tmp_path_factory.mktemp("inkling_mm") / "hf"
    return build_hf_model("inkling_mm_model", out, **FAMILIES["inkling_text"])


def test_the_image_text_checkpoint_computes_its_language_model(mm, tmp_path):
    """model.llm.*, attn.wq_du, ..., the dense MLPs' w13_dn, the shared experts'
    shared_w13_weight and the routed experts' w13_weight (gate and up rows interleaved):
    a 23-token prompt in chunks of 5 and in one, transformers' logits; the towers left
    out."""
    with safe_open(str(mm / "model.safetensors"), "np") as stored:
        names = set(stored.keys())
    assert {"model.llm.embed.weight", "model.llm.unembed.weight",
            "model.llm.layers.0.attn.wq_du.weight", "model.llm.layers.0.mlp.w13_dn.weight",
            "model.llm.layers.1.mlp.experts.w13_weight",
            "model.llm.layers.1.mlp.shared_experts.shared_w13_weight"} <= names
    export(mm, tmp_path / "b", ExportOptions(flavor="standard", chunks=(16,),
                                             max_context=64, show_progress=False))
    ids = prompt_ids(23)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    check_chunk_ends(engine, ids, hf_logits(load_hf_model(mm), ids), (5, 23))
    engine.close()


@pytest.mark.slow
def test_the_image_text_checkpoint_chunked_decoded_and_padded(mm, tmp_path):
    """The `ort` flavour: chunks of 1, 3 and 16 of a 40-token prompt, a padded chunk."""
    export(mm, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False))
    ids = prompt_ids(40)
    check_chunks_and_padding(tmp_path / "b", ids, hf_logits(load_hf_model(mm), ids))


def _halves_not_interleaved(self, name, read):
    """Chunk without Interleave: the stored tensor's first half as the gate."""
    stored, axis, which = self.parts[name]
    tensor = read(stored)
    half = tensor.shape[axis] // 2
    return np.take(tensor, np.arange(which * half, (which + 1) * half), axis=axis)


@pytest.mark.slow
@pytest.mark.parametrize("piece", ("dense and shared halves", "routed experts"))
def test_the_de_interleave_of_w13_is_needed(piece, mm, tmp_path, monkeypatch):
    """Each w13 read as stored halves, not interleaved rows: the logits leave
    transformers'."""
    if piece == "routed experts":
        spec = inkling.INKLING_MM
        moe = replace(spec.moe, names=replace(spec.moe.names, interleaved=False))
        monkeypatch.setitem(families.FAMILIES, "inkling_mm_model", replace(spec, moe=moe))
    else:
        monkeypatch.setattr(interleaved_halves.Halves, "values", _halves_not_interleaved)
    export(mm, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False))
    ids = prompt_ids(23)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 23)[0]
    engine.close()
    assert np.abs(got - hf_logits(load_hf_model(mm), ids)[-1]).max() > 1e-2


@pytest.mark.parametrize("change, reason", (
    ({"log_scaling_n_floor": 64}, "log_scaling_n_floor"),
    ({"unpadded_vocab_size": 0}, "unpadded_vocab_size must be positive"),
    ({"shared_expert_sink": False}, "shared_expert_sink=false"),
    ({"n_shared_experts": 0}, "n_shared_experts below 1"),
    ({"layer_types": ["hybrid", "hybrid", "sliding_attention", "hybrid"]}, "layer_types"),
    ({"mlp_layer_types": ["dense", "moe", "dense", "dense"]}, "mlp_layer_types"),
    ({"conv_kernel_size": 1}, "conv_kernel_size"),
    ({"swa_num_attention_heads": 3, "swa_num_key_value_heads": 2}, "swa_num_attention_heads"),
))
def test_what_export_lacks_is_refused_in_one_line(change, reason):
    raw = {"model_type": "inkling_text", "hidden_size": 64, "vocab_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
           **FAMILIES["inkling_text"], **change}
    with pytest.raises(ExportError, match=reason) as refused:
        ModelConfig.from_hf(raw)
    assert "\n" not in str(refused.value)
