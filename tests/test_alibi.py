"""ALiBi (BLOOM, MPT, Falcon-RW): the slopes, the bias in both flavours against transformers
in any chunking (1, 3, 16 tokens, a padded chunk) and in a batch of rows at different
positions, the config keys each family reads or refuses, and the native kernels kept off
its layers. Falcon-RW's bias rounded to bfloat16 as transformers' Falcon rounds it, past
key position 256 where that rounding is no constant per query. Every chunk's logits of a
100-token prompt are checked in tests/test_exactness.py too."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
from transformers.models.falcon.modeling_falcon import build_alibi_tensor
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.engines import StepBatch
from edgeprefill.errors import ExportError
from edgeprefill.export import alibi
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.kernels import graph, select
from edgeprefill.sdk import Engine
from tests.test_exactness import (
    FLAVORS,
    QUICK_CHUNKS,
    QUICK_LENGTHS,
    check_greedy,
    check_together,
    prompt_ids,
    reference_logits,
)
from tests.test_openelm import check_chunk_ends, run_chunks

ALIBI = ("bloom", "mpt")
# Falcon-RW's fixture runs the whole matrix under `slow`; test_falcon_rw_* keep it fast
WITH_FALCON_RW = (*ALIBI, pytest.param("falcon-rw", marks=pytest.mark.slow))


@pytest.mark.parametrize("heads", [*range(1, 41), 64, 71, 112])
def test_slopes_are_transformers_bloom_and_mpt_slopes(heads):
    # BLOOM's and MPT's functions give the same numbers (MPT's with alibi_bias_max 8, the
    # only value transformers uses); a head count that is no power of two interleaves them
    bloom = _get_alibi_slopes(heads, torch.device("cpu")).numpy()
    mpt = -build_mpt_alibi_tensor(heads, 2)[:, 0, 0].numpy()  # slope x (0 - 1)
    np.testing.assert_allclose(alibi.slopes(heads), bloom, rtol=1e-6, atol=0)
    np.testing.assert_allclose(alibi.slopes(heads), mpt, rtol=1e-6, atol=0)


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", WITH_FALCON_RW)
def test_chunks_of_1_3_and_16_tokens_and_a_padded_one_are_transformers(
        family, flavor, hf_model, bundle):
    ids = prompt_ids(40)
    expected = reference_logits(hf_model(family), ids)
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    check_chunk_ends(engine, ids, expected, (1, 3, 16))
    # A padded chunk: 10 valid tokens and 6 of padding at positions 16..31; the next chunk
    # overwrites them and must not see them.
    run_chunks(engine, ids[:16], 16)
    padded = np.full((1, 16), 7, np.int64)
    padded[0, :10] = ids[16:26]
    logits = engine.backend.run(StepBatch(padded, np.array([16], np.int32),
                                          np.array([10], np.int32), 0))
    np.testing.assert_allclose(logits[0], expected[25], rtol=1e-4, atol=1e-4)
    logits = engine.backend.run(StepBatch(np.array([ids[26:40]]), np.array([26], np.int32),
                                          np.array([14], np.int32), 0))
    np.testing.assert_allclose(logits[0], expected[39], rtol=1e-4, atol=1e-4)
    engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", WITH_FALCON_RW)
def test_rows_at_different_positions_decode_together_as_transformers(
        family, flavor, hf_model, bundle):
    """Each row's bias counts from its own positions: three prompts of 5, 30 and 61 tokens
    decode in shared steps, each reply transformers' greedy text of its prompt alone."""
    engine = Engine.load(bundle(family, flavor), threads=2, background=False)
    check_together(engine, hf_model(family), 8)
    engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", WITH_FALCON_RW)
def test_greedy_text_is_transformers(family, flavor, hf_model, bundle):
    check_greedy(hf_model(family), bundle(family, flavor), QUICK_LENGTHS, QUICK_CHUNKS)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("family", WITH_FALCON_RW)
def test_greedy_text_is_transformers_in_every_chunking(family, flavor, hf_model, bundle):
    check_greedy(hf_model(family), bundle(family, flavor), (1, 15, 16, 17, 100, 333),
                 (1, 3, 16, 64, None))


