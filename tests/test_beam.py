"""Beam: Qwen3-MoE's attention with a sigmoid output gate per channel (plus a bias per
head), rotary and a window on its sliding layers, NoPE full layers whose queries take a
scalable-softmax factor of the position, sandwich norms with depth-scaled residual adds,
DeepSeek-V3's grouped routing, soft-capped logits. The fixture (conftest.FAMILIES "beam")
has every piece on; test_exactness and test_moe run it too."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from transformers.models.beam.modeling_beam import compute_attention_scaling

from edgeprefill.errors import ExportError
from edgeprefill.export.graph import GraphBuilder
from edgeprefill.export.layer_attention import LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.query_scale import ScalableSoftmax
from edgeprefill.sdk import Engine
from tests.conftest import build_hf_model
from tests.state_models import assert_padded_chunks_match, run_padded
from tests.test_exactness import FLAVORS, NEW_TOKENS, check_together, prompt_ids, reference_logits
from tests.test_families import export_small, last_logits

SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "num_experts": 8,
         "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_group": 2,
         "topk_group": 1}
FAST_STANDARD = ["ort", pytest.param("standard", marks=pytest.mark.slow)]


@pytest.mark.parametrize("keys", [
    {"num_hidden_layers": 7},  # BeamConfig's layer kinds, MLP kinds and ropes
    {"num_hidden_layers": 4, "sliding_window": 16, "attention_bias": True,
     "final_logit_softcapping": None, "norm_topk_prob": False, "routed_scaling_factor": 1.5},
    {"num_hidden_layers": 3, "layer_types": ["full_attention", "sliding_attention",
                                             "full_attention"],
     "mlp_layer_types": ["sparse", "dense", "sparse"],
     "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                         "full_attention": None}},
])
def test_config_keys_read_as_the_model_builds_them(keys):
    raw = {"model_type": "beam", **SMALL, **keys}
    ours = ModelConfig.from_hf(raw)
    config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    layers = model.model.layers
    assert [layer.window for layer in ours.layers] == [
        layer.self_attn.sliding_window for layer in layers]
    assert [layer.rope for layer in ours.layers] == [
        LOCAL if config.rope_parameters[kind] else None for kind in config.layer_types]
    assert ours.ropes[LOCAL].theta == config.rope_parameters["sliding_attention"]["rope_theta"]
    assert ours.moe is not None and ours.moe.layers == tuple(
        i for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts"))
    gate = next(layer.mlp.gate for layer in layers if hasattr(layer.mlp, "gate"))
    assert (ours.moe.groups, ours.moe.top_groups, ours.moe.norm_topk, ours.moe.scaling) == (
        gate.num_group, gate.topk_group, gate.norm_topk_prob, config.routed_scaling_factor)
    assert ours.moe.shared_width == 0
    assert ours.final_softcap == config.final_logit_softcapping
    assert (ours.qkv_bias, ours.o_bias) == (config.attention_bias,) * 2
    assert ours.head_gate and ours.block == "sandwich"
    assert ours.query_scale == ScalableSoftmax()


def test_the_scalable_softmax_factor_is_the_models():
    """The graph's factor of each position equals compute_attention_scaling's, to 64k."""
    g = GraphBuilder()
    at = g.input("positions", np.int64, (1, "C"))
    g.rename(ScalableSoftmax().emit(g, at, np.dtype(np.float32)), "factor")
    g.output("factor", np.float32, (1, "C", 1))
    session = ort.InferenceSession(g.to_model([], {"": 21}, 10).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    positions = np.arange(65536)[None]
    got = session.run(None, {"positions": positions})[0]
    expected = compute_attention_scaling(torch.from_numpy(positions))[0].numpy()  # [1,C,1]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("flavor", FAST_STANDARD)
def test_chunks_of_1_3_and_16_tokens_with_a_padded_one_are_transformers(
        flavor, hf_model, bundle):
    assert_padded_chunks_match(hf_model("beam"), bundle("beam", flavor), (1, 3, 16))


@pytest.mark.parametrize("flavor", FAST_STANDARD)
def test_a_long_prompt_in_chunks_of_64_is_transformers(flavor, hf_model, bundle):
    """300 tokens: the NoPE layers' query factor grows to 1.014, the window of 8 far behind."""
    ids = prompt_ids(300)
    expected = reference_logits(hf_model("beam"), ids)
    engine = Engine.load(bundle("beam", flavor), threads=2, background=False)
    for position, logits in run_padded(engine.backend, ids, 64, split=290).items():
        np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4,
                                   err_msg=f"position {position}")
    engine.close()


@pytest.mark.parametrize("flavor", FAST_STANDARD)
def test_the_depth_scaled_residual_adds_are_the_models_where_the_norms_epsilon_counts(
        flavor, tmp_path):
    """x * sqrt((n-1)/n) + sublayer / sqrt(n) is sqrt(n) times smaller than the plain
    sum, which every RMSNorm reading the stream undoes but for its epsilon: with an
    epsilon as large as the stream's mean square (1.0) the scaling shows in the logits."""
    hf_dir = build_hf_model("beam", tmp_path / "hf", rms_norm_eps=1.0)
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b", flavor), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flavor", FAST_STANDARD)
def test_rows_of_different_lengths_generate_together_as_transformers(
        flavor, hf_model, bundle):
    engine = Engine.load(bundle("beam", flavor), threads=2, background=False)
    check_together(engine, hf_model("beam"), NEW_TOKENS)
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_greedy_text_is_transformers_in_every_chunking(flavor, hf_model, bundle):
    from tests.test_exactness import check_greedy

    check_greedy(hf_model("beam"), bundle("beam", flavor), (1, 15, 16, 17, 100),
                 (1, 3, 16, 64, None))


def test_a_gate_projection_per_head_is_refused_in_one_line(tmp_path, hf_model):
    """Beam's gate_proj gives each channel its gate: a checkpoint with one per head (LFM3's
    shape) is not the model config.json names."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from edgeprefill.export.exporter import ExportOptions, export

    hf_dir = shutil.copytree(hf_model("beam"), tmp_path / "hf")
    path = hf_dir / "model.safetensors"
    tensors = load_file(path)
    name = "model.layers.0.self_attn.gate_proj.weight"
    tensors[name] = tensors[name][:4]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ExportError) as err:
        export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                     show_progress=False))
    assert str(err.value) == (f"{name} has shape (4, 64), but config.json implies (64, 64) "
                              "(4 heads of 16 gates, hidden 64)")
