"""Zyphra's ZAYA (export/families/zaya.py): compressed convolutional attention on every
layer (export/cca.py: q/k convolved over time, values half from the token before, two
states beside each layer's KV), L2-normed q/k with a learned key scale, a rope base and
width per layer type, an MLP router carrying its state across layers with a skip expert
(export/zaya_router.py), and learned scales on the embedding and every residual add. Its
fixture (conftest.FAMILIES "zaya") runs in the generic suites too (test_exactness,
test_families, test_state_runtime, test_state_snapshots). Here: the config read as
transformers builds the model, every chunking and batching against transformers, each
state shown to carry what the next call needs, the fixture's switches shown to move
transformers' own output, quantized bundles, and what export refuses."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import StepBatch
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int4_dequantize
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, build_hf_model, load_hf_model
from tests.state_models import GRAPHS, assert_padded_chunks_match, variant_bundles
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_moe import run_rows
from tests.test_quantize import dequantize_embeddings, logits_at

MINIMAL = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 128,
           "moe_intermediate_size": 32, "num_experts": 4, "router_hidden_size": 16}
# Zyphra/ZAYA1-8B's config.json as we know its shape (the Hub was not reachable here):
# its rope dict both nested per layer type and with a top-level rope_type (transformers
# drops that key: ZayaConfig.convert_rope_params_to_dict), a dead mamba_cache_dtype.
HUB_8B = {
    "architectures": ["ZayaForCausalLM"], "model_type": "zaya", "vocab_size": 262272,
    "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": True,
    "moe_intermediate_size": 2048, "num_experts": 16, "num_experts_per_tok": 1,
    "router_hidden_size": 256, "cca_time0": 2, "cca_time1": 2, "attention_bias": False,
    "lm_head_bias": False, "mamba_cache_dtype": "float32", "bos_token_id": 2,
    "eos_token_id": 106, "pad_token_id": 0,
    "rope_parameters": {"rope_type": "default",
                        "hybrid": {"rope_type": "default", "rope_theta": 5000000.0,
                                   "partial_rotary_factor": 0.5}},
}


def meta_model(keys: dict):
    config = transformers.AutoConfig.for_model("zaya", **keys)
    with torch.device("meta"):
        return config, transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("keys", [
    FAMILIES["zaya"],
    {},  # the config class's layer types and ropes
    {"sliding_window": 4, "layer_types": ["hybrid", "hybrid_sliding", "hybrid"],
     "cca_time0": 3, "cca_time1": 1, "rope_parameters": {
         "hybrid": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
         "hybrid_sliding": {"rope_type": "default", "rope_theta": 100.0}}},
], ids=["fixture", "defaults", "other-widths"])
def test_zaya_reads_as_transformers_builds_its_layers(keys):
    """Each layer's window and rope (base and rotated width), CCA's convolution widths,
    the state layers and the experts, as ZayaForCausalLM has them."""
    ours = ModelConfig.from_hf({"model_type": "zaya", **MINIMAL, **keys})
    config, model = meta_model({**MINIMAL, **keys})
    attention = [layer.self_attn for layer in model.model.layers]
    assert [layer.window for layer in ours.layers] == [a.sliding_window for a in attention]
    projection = attention[0].qkv_proj
    assert ours.cca is not None
    assert (ours.cca.depthwise, ours.cca.grouped, ours.cca.width) == (
        projection.depthwise_kernel_size, projection.grouped_kernel_size,
        projection.conv_kernel_size)
    rotary = model.model.rotary_emb
    for name, kind in ((GLOBAL, "hybrid"), (LOCAL, "hybrid_sliding")):
        if kind not in config.layer_types:
            continue
        inv_freq = rotary.compute_default_rope_parameters(config, layer_type=kind)[0]
        rope = ours.ropes[name]
        assert rope.rotary_dim == 2 * len(inv_freq)
        torch.testing.assert_close(torch.tensor(rope.inv_freq(), dtype=torch.float32),
                                   inv_freq)
    assert [layer.rope for layer in ours.layers] == [
        LOCAL if kind == "hybrid_sliding" else GLOBAL for kind in config.layer_types]
    assert ours.state_layers == ours.kv_state_layers == ours.kv_layers == (0, 1, 2)
    gate = model.model.layers[0].mlp.gate
    assert ours.moe is not None and ours.router_hidden == gate.router_hidden_size
    assert (ours.moe.experts + 1, ours.moe.top_k) == (gate.num_router_classes, gate.top_k)
    assert ours.tie_embeddings == config.tie_word_embeddings


def test_the_hubs_config_reads_as_transformers_reads_it():
    """ZAYA1-8B's shape: its nested rope dict with a top-level rope_type, every layer
    `hybrid` (transformers' default), tied embeddings, half of each head rotated."""
    ours = ModelConfig.from_hf(HUB_8B)
    config = transformers.AutoConfig.for_model(**HUB_8B)
    assert ours.ropes[GLOBAL].theta == config.rope_parameters["hybrid"]["rope_theta"]
    assert ours.rotary_dim == 64 and ours.tie_embeddings
    assert all(layer.window is None for layer in ours.layers)
    assert len(ours.kv_state_layers) == config.num_hidden_layers == 40
    assert ours.moe is not None and (ours.moe.experts, ours.moe.width) == (16, 2048)


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    """Chunks of 1, 2, 3, 16 and 40 tokens, the last before the split padded (its padding
    must stay out of both states): every call's logits are transformers' at that token."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("zaya"), bundle("zaya", flavor))


# The Hub's layout on the fixture's sizes: no biases (a fresh sequence's delayed value is
# zeros), tied embeddings, every layer full (`hybrid`), both convolutions 2 tokens wide.
HUB_LAYOUT = {"attention_bias": False, "tie_word_embeddings": True, "cca_time0": 2,
              "cca_time1": 2, "layer_types": None, "sliding_window": None}


@pytest.mark.parametrize("flavor", ("ort", pytest.param("standard", marks=pytest.mark.slow)))
def test_the_hubs_layout_equals_transformers_for_any_chunk(flavor, tmp_path_factory):
    hf_dir, path = variant_bundles(tmp_path_factory, "zaya", "zaya-hub", HUB_LAYOUT)(flavor)
    cfg = ModelConfig.from_dir(hf_dir)
    assert cfg.tie_embeddings and not cfg.qkv_bias and cfg.sliding_window is None
    assert_padded_chunks_match(hf_dir, path)


@pytest.mark.parametrize("widths", [(1, 3), pytest.param((3, 1), marks=pytest.mark.slow)])
def test_a_convolution_one_token_wide_equals_transformers(widths, tmp_path):
    """cca_time0 or cca_time1 of 1: that convolution reads the token alone (one tap), the
    state the other's window."""
    hf_dir = build_hf_model("zaya", tmp_path / "hf", cca_time0=widths[0], cca_time1=widths[1])
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                                 show_progress=False))
    assert_padded_chunks_match(hf_dir, tmp_path / "b")


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_rows_of_different_valid_lengths_in_one_call_each_equal_transformers(
        flavor, hf_model, bundle):
    """One call of three rows (a 9-token chunk, a decode token, 4 tokens): each row's
    convolution and delayed value read its own states, its tokens routed with the others."""
    hf_dir = hf_model("zaya")
    prompts = [prompt_ids(30, seed=s) for s in (3, 4, 5)]
    engine = Engine.load(bundle("zaya", flavor), threads=2, background=False, kv_slots=3)
    got = run_rows(engine.backend, prompts, [21, 29, 26])
    engine.close()
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(got[row], reference_logits(hf_dir, ids)[-1], rtol=1e-4,
                                   atol=1e-4, err_msg=f"row {row}")