@pytest.mark.parametrize("family", WITH_FALCON_RW)
def test_the_native_kernels_leave_alibi_attention_to_onnx_runtime(family, bundle, monkeypatch):
    """GroupQueryAttention takes the bias as its attention_bias input; the native kernels'
    softmax adds none, so the kernel choice keeps every ALiBi layer stock, and says why."""
    model = onnx.load(str(bundle(family, "ort") / "model.onnx"), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(nodes) == 2 and all(len(n.input) == 11 and n.input[10] for n in nodes)
    assert [graph.why_not_eligible(n) for n in nodes] == [graph.ATTENTION_BIAS_WHY] * 2
    monkeypatch.setattr(select, "why_not", lambda *args: None)  # as if the library ran here
    choice = select.choose(model, "ort", "float32", "cpu")
    assert choice.library is None
    assert choice.described == (f"GroupQueryAttention ({select.NO_ATTENTION}: "
                                f"{graph.ATTENTION_BIAS_WHY})")
    assert graph.add_native_attention(model) == 0


@pytest.mark.parametrize("family", WITH_FALCON_RW)
def test_the_manifest_names_alibi(family, bundle):
    manifest = json.loads((bundle(family, "standard") / MANIFEST_FILE).read_text())
    quirks = manifest["source"]["quirks"]
    assert any(q.startswith("ALiBi") for q in quirks)
    assert not any("without rope" in q for q in quirks)


def graph_bias(heads: int, keys: int, queries: list[int], scale: float) -> np.ndarray:
    """alibi.bias with Falcon's rounding, run alone in ONNX Runtime: [1, heads, C, keys]
    for the queries at `queries` over the keys at 0..keys-1."""
    g = GraphBuilder()
    key_pos = g.op("Range", [g.const(0), g.const(keys), g.const(1)])
    g.rename(alibi.bias(g, alibi.slopes(heads), key_pos, g.const([queries]), (heads,),
                        np.dtype(np.float32), scale), "bias")
    g.output("bias", np.float32, (1, heads, len(queries), keys))
    model = g.to_model([], {"": 21}, 10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {})[0]


@pytest.mark.parametrize("heads", [4, 12, 32, 71])
def test_falcon_rw_bias_is_transformers_bfloat16_bias_up_to_a_constant_per_query(heads):
    """transformers' Falcon adds bf16(bf16(slope) * bf16(key position)) / sqrt(head_dim),
    which the graph computes less its value at the query (a constant the softmax ignores),
    exactly; the relative form slope * (key - query) is off by far more than 1e-4 past 256."""
    keys, queries, scale = 2048, [0, 5, 255, 256, 257, 700, 1500, 2047], 0.125
    table = build_alibi_tensor(torch.ones(1, keys, dtype=torch.long), heads, torch.float32)
    table = table.reshape(heads, keys).numpy()  # [H, keys]: the bias of each key
    expected = (table[:, None, :] - table[:, queries, None]) * scale
    got = graph_bias(heads, keys, queries, scale)[0]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    slopes = np.asarray(alibi.slopes(heads), np.float32)[:, None, None]
    relative = slopes * (np.arange(keys) - np.asarray(queries)[:, None]) * scale
    assert np.abs(relative - expected).max() > 1e-2


@pytest.mark.parametrize("flavor", [
    "ort", pytest.param("standard", marks=pytest.mark.slow)])
def test_falcon_rw_past_position_256_is_transformers(flavor, hf_model, bundle):
    """A 320-token prompt in chunks of 64 (every chunk's logits) and then one token at a time
    for its last 8: keys past 256, where Falcon's bfloat16 bias is no longer slope x
    distance plus a constant per query."""
    ids = prompt_ids(320)
    expected = reference_logits(hf_model("falcon-rw"), ids)
    engine = Engine.load(bundle("falcon-rw", flavor), threads=2, background=False)
    got = run_chunks(engine, ids[:312], 64)
    ends = [min(start + 64, 312) - 1 for start in range(0, 312, 64)]
    np.testing.assert_allclose(np.stack(got), expected[ends], rtol=1e-4, atol=1e-4)
    for at in range(312, 320):
        logits = engine.backend.run(StepBatch(np.array([[ids[at]]]), np.array([at], np.int32),
                                              np.array([1], np.int32), 0))
        np.testing.assert_allclose(logits[0], expected[at], rtol=1e-4, atol=1e-4,
                                   err_msg=f"token {at}")
    engine.close()


BLOOM_KEYS = {"hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128}
MPT_KEYS = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 128}


@pytest.mark.parametrize("family, keys", [
    ("bloom", BLOOM_KEYS),
    ("bloom", {**BLOOM_KEYS, "n_embed": 96, "layer_norm_epsilon": 1e-3}),  # n_embed wins
    ("bloom", {**BLOOM_KEYS, "num_attention_heads": 8, "num_hidden_layers": 3}),  # aliases
    ("mpt", MPT_KEYS),
    ("mpt", {**MPT_KEYS, "hidden_size": 96, "num_attention_heads": 6, "max_seq_len": 64,
             "attn_config": {"softmax_scale": 0.5, "clip_qkv": 6.0}}),
    # keys other families read, which these models ignore
    ("mpt", {**MPT_KEYS, "intermediate_size": 96, "num_key_value_heads": 2, "clip_qkv": 1.0,
             "max_position_embeddings": 99, "rope_theta": 1e4, "logit_scale": None}),
])
def test_config_keys_read_as_the_model_builds_them(family, keys):
    ours = ModelConfig.from_hf({"model_type": family, **keys})
    config = transformers.AutoConfig.for_model(family, **keys)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).transformer
    layers = model.h if family == "bloom" else model.blocks
    attn = layers[0].self_attention if family == "bloom" else layers[0].attn
    up = layers[0].mlp.dense_h_to_4h if family == "bloom" else layers[0].ffn.up_proj
    assert (ours.hidden_size, ours.num_layers, ours.num_heads, ours.num_kv_heads) == (
        config.hidden_size, len(layers), config.num_attention_heads, config.num_attention_heads)
    assert ours.intermediate_size == up.out_features
    norm = layers[0].input_layernorm if family == "bloom" else layers[0].norm_1
    assert ours.norm_eps == norm.eps
    scale = attn.inv_norm_factor if family == "bloom" else attn.softmax_scale
    assert ours.attn_scale == pytest.approx(scale)
    assert ours.clip_qkv == (None if family == "bloom" else attn.clip_qkv)
    if family == "mpt":
        assert ours.max_positions == config.max_seq_len
        assert (ours.qkv_bias, ours.o_bias, ours.mlp_bias) == (False, False, False)
    assert ours.alibi == alibi.slopes(ours.num_heads)
    assert [layer.rope for layer in ours.layers] == [None] * ours.num_layers
    assert ours.tie_embeddings is config.tie_word_embeddings is True


