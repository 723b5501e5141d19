"""The KDA families: Kimi Linear's KDA layers (the gated delta rule with a decay per key
channel) carrying a conv and a float32 recurrent state beside NoPE latent attention and
DeepSeek-V3's experts; Bailing hybrid's (full-rank, bounded gates) beside gated MLA with
rotary. The fixtures (conftest.FAMILIES "kimi_linear", "bailing_hybrid") have three KDA
layers around one MLA layer; the generic suites (test_exactness, test_families,
test_state_runtime) run them too."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from edgeprefill.bundle import load_graph, load_manifest
from edgeprefill.engines import StepBatch
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.kernels.gated_delta import delta_scans, fuse_gated_delta, is_delta_scan
from edgeprefill.sdk import Engine
from tests.conftest import load_hf_model
from tests.state_models import GRAPHS, assert_padded_chunks_match, run_padded
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import last_logits
from tests.test_mla import check_int4_dequantized_but_kv_b

KDA_LAYERS = 3  # the fixtures'
KDA_FAMILIES = ("kimi_linear", "bailing_hybrid")
# Shaped as moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (the keys transformers
# reads; the remote code's own left out but those export checks)
HUB_48B = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
    "moe_intermediate_size": 1024, "num_hidden_layers": 27, "num_attention_heads": 32,
    "num_key_value_heads": 32, "head_dim": 72, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "model_max_length": 1048576, "tie_word_embeddings": False,
    "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1,
    "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
    "routed_scaling_factor": 2.446, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                           "kda_layers": [i for i in range(1, 28)
                                          if i not in (4, 8, 12, 16, 20, 24, 27)],
                           "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4},
}


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
@pytest.mark.parametrize("family", KDA_FAMILIES)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        family, flavor, kernels, hf_model, bundle, monkeypatch):
    """Every call's last-token logits equal transformers' at that position, for chunks of
    1 to 40 tokens, with a padded last chunk whose padding must leave both states as they
    were at the row's last valid token; with the native kernels where they build (whose
    GatedDeltaRule must not take KDA's Scans)."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model(family), bundle(family, flavor))


@pytest.mark.parametrize("family", KDA_FAMILIES)
def test_logits_equal_transformers_chunked_form_too(family, hf_model, bundle):
    """transformers runs a prompt's KDA layers in a chunked form, which equals the
    recurrent one the bundle runs up to rounding."""
    ids = prompt_ids(40)
    expected = reference_logits(hf_model(family), ids, chunked_delta_rule=True)
    engine = Engine.load(bundle(family), threads=2, background=False)
    for position, logits in run_padded(engine.backend, ids, 16, split=37).items():
        np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4)
    engine.close()


def test_the_decay_per_key_channel_is_what_the_fixture_tests(hf_model):
    """What the logits tests rest on: the fixture's KDA decays differ across a head's key
    channels enough that one decay per head (their mean) moves transformers' logits."""
    model = load_hf_model(hf_model("kimi_linear"))
    ids = torch.tensor([prompt_ids(40)])
    with torch.no_grad():
        expected = model(ids).logits
        gates = [layer.self_attn.forget_gate for layer in model.model.layers
                 if layer.block_type == "linear_attention"]
        for gate in gates:
            gate.register_forward_hook(
                lambda _module, _inputs, g: g.mean(-1, keepdim=True).expand_as(g))
        per_head = model(ids).logits
    assert (expected - per_head).abs().max() > 1e-2


@pytest.mark.parametrize("family", KDA_FAMILIES)
def test_the_native_delta_rule_switch_leaves_kdas_scans_alone(family, bundle):
    """GatedDeltaRule takes one decay per head: KDA's Scans, whose body runs the same ops
    on a decay per key channel, are named so that the load-time switch never takes them
    (and would, named as a DeltaNet's)."""
    path = bundle(family)
    model = load_graph(path, load_manifest(path))
    scans = [n for n in model.graph.node if n.op_type == "Scan"]
    assert len(scans) == KDA_LAYERS
    assert delta_scans(model) == 0 and fuse_gated_delta(model) == 0
    assert [n.op_type for n in model.graph.node].count("Scan") == KDA_LAYERS
    body = next(a.g for a in scans[0].attribute if a.name == "body")
    assert body.name == "kda0_step"
    # the same body under a DeltaNet's names: the op would take it
    body.name = "delta0_step"
    for value in (*body.input, *body.output):
        value.name = value.name.replace("kda0_", "delta0_")
    for node in body.node:
        for names in (node.input, node.output):
            names[:] = [n.replace("kda0_", "delta0_") for n in names]
    assert is_delta_scan(scans[0])


