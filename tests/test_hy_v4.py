"""Hy4 (hy_v4: families/sparse_attention.py): DeepSeek-V3.2's latent attention and
indexer with the indexer's rotary on the last dims of its heads and its key norm at
rms_norm_eps, GLM-5's shared indexer layers, per-head sinks and a gate per value channel,
DeepSeek-V3's experts with their SwiGLU's gate and up clamped before the activation
(swiglu_clamps "before"; in `ort` bundles ONNX Runtime's MoE op), and hyper-connections
(export/hyper_connections.py) around every sublayer. Its conftest fixture (index_topk
past the bundles' context) runs in the generic suites; here, with index_topk 8 so that
the selection bites from the ninth key on: chunks of 1, 3 and 16 and a padded chunk in
both flavours, rows of other lengths decoding together, what each piece changes in
transformers' own logits, int4 against the dequantized weights, a Hub config as
transformers reads it, and what export refuses.

The pieces each shown necessary (the bundle's logits moved off transformers' by more than
0.3 with the piece taken out of the graph, against 2e-5 with it): the streams' post
weights' hc_magnitude, the mixes' RMS factor, the head's hc_scale, every stream starting
as the embedding, the indexer's rotary on the last dims, the sinks, the value gate, the
clamp's order (Step 3.7's "after" instead), the attention's rotary on halves. hc_eps
(1e-6 on weights near 1) moves nothing measurable; the key norm's epsilon only where the
index keys are small (test_the_index_key_norm_is_at_rms_norm_eps)."""

from __future__ import annotations

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
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, build_hf_model, load_hf_model
from tests.flavour_bundles import check_chunks_against, flavour_bundles, hf_logits
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_mla import dequantized_int4_but_kv_b
from tests.test_openelm import check_chunks_and_padding, check_rows_decode_together, run_chunks

TOPK = 8


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    return build_hf_model("hy_v4", tmp_path_factory.mktemp("hy_v4-k8"), index_topk=TOPK)


bundle = flavour_bundles("hy_v4-k8")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunked_decoded_and_padded_as_transformers(flavor, hf, bundle):
    """A 40-token prompt (five times the keys a query keeps) in chunks of 1, 3 and 16 and
    a padded chunk: each chunk's last logits are transformers' at its position."""
    ids = prompt_ids(40)
    check_chunks_and_padding(bundle(flavor), ids, hf_logits(load_hf_model(hf), ids))


def test_the_ort_bundle_runs_the_clamped_experts_in_the_moe_op(bundle):
    """The clamp before the activation is the op's swiglu_limit with beta 0: each expert
    layer is one MoE node (which the test above checks against transformers; without its
    swiglu_limit the logits move by 3.2)."""
    model = onnx.load(str(bundle("ort") / "model.onnx"), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "MoE"]
    assert len(nodes) == 3
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["activation_alpha"], attrs["activation_beta"],
                attrs["swiglu_limit"]) == (1.0, 0.0, 1.0)


def test_rows_of_other_lengths_decode_together_as_transformers(hf, bundle):
    """Three rows of 5, 19 and 33 tokens (the streams of each its own), then 3 decode
    steps of the three in one call each."""
    model = load_hf_model(hf)
    check_rows_decode_together(bundle("standard"), lambda ids: hf_logits(model, ids)[-1], 3)


def test_each_piece_moves_transformers_logits(hf):
    """What the tests above check is there to check in transformers' own forward: keeping
    8 keys (against every key), the shared layers (layer 2 running an indexer of its own),
    the sinks, the clamp, and the streams' input-dependent mixes each move the logits at
    the prompt's last token."""
    ids = prompt_ids(40)
    model = load_hf_model(hf)
    base = hf_logits(model, ids)[-1]

    def moved() -> float:
        return float(np.abs(hf_logits(model, ids)[-1] - base).max())

    layers = model.model.layers
    indexers = [layer.self_attn.indexer for layer in layers
                if layer.self_attn.indexer is not None]
    assert [layer.self_attn.indexer is None for layer in layers] == [False, False, True, True]
    for indexer in indexers:
        indexer.index_topk = 2048
    assert moved() > 0.05
    for indexer in indexers:
        indexer.index_topk = TOPK
    attn = layers[2].self_attn
    torch.manual_seed(0)
    attn.skip_topk, attn.indexer = False, type(indexers[0])(model.config, 2)
    assert moved() > 0.05
    attn.skip_topk, attn.indexer = True, None
    with torch.no_grad():
        for layer in layers:
            layer.self_attn.sinks.fill_(-1e4)  # a sink that takes no weight
    assert moved() > 0.05
    model = load_hf_model(hf)
    for layer in model.model.layers[1:]:
        layer.mlp.experts.swiglu_limit = 1e9
    assert moved() > 0.05
    model = load_hf_model(hf)
    with torch.no_grad():
        for layer in model.model.layers:
            for hc in (layer.attn_hc, layer.ffn_hc):
                hc.scale.zero_()  # the mixes then the same for every token
    assert moved() > 0.05


