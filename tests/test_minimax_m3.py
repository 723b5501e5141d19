"""MiniMax-M3's language model (minimax_m3_vl_text: families/minimax_m3.py) and its
image-text checkpoint (minimax_m3_vl): the block index (export/block_index.py) in front
of grouped-query attention with Gemma's per-head q/k norms and partial rotary, gpt-oss's
clamped SwiGLU in its dense MLP, shared MLP and experts. Its conftest fixture
(index_topk_blocks past the bundles' context) runs in the generic suites; here, with
blocks of 4 keys and 3 kept, so that the selection bites from the thirteenth key on:
chunks that cut blocks in the middle (3) and whole blocks (16), a padded chunk, rows of
other lengths decoding together, the image-text checkpoint (saved in the Hub's names),
what each piece changes in transformers' own logits, a Hub config as transformers reads
it, and what export refuses.

The pieces each shown necessary (the bundle's logits moved off transformers' by more than
0.1 with the piece taken out of the graph, against 4e-6 with it): the selection itself
(every visible key kept), the local block forced in, one choice per KV head (the first
head's choice for all), the blocks anchored at position 0 (at the chunk's first token),
the index queries' and keys' rotary and their (1 + w) norms, the index key's cache (the
chunk's own keys only), gpt-oss's activation in the shared and dense MLPs (act(gate) * up
clamped instead).

Ties: a block's score is one key's dot product with a rotated index key, so two blocks
tie only on equal rotated keys, which no two positions have; the bundle keeps every block
tied at the boundary where transformers keeps some in torch.topk's order (block_index.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.kernels import graph, select
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, build_hf_model, load_hf_model
from tests.flavour_bundles import check_chunks_against, flavour_bundles, hf_logits
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_mla import dequantized_int4_but_kv_b
from tests.test_openelm import (
    check_chunk_ends,
    check_chunks_and_padding,
    check_rows_decode_together,
    run_chunks,
)

TOPK = 3  # blocks of 4 keys: 12 keys in reach


@pytest.fixture(scope="module")
def hf(hf_model, tmp_path_factory) -> Path:
    """The generic suites' checkpoint (built once per run) keeping TOPK blocks."""
    out = shutil.copytree(hf_model("minimax_m3_vl_text"), tmp_path_factory.mktemp("m3-k3"),
                          dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "index_topk_blocks": TOPK}))
    return out


bundle = flavour_bundles("m3-k3", max_context=64)


def test_chunks_that_cut_blocks_compute_transformers_logits(hf, bundle):
    """A 40-token prompt (ten blocks, three kept) in chunks of 3, whose ends cut blocks,
    and of 16: each chunk's last logits are transformers' at its position."""
    ids = prompt_ids(40)
    want = hf_logits(load_hf_model(hf), ids)
    engine = Engine.load(bundle("ort"), threads=2, background=False)
    check_chunk_ends(engine, ids, want, (3, 16))
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunked_decoded_and_padded_as_transformers(flavor, hf, bundle):
    """Chunks of 1, 3 and 16 and a padded chunk, in both flavours."""
    ids = prompt_ids(40)
    check_chunks_and_padding(bundle(flavor), ids, hf_logits(load_hf_model(hf), ids))


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_other_lengths_decode_together_as_transformers(flavor, hf, bundle):
    """Three rows of 5, 19 and 33 tokens (each its own blocks), then 3 decode steps of
    the three in one call each (in the ort flavour, rows of other lengths packed)."""
    model = load_hf_model(hf)
    check_rows_decode_together(bundle(flavor), lambda ids: hf_logits(model, ids)[-1], 3)