@pytest.mark.parametrize("family", KDA_FAMILIES)
def test_int4_equals_transformers_with_the_dequantized_projections(family, hf_model,
                                                                   tmp_path):
    """Every projection of the int4 bundle (KDA's gates', Bailing's MLA gate and the
    experts' included; kv_b_proj and the router stay float) computes with its dequantized
    weights and nothing else moves."""
    check_int4_dequantized_but_kv_b(hf_model(family), tmp_path)


def decoded_logits(path, ids: list[int]) -> np.ndarray:
    """The bundle's logits at each of `ids`, fed one token per call."""
    with Engine.load(path, threads=2, background=False) as engine:
        return np.array([engine.backend.run(StepBatch(
            np.array([[token]]), np.array([position], np.int32), np.array([1], np.int32),
            0))[0].copy() for position, token in enumerate(ids)])  # (a reused buffer)


def test_the_int8_bundle_drifts_as_the_other_routed_hybrids_do(hf_model, bundle, tmp_path):
    """The default int8 bundle against the fp32 one, token by token over 40 positions: the
    median of each position's drift (of its largest logit). Its largest is no yardstick: an
    expert choice that flips moves a position's logits by 0.5-1.0 in every routed fixture
    (measured on this prompt: kimi_linear median 0.080, max 0.63; deepseek_v3 0.059,
    0.54; qwen3_5_moe_text 0.082, 0.74)."""
    export(hf_model("kimi_linear"), tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    ids = prompt_ids(40)
    reference = decoded_logits(bundle("kimi_linear"), ids)
    got = decoded_logits(tmp_path / "b", ids)
    drift = np.abs(got - reference).max(-1) / np.abs(reference).max(-1)
    assert np.median(drift) < 0.15


def test_a_hub_config_reads_as_transformers_reads_it():
    import transformers

    ours = ModelConfig.from_hf(HUB_48B)
    hf = transformers.KimiLinearConfig(**HUB_48B)
    assert [i for i, kind in enumerate(hf.layer_types) if kind == "linear_attention"] == \
        list(ours.delta_layers)
    assert [i for i, kind in enumerate(hf.layer_types) if kind == "full_attention"] == \
        [3, 7, 11, 15, 19, 23, 26]
    d = ours.delta
    assert d is not None and (d.key_heads, d.value_heads, d.key_dim, d.value_dim,
                              d.conv_kernel) == (
        hf.linear_num_heads, hf.linear_num_heads, hf.linear_head_dim, hf.linear_head_dim,
        hf.linear_conv_kernel_dim)
    assert ours.latent is not None and (ours.latent.q_lora_rank, ours.latent.kv_lora_rank,
                                        ours.latent.nope_dim, ours.latent.rope_dim) == (
        hf.q_lora_rank, hf.kv_lora_rank, hf.qk_nope_head_dim, hf.qk_rope_head_dim)
    assert all(layer.rope is None for layer in ours.layers)  # NoPE
    moe = ours.moe
    assert moe is not None and (moe.experts, moe.top_k, moe.norm_topk, moe.groups,
                                moe.top_groups, moe.scaling, moe.shared_width) == (
        hf.num_local_experts, hf.num_experts_per_tok, hf.norm_topk_prob, hf.n_group,
        hf.topk_group, hf.routed_scaling_factor, hf.moe_intermediate_size)
    assert moe.layers == tuple(i for i, kind in enumerate(hf.mlp_layer_types)
                               if kind == "sparse") == tuple(range(1, 27))
    assert ours.max_positions == hf.max_position_embeddings == 1048576


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported: the KDA layers"),
    ({"mla_use_nope": False}, "mla_use_nope false"),
    ({"moe_layer_freq": 2}, "moe_layer_freq 2 is not supported"),
    ({"moe_router_activation_func": "softmax"}, "moe_router_activation_func 'softmax'"),
    ({"linear_attn_config": {**HUB_48B["linear_attn_config"], "kda_layers": [1, 2]}},
     "leave out some layers"),
])
def test_a_config_the_export_cannot_honour_is_refused_in_one_line(change, message):
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf({**HUB_48B, **change})
    assert "\n" not in str(err.value)