def test_the_index_key_norm_is_at_rms_norm_eps(tmp_path):
    """Hy4's k_norm is a LayerNorm at rms_norm_eps (1e-5), not DeepSeek-V3.2's 1e-6: with
    wk scaled down so that the index keys' variance is near it, the bundle (its epsilon
    taken from the config) still computes transformers' logits, and transformers' own
    logits move with the epsilon (by 0.014)."""
    hf_dir = build_hf_model("hy_v4", tmp_path / "hf", index_topk=TOPK)
    model = load_hf_model(hf_dir)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.self_attn.indexer is not None:
                layer.self_attn.indexer.wk.weight.mul_(0.01)
    model.save_pretrained(tmp_path / "small")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (hf_dir / name).exists():
            (tmp_path / "small" / name).write_bytes((hf_dir / name).read_bytes())
    ids = prompt_ids(40)
    want = hf_logits(model, ids)
    for layer in model.model.layers:
        if layer.self_attn.indexer is not None:
            layer.self_attn.indexer.k_norm.eps = 1e-6
    # (100 times the tolerance below)
    assert np.abs(hf_logits(model, ids)[-1] - want[-1]).max() > 1e-2
    export(tmp_path / "small", tmp_path / "b", ExportOptions(
        flavor="standard", chunks=(16,), max_context=64, show_progress=False))
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)
    engine.close()
    np.testing.assert_allclose(np.stack(got), want[[15, 31, 39]], rtol=1e-4, atol=1e-4)


def test_int4_computes_transformers_forward_with_dequantized_weights(hf, tmp_path):
    """Every projection quantized by blocks but kv_b_proj, the routers, the indexer and
    the hyper-connections' weights, which stay float: the bundle computes what transformers
    does with the others dequantized (the experts' and the value gate's among them)."""
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False,
                                             quant=QuantConfig("int4", accuracy_level=0)))
    model = load_hf_model(hf)
    dequantized_int4_but_kv_b(model, keep=("indexer", "_hc.", "hc_head"))
    check_chunks_against(tmp_path / "b", model, prompt_ids(40))


def test_the_mtp_layers_are_left_out_quietly(hf, tmp_path, caplog):
    """Hy4 checkpoints hold multi-token-prediction layers under model.mtp_layers., which
    transformers ignores at load (_keys_to_ignore_on_load_unexpected): export leaves them
    out without a warning."""
    from safetensors.numpy import load_file, save_file

    hf_dir = shutil.copytree(hf, tmp_path / "hf")
    tensors = load_file(str(hf_dir / "model.safetensors"))
    for part in ("eh_proj.weight", "enorm.weight", "self_attn.kv_b_proj.weight"):
        tensors[f"model.mtp_layers.0.{part}"] = np.ones((2, 2), np.float32)
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    export(hf_dir, tmp_path / "b", ExportOptions(flavor="standard", chunks=(16,),
                                                 max_context=64, show_progress=False))
    assert "does not use" not in caplog.text


def test_a_hub_config_reads_as_transformers_builds_the_model():
    """HYV4Config's own config.json (Hy4-preview's shape, written by the config class
    without its derived lists, as a Hub config may lack them): the indexer, its shared
    layers, the expert layers, the streams and the clamp as transformers builds them."""
    written = transformers.HYV4Config().to_dict()
    raw = {k: v for k, v in written.items()
           if k not in ("indexer_types", "mlp_layer_types", "layer_types")}
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).model
    layers = model.layers
    index, latent, hyper = ours.sparse_index, ours.latent, ours.hyper
    assert index is not None and latent is not None and hyper is not None
    indexer = layers[0].self_attn.indexer
    assert (index.heads, index.head_dim, index.topk, index.norm_eps) == (
        indexer.n_heads, indexer.head_dim, indexer.index_topk, indexer.k_norm.eps)
    assert index.rope_last and not index.interleaved
    assert index.shared == tuple(i for i, layer in enumerate(layers)
                                 if layer.self_attn.indexer is None)
    assert ours.moe is not None and ours.moe.layers == tuple(
        i for i, kind in enumerate(config.mlp_layer_types) if kind == "sparse")
    assert (hyper.streams, hyper.magnitude, hyper.eps, hyper.norm_eps) == (
        layers[0].attn_hc.hc_mult, layers[0].attn_hc.hc_post_magnitude,
        layers[0].attn_hc.hc_eps, layers[0].attn_hc.input_norm.eps)
    assert model.hc_head.eps == hyper.eps
    clamps = ours.swiglu_clamps
    assert clamps is not None and clamps.gate_first
    assert set(clamps.routed) == {layers[1].mlp.experts.swiglu_limit}
    assert set(clamps.shared) == {None}
    assert ours.attn_scale == pytest.approx(layers[0].self_attn.scaling)
    assert ours.head_dim == latent.rope_dim + latent.kv_lora_rank


@pytest.mark.parametrize("keys, message", (
    ({"q_lora_rank": None}, "q_lora_rank null (one dense query projection) is not "
                            "supported"),
    ({"indexer_types": ["shared", "full", "full", "full"]},
     "indexer_types must be 4 of \"full\" and \"shared\", the first \"full\""),
    ({"hc_mult": 0}, "hc_mult must be at least 1"),
    ({"swiglu_limit": "10"}, "swiglu_limit must be a number"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                          "partial_rotary_factor": 0.5}},
     "partial_rotary_factor other than 1 is not supported"),
))
def test_a_config_export_does_not_compute_is_refused_in_one_line(keys, message):
    raw = {"model_type": "hy_v4", **FAMILIES["hy_v4"], "hidden_size": 64, "vocab_size": 128,
           **keys}
    with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig.from_hf(raw)