@pytest.mark.slow
@pytest.mark.parametrize("keys", (
    {"index_local_blocks": 0}, {"index_local_blocks": 2},
    {"index_block_size": 5, "index_topk_blocks": 2},  # the capacity no multiple of a block
    {"index_head_dim": 16},  # the index key narrower than the value head it is cached in
), ids=("no-local-block", "two-local-blocks", "blocks-of-5", "index-head-16"))
def test_other_block_settings_compute_transformers_logits(keys, tmp_path):
    """A 45-token prompt in chunks of 1, 7 and 16, in both flavours."""
    hf_dir = build_hf_model("minimax_m3_vl_text", tmp_path / "hf",
                            **{"index_topk_blocks": TOPK, **keys})
    ids = prompt_ids(45)
    want = hf_logits(load_hf_model(hf_dir), ids)
    for flavor in FLAVORS:
        export(hf_dir, tmp_path / flavor, ExportOptions(flavor=flavor, chunks=(16,),
                                                        max_context=64, show_progress=False))
        engine = Engine.load(tmp_path / flavor, threads=2, background=False)
        check_chunk_ends(engine, ids, want, (1, 7, 16), label=f"{flavor}, ")
        engine.close()


@pytest.mark.slow
def test_each_indexed_layer_caches_the_index_key_in_one_more_kv_head(hf, bundle, tmp_path,
                                                                      caplog):
    """Where the selection bites, the indexed layers (0 and 2) hold 3 KV heads, the plain
    one 2; within the blocks' reach (12 keys) no layer has the extra head, and the
    indexer's weights are left out quietly."""
    raw = json.loads((bundle("standard") / "edgeprefill.json").read_text())
    assert raw["model"]["layer_kv"] == {"0": [3, 32], "2": [3, 32]}
    cfg = ModelConfig.from_dir(hf)
    assert cfg.for_context(12).block_index is None
    assert all(layer.kv_heads is None for layer in cfg.for_context(12).layers)
    assert cfg.for_context(13).block_index is not None
    export(hf, tmp_path / "b", ExportOptions(flavor="standard", chunks=(4,), max_context=12,
                                             show_progress=False))
    assert "layer_kv" not in json.loads((tmp_path / "b" / "edgeprefill.json").read_text())[
        "model"]
    assert "does not use" not in caplog.text


@pytest.mark.slow
def test_the_native_kernels_take_the_plain_layer_and_leave_the_indexed_ones_stock(
        library, hf, bundle, monkeypatch):
    """The indexed layers' GroupQueryAttention takes the selection as its attention_bias,
    which the native kernels lack: those stay stock, the plain layer runs natively, and
    the logits are transformers' (chunks of 1 and 16)."""
    model = onnx.load(str(bundle("ort") / "model.onnx"), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert [graph.why_not_eligible(n) for n in nodes] == [
        graph.ATTENTION_BIAS_WHY, None, graph.ATTENTION_BIAS_WHY]
    monkeypatch.setenv(select.MODE_ENV, "require")
    ids = prompt_ids(40)
    want = hf_logits(load_hf_model(hf), ids)
    engine = Engine.load(bundle("ort"), threads=2, background=False)
    assert "2 of 3 attention layers stay GroupQueryAttention" in \
        engine.backend.kernels.described
    check_chunk_ends(engine, ids, want, (1, 16))
    engine.close()


@pytest.mark.slow
def test_each_piece_moves_transformers_logits(hf):
    """What the tests above check is there to check in transformers' own forward: keeping
    3 blocks (against every block), the local block, and the clamp each move the logits at
    the prompt's last token."""
    ids = prompt_ids(40)
    model = load_hf_model(hf)
    base = hf_logits(model, ids)[-1]

    def moved() -> float:
        return float(np.abs(hf_logits(model, ids)[-1] - base).max())

    indexers = [layer.self_attn.indexer for layer in model.model.layers
                if layer.self_attn.indexer is not None]
    assert len(indexers) == 2
    for indexer in indexers:
        indexer.topk_blocks = 1024
    assert moved() > 0.1
    for indexer in indexers:
        indexer.topk_blocks, indexer.local_blocks = TOPK, 0
    assert moved() > 0.1
    for indexer in indexers:
        indexer.local_blocks = 1
    for layer in model.model.layers:
        mlp = layer.mlp.shared_experts if hasattr(layer.mlp, "shared_experts") else layer.mlp
        mlp.swiglu_limit = 1e9
    assert moved() > 0.1


@pytest.mark.slow
def test_int4_computes_transformers_forward_with_dequantized_weights(hf, tmp_path):
    """Every projection quantized by blocks (the experts' too) but the routers and the
    indexer's, which stay float: the bundle computes what transformers does with the
    others dequantized, the selection biting."""
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False,
                                             quant=QuantConfig("int4", accuracy_level=0)))
    model = load_hf_model(hf)
    dequantized_int4_but_kv_b(model, keep=("indexer",))
    check_chunks_against(tmp_path / "b", model, prompt_ids(40))