def test_each_state_carries_what_the_next_call_reads(hf_model, bundle):
    """After a 20-token chunk, the next chunk's logits are transformers' with the slot's
    states as the graph left them, and far from them with either state zeroed (the raw
    q/k the convolutions read back, or the last delayed value): chunking is exact only
    because each crosses the call."""
    ids = prompt_ids(30)
    expected = reference_logits(hf_model("zaya"), ids)[29]
    path = bundle("zaya")
    inputs = load_manifest(path).graph.state_inputs
    assert inputs == [f"past_{kind}.{i}" for i in range(3) for kind in ("conv", "recurrent")]
    engine = Engine.load(path, threads=2, background=False)
    backend = engine.backend

    def second_chunk(dropped: str | None) -> np.ndarray:
        backend.run(StepBatch(np.array([ids[:20]]), np.array([0], np.int32),
                              np.array([20], np.int32), 0))
        saved = backend.save_state(0)
        backend.restore_state([np.zeros_like(state) if name.startswith(dropped or "-")
                               else state for name, state in zip(inputs, saved, strict=True)],
                              0)
        return backend.run(StepBatch(np.array([ids[20:]]), np.array([20], np.int32),
                                     np.array([10], np.int32), 0))[0]

    np.testing.assert_allclose(second_chunk(None), expected, rtol=1e-4, atol=1e-4)
    for dropped in ("past_conv", "past_recurrent"):
        assert np.abs(second_chunk(dropped) - expected).max() > 1e-2, dropped
    engine.close()