def test_a_checkpoint_disagreeing_with_its_kda_widths_is_one_line(hf_model, tmp_path):
    hf = shutil.copytree(hf_model("kimi_linear"), tmp_path / "hf")
    tensors = load_file(hf / "model.safetensors")
    name = "model.layers.0.self_attn.f_b_proj.weight"
    tensors[name] = tensors[name][:, :8].copy()
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ExportError, match=r"f_b_proj.weight has shape \(64, 8\), but "
                                          r"config.json implies \(64, 16\)") as err:
        export(hf, tmp_path / "b", ExportOptions(show_progress=False))
    assert "\n" not in str(err.value)


def test_the_hubs_tensor_names_are_what_transformers_saves(hf_model):
    """The checkpoint keeps the Hub's layout (transformers reverses its renames on save):
    block_sparse_moe for every MLP, experts w1/w3/w2, the q/k/v convolutions apart."""
    names = set(load_file(hf_model("kimi_linear") / "model.safetensors"))
    assert "model.layers.1.block_sparse_moe.experts.0.w1.weight" in names
    assert "model.layers.0.block_sparse_moe.gate_proj.weight" in names
    assert "model.layers.0.self_attn.q_conv1d.weight" in names
    assert not any(".mlp." in n for n in names)
    raw = json.loads((hf_model("kimi_linear") / "config.json").read_text())
    assert "num_experts" in raw and "model_max_length" in raw  # the aliases


def test_inspect_names_the_kda_layers_and_their_states(bundle):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    result = CliRunner().invoke(cli, ["inspect", str(bundle("kimi_linear"))])
    assert result.exit_code == 0, result.output
    assert "3 of 4 layers KDA linear attention" in result.output
    assert "1 of 1 attention layers without rope" in result.output
    assert "layers 0, 2, 3 carry a recurrent state" in result.output
    assert "conv [192, 3] float32, recurrent [4, 16, 16] float32" in result.output


def test_an_fp16_bundle_keeps_the_recurrent_state_float32_and_the_model_s_logits(
        hf_model, tmp_path):
    """The conv state in fp16, the recurrent one float32 (transformers' KDA state is), the
    decay, gates and gated norm computed in float32: the logits within fp16's rounding
    (measured 0.0055 of the largest)."""
    out = tmp_path / "fp16"
    export(hf_model("kimi_linear"), out, ExportOptions(dtype="fp16", chunks=(16,),
                                                       max_context=128, show_progress=False))
    manifest = load_manifest(out)
    assert manifest.graph.inputs["past_conv.0"] == ["float16", ["batch", 192, 3]]
    assert manifest.graph.inputs["past_recurrent.0"] == ["float32", ["batch", 4, 16, 16]]
    ids = prompt_ids(30)
    expected = reference_logits(hf_model("kimi_linear"), ids)[-1]
    got = last_logits(out, ids)
    assert np.argmax(got) == np.argmax(expected)
    assert np.abs(got - expected).max() / np.abs(expected).max() < 0.02