@pytest.mark.slow
def test_the_image_text_checkpoint_computes_its_language_model(tmp_path):
    """MiniMaxM3SparseForConditionalGeneration saved by transformers (the Hub's names:
    block_sparse_moe, experts' w1/w3/w2, index_q_proj, gate and up apart, the towers and
    patch_merge_mlp at the top): its language model's logits, the towers left out."""
    hf_dir = build_hf_model("minimax_m3_vl", tmp_path / "hf", index_topk_blocks=TOPK)
    export(hf_dir, tmp_path / "b", ExportOptions(flavor="standard", chunks=(16,),
                                                 max_context=64, show_progress=False))
    ids = prompt_ids(40)
    want = hf_logits(load_hf_model(hf_dir), ids)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)
    engine.close()
    np.testing.assert_allclose(np.stack(got), want[[15, 31, 39]], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_hub_config_reads_as_transformers_builds_the_model():
    """A config.json of the legacy keys (sparse_attention_config, moe_layer_freq, the Hub's
    rotary_dim): the indexer, its layers, the expert layers and the rotary as
    MiniMaxM3VLTextConfig and its model read them."""
    raw = {"model_type": "minimax_m3_vl_text", "num_hidden_layers": 4, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
           "rotary_dim": 16, "moe_layer_freq": [0, 1, 1, 1], "hidden_act": "swigluoai",
           "sparse_attention_config": {"sparse_attention_freq": [1, 0, 1, 1],
                                       "sparse_num_index_heads": 2, "sparse_index_dim": 32,
                                       "sparse_block_size": 8, "sparse_topk_blocks": 5,
                                       "sparse_local_block": 2}}
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).model
    layers = model.layers
    index = ours.block_index
    assert index is not None
    indexer = layers[0].self_attn.indexer
    assert (index.heads, index.head_dim, index.block, index.topk, index.local) == (
        indexer.num_heads, indexer.head_dim, indexer.block_size, indexer.topk_blocks,
        indexer.local_blocks)
    assert index.layers == tuple(i for i, layer in enumerate(layers)
                                 if layer.self_attn.indexer is not None)
    assert ours.moe is not None and ours.moe.layers == (1, 2, 3)
    # transformers' rotary takes partial_rotary_factor alone: the whole head here
    assert ours.rotary_dim == int(model.rotary_emb.inv_freq.shape[0]) * 2 == 32
    assert ours.attn_scale == pytest.approx(layers[0].self_attn.scaling)


@pytest.mark.parametrize("keys, message", (
    ({"index_n_heads": 1}, "index_n_heads (1) other than num_key_value_heads (2) is not "
                           "supported"),
    ({"index_head_dim": 64}, "index_head_dim (64) must be at least the rotary dimension "
                             "(16) and at most head_dim (32)"),
    ({"index_local_blocks": 4}, "index_local_blocks 0 to index_topk_blocks"),
    ({"index_block_size": 0}, "index_block_size and index_topk_blocks must be positive"),
    ({"sparse_attention_config": [1, 0, 1]}, "sparse_attention_config must be an object"),
    ({"layer_types": ["sliding_attention", "full_attention", "full_attention"]},
     "layer_types ['sliding_attention'] are not supported"),
    ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types must list"),
))
def test_a_config_export_does_not_compute_is_refused_in_one_line(keys, message):
    raw = {"model_type": "minimax_m3_vl_text", **FAMILIES["minimax_m3_vl_text"],
           "hidden_size": 64, "vocab_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "index_topk_blocks": TOPK, **keys}
    with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        ModelConfig.from_hf(raw)