def routed(model, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' [layers, tokens] router choices (the skip expert as num_experts) and
    the logits, for `ids`."""
    chosen: list[np.ndarray] = []

    def hook(router, inputs, out):
        probs, indices = out[1].numpy(), out[2].numpy()
        chosen.append(np.where(probs[:, 0] == 0, router.num_experts, indices[:, 0]))

    hooks = [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    for each in hooks:
        each.remove()
    return np.stack(chosen), logits


# Each switch set aside in transformers' model: the router's state carried across layers,
# the key scale, the residual scales
SET_ASIDE = {
    "router state": lambda layer: layer.mlp.gate.router_states_scale.zero_()
    if hasattr(layer.mlp.gate, "router_states_scale") else None,
    "key scale": lambda layer: layer.self_attn.qk_norm.temp.fill_(1.0),
    "residual scale": lambda layer: layer.post_mlp_residual_scale.residual_scale.fill_(1.0),
}


def test_the_fixtures_router_and_scales_change_transformers_output(hf_model):
    """What the exactness tests check is there to check: the router chooses the skip
    expert for some tokens and each real expert for others; its state carried across
    layers, the key scale and the residual scales each move transformers' logits."""
    ids = prompt_ids(40)
    chosen, logits = routed(load_hf_model(hf_model("zaya")), ids)
    assert set(np.unique(chosen)) == {0, 1, 2, 3, 4}  # 4: the skip expert
    for what, set_aside in SET_ASIDE.items():
        model = load_hf_model(hf_model("zaya"))
        with torch.no_grad():
            for layer in model.model.layers:
                set_aside(layer)
        assert np.abs(routed(model, ids)[1] - logits).max() > 0.05, what


@pytest.mark.slow  # 5 s; the default suite's int8 check is the one below
def test_int4_equals_transformers_with_dequantized_weights(hf_model, tmp_path):
    """int4 at float compute: every projection (q/k/v, o, each expert, the LM head) and the
    untied table as the bundle stores them, the router's and CCA's convolutions float."""
    hf_dir = hf_model("zaya")
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0)))
    model = load_hf_model(hf_dir)
    ids = prompt_ids(20)
    with torch.no_grad():
        for name, param in model.named_parameters():
            projection = param.dim() == 2 and name.endswith(
                ("proj.weight", "v_proj_current.weight", "v_proj_delayed.weight"))
            if ".mlp.gate." in name or not (projection or "experts" in name
                                            or name == "lm_head.weight"):
                continue
            flat = param.reshape(-1, param.shape[-1]).numpy()
            param.copy_(torch.from_numpy(int4_dequantize(*int4_blockwise(flat, 32),
                                                         flat.shape[1])).reshape(param.shape))
        dequantize_embeddings(model, "int4")
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), expected, rtol=1e-3, atol=1e-3)


def test_int8_stays_close_to_fp32(hf_model, bundle, tmp_path):
    """The int8 bundle's projections (DynamicQuantizeMatMul) drift a few percent from
    fp32; the router, kept float, chooses as fp32's does on these tokens."""
    export(hf_model("zaya"), tmp_path / "int8", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    ids = prompt_ids(12)
    reference = logits_at(bundle("zaya"), ids)
    got = logits_at(tmp_path / "int8", ids)
    assert np.abs(got - reference).max() / np.abs(reference).max() < 0.05


ROPES = {"hybrid": {"rope_type": "default", "rope_theta": 1e4}}


@pytest.mark.parametrize("keys, message", [
    ({"num_experts_per_tok": 2}, "num_experts_per_tok must be 1"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling is not supported"),
    ({"layer_types": ["hybrid", "mamba", "hybrid"]}, "layer_types holds mamba"),
    ({"layer_types": ["hybrid"] * 2}, "layer_types lists 2 layers"),
    ({"rope_parameters": {"hybrid": {"rope_type": "default"}}},
     "rope_parameters needs a hybrid entry with rope_theta"),
    ({"layer_types": ["hybrid_sliding"] * 3, "sliding_window": 4, "rope_parameters": ROPES},
     "rope_parameters needs a hybrid_sliding entry"),
    ({"layer_types": ["hybrid", "hybrid_sliding", "hybrid"]},
     "config.json needs sliding_window"),
    ({"cca_time0": 1, "cca_time1": 1}, "cca_time0 and cca_time1 must be at least 1 and sum"),
])
def test_what_zaya_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "zaya", **MINIMAL, **keys})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("keys, message", [
    ({"cca_time1": 2}, r"conv_qk_grouped.weight has shape \(192, 32, 3\), but config.json "
                       r"implies \(192, 32, 2\)"),
    ({"router_hidden_size": 8}, r"mlp.gate.down_proj.weight has shape \(16, 64\), but "
                                r"config.json implies \(8, 64\)"),
    ({"num_experts": 3}, r"router_mlp.out_proj.weight has shape \(5, 16\), but config.json "
                         r"implies \(4, 16\) \(router_hidden_size 16, 3 experts and the skip"),
])
def test_a_checkpoint_that_disagrees_with_its_config_is_refused_in_one_line(
        keys, message, hf_model, tmp_path):
    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_model("zaya"), hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **keys}))
    with pytest.raises(ExportError, match=message) as refused:
        export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                     show_progress=False))
    assert "\n" not in str(refused.value)


def test_transformers_refuses_more_than_one_expert_per_token_too():
    with pytest.raises(StrictDataclassClassValidationError, match="num_experts_per_tok=1"):
        transformers.AutoConfig.for_model("zaya", num_experts_per_tok=2)