def test_bailings_bounded_decay_and_mla_gate_are_what_the_fixture_tests(hf_model):
    """What the bailing_hybrid logits tests rest on: its KDA decay computed unbounded (Kimi's
    softplus form) and its MLA without the gate per head each move transformers' logits."""
    model = load_hf_model(hf_model("bailing_hybrid"))
    ids = torch.tensor([prompt_ids(40)])
    with torch.no_grad():
        expected = model(ids).logits
        layers = model.model.layers
        gates = [layer.self_attn.forget_gate for layer in layers
                 if layer.block_type == "linear_attention"]
        for gate in gates:
            gate.safe_gate = False
        unbounded = model(ids).logits
        for gate in gates:
            gate.safe_gate = True
        for layer in layers:
            if layer.block_type == "full_attention":
                layer.self_attn.g_proj.weight.zero_()  # every head's gate 0.5
        ungated = model(ids).logits
    assert (expected - unbounded).abs().max() > 1e-2
    assert (expected - ungated).abs().max() > 1e-2


def test_a_bailing_config_reads_as_transformers_reads_it():
    """Ling's key names (transformers' attribute_map), its layer groups, KDA's heads from
    the attention's and head_dim, rotary from qk_rope_head_dim on rope_theta."""
    import transformers

    raw = {"model_type": "bailing_hybrid", "num_hidden_layers": 12, "num_experts": 64,
           "num_experts_per_token": 4, "num_shared_experts": 2, "num_expert_group": 4,
           "topk_group": 2, "moe_renormalize": True, "model_max_length": 8192,
           "head_dim": 96, "short_conv_kernel_size": 3, "kda_lower_bound": -4.0}
    ours = ModelConfig.from_hf(raw)
    hf = transformers.BailingHybridConfig(**raw)
    assert [i for i, kind in enumerate(hf.layer_types) if kind == "linear_attention"] == \
        list(ours.delta_layers) == [i for i in range(12) if (i + 1) % 6]
    d = ours.delta
    assert d is not None and (d.key_heads, d.key_dim, d.value_dim, d.conv_kernel,
                              d.gate_lower_bound) == (
        hf.linear_num_heads, hf.linear_head_dim, hf.linear_head_dim,
        hf.linear_conv_kernel_dim, hf.kda_lower_bound)
    moe = ours.moe
    assert moe is not None and (moe.experts, moe.top_k, moe.groups, moe.top_groups,
                                moe.shared_width) == (
        hf.num_local_experts, hf.num_experts_per_tok, hf.n_group, hf.topk_group,
        hf.n_shared_experts * hf.moe_intermediate_size)
    assert moe.layers == tuple(i for i, kind in enumerate(hf.mlp_layer_types)
                               if kind == "sparse") == tuple(range(2, 12))
    assert ours.rotary_dim == hf.qk_rope_head_dim
    assert ours.ropes["global"].theta == hf.rope_parameters["rope_theta"] == 6e6
    assert ours.max_positions == hf.max_position_embeddings == 8192
    unbounded = ModelConfig.from_hf({**raw, "kda_safe_gate": False})
    assert unbounded.delta is not None and unbounded.delta.gate_lower_bound is None
    # What save_pretrained writes: head_dim as qk_rope_head_dim, KDA's widths apart
    saved = {**raw, "linear_head_dim": 32, "linear_num_heads": 8, "linear_conv_kernel_dim": 2}
    ours, hf = ModelConfig.from_hf(saved), transformers.BailingHybridConfig(**saved)
    assert ours.delta is not None and (ours.delta.key_heads, ours.delta.key_dim,
                                       ours.delta.conv_kernel) == (
        hf.linear_num_heads, hf.linear_head_dim, hf.linear_conv_kernel_dim) == (8, 32, 2)


def test_bailings_checkpoint_names_are_read_as_transformers_renames_them(hf_model):
    names = set(load_file(hf_model("bailing_hybrid") / "model.safetensors"))
    assert {"model.word_embeddings.weight", "model.layers.1.attention.dense.weight",
            "model.layers.1.attention.g_proj.weight", "model.layers.0.attention.f_proj.weight",
            "model.layers.1.mlp.gate.expert_bias"} <= names


def test_a_bailing_config_with_another_activation_is_refused_in_one_line(hf_model):
    raw = json.loads((hf_model("bailing_hybrid") / "config.json").read_text())
    with pytest.raises(ExportError, match="hidden_act 'gelu' is not supported: the KDA") \
            as err:
        ModelConfig.from_hf({**raw, "hidden_act": "gelu"})
    assert "\n" not in str(err.value)