@pytest.mark.parametrize("family, change, message", [
    ("bloom", {"apply_residual_connection_post_layernorm": True},
     "bloom: apply_residual_connection_post_layernorm=true"),
    ("mpt", {"attn_config": {"alibi_bias_max": 16}},
     "mpt: attn_config.alibi_bias_max=16 (transformers uses 8) is not supported"),
    ("mpt", {"attn_config": {"alibi": False}}, "mpt: attn_config.alibi=false"),
    ("mpt", {"attn_config": {"qk_ln": True}}, "mpt: attn_config.qk_ln=true"),
    ("mpt", {"attn_config": {"prefix_lm": True}}, "mpt: attn_config.prefix_lm=true"),
    ("mpt", {"attn_config": {"attn_type": "multiquery_attention"}},
     "mpt: attn_config.attn_type='multiquery_attention'"),
    ("mpt", {"no_bias": False}, "mpt: no_bias=false (biases) is not supported"),
    ("mpt", {"expansion_ratio": 2}, "mpt: expansion_ratio=2"),
    ("mpt", {"logit_scale": 0.5}, "mpt: logit_scale=0.5 is not supported"),
])
def test_what_transformers_ignores_and_mosaicml_honours_is_refused_in_one_line(
        family, change, message):
    keys = BLOOM_KEYS if family == "bloom" else MPT_KEYS
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf({"model_type": family, **keys, **change})
    assert message in str(err.value)
    assert "\n" not in str(err.value)
