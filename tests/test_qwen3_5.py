"""Qwen3.5 dense: Gated DeltaNet layers carrying a conv and a float32 recurrent state beside
Qwen3-Next's gated attention. The fixtures (conftest.FAMILIES "qwen3_5_text", "qwen3_5")
have three DeltaNet layers around one attention layer, two key heads serving four value
heads; the generic suites (test_exactness, test_families) run them too."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from edgeprefill.bundle import MANIFEST_FILE, load_manifest
from edgeprefill.engines import BackendOptions, StepBatch
from edgeprefill.errors import BackendError, BundleError, ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.conftest import QWEN3_5, build_hf_model
from tests.state_models import GRAPHS, assert_padded_chunks_match, run_padded, variant_bundles
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import export_small, last_logits, saved_alone

FLAVORS = ("ort", "standard")
# The last layer is linear attention, as many key heads as value heads, a kernel of 2,
# untied; the attention layer first.
LINEAR_LAST = {**QWEN3_5, "num_hidden_layers": 3,
               "layer_types": ["full_attention", "linear_attention", "linear_attention"],
               "linear_num_key_heads": 4, "linear_num_value_heads": 4,
               "linear_conv_kernel_dim": 2}
# Qwen/Qwen3.5-0.8B's config.json, the vision tower's keys left out.
HUB_0_8B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "image_token_id": 248056, "tie_word_embeddings": True,
    "text_config": {
        "attention_bias": False, "attn_output_gate": True, "eos_token_id": 248044,
        "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
        "hidden_size": 1024, "intermediate_size": 3584, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 16,
        "linear_value_head_dim": 128, "max_position_embeddings": 262144,
        "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1, "num_attention_heads": 8,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "vocab_size": 248320,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                            "rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25},
    },
}


@pytest.fixture(scope="module")
def linear_last(tmp_path_factory):
    """flavor -> (hf dir, bundle) of the LINEAR_LAST model."""
    return variant_bundles(tmp_path_factory, "qwen3_5_text", "q35-linear-last", LINEAR_LAST)


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
@pytest.mark.parametrize("model", ("qwen3_5_text", "qwen3_5", "linear_last"))
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        model, flavor, kernels, hf_model, bundle, linear_last, monkeypatch):
    """Every call's last-token logits equal transformers' at that position, for chunks of
    1 to 40 tokens, with a padded last chunk whose padding must leave both states as they
    were at the row's last valid token (the next call reads them)."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    hf_dir, path = (hf_model(model), bundle(model, flavor)) if model != "linear_last" \
        else linear_last(flavor)
    assert_padded_chunks_match(hf_dir, path)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_slot_restarted_at_position_0_reads_its_states_as_zeros(flavor, hf_model, bundle):
    """A slot whose states are another prompt's (a whole-or-nothing reuse that chose
    nothing) starts the next one as transformers does, at 1e-4."""
    first, second = prompt_ids(30, seed=3), prompt_ids(20, seed=4)
    expected = reference_logits(hf_model("qwen3_5_text"), second)
    engine = Engine.load(bundle("qwen3_5_text", flavor), threads=2, background=False)
    run = engine.backend.run
    run(StepBatch(np.array([first]), np.array([0], np.int32), np.array([30], np.int32), 0))
    for start, end in ((0, 1), (1, 20)):  # a decode-sized call first, then a chunk
        logits = run(StepBatch(np.array([second[start:end]]), np.array([start], np.int32),
                               np.array([end - start], np.int32), 0))
        np.testing.assert_allclose(logits[0], expected[end - 1], rtol=1e-4, atol=1e-4)
    engine.close()


def test_the_states_are_shaped_by_the_graph_and_the_recurrent_one_stays_float32(
        hf_model, tmp_path):
    """An fp16 bundle keeps the conv state in fp16 and the recurrent state in float32, as
    transformers computes it; the backend allocates each as its graph input says."""
    out = tmp_path / "fp16"
    export(hf_model("qwen3_5_text"), out, ExportOptions(dtype="fp16", chunks=(16,),
                                                         max_context=128, show_progress=False))
    manifest = load_manifest(out)
    assert manifest.model.state_layers == [0, 1, 3]
    assert manifest.graph.state_inputs == ["past_conv.0", "past_recurrent.0", "past_conv.1",
                                           "past_recurrent.1", "past_conv.3",
                                           "past_recurrent.3"]
    conv_dim = 2 * 2 * 16 + 4 * 8
    assert manifest.graph.inputs["past_conv.0"] == ["float16", ["batch", conv_dim, 3]]
    assert manifest.graph.inputs["past_recurrent.0"] == ["float32", ["batch", 4, 16, 8]]
    engine = Engine.load(out, threads=2, background=False, kv_slots=2)
    arrays = engine.backend.state.arrays
    assert [(a.dtype, a.shape) for a in arrays[:2]] == [
        (np.dtype(np.float16), (2, conv_dim, 3)), (np.dtype(np.float32), (2, 4, 16, 8))]
    ids = prompt_ids(30)
    expected = reference_logits(hf_model("qwen3_5_text"), ids)
    got = engine.backend.run(StepBatch(np.array([ids]), np.array([0], np.int32),
                                       np.array([30], np.int32), 0))
    assert np.argmax(got[0]) == np.argmax(expected[-1])
    np.testing.assert_allclose(got[0], expected[-1], rtol=0.05, atol=0.05)
    # The slot's bytes count both states at their own dtypes.
    state_bytes = 3 * (conv_dim * 3 * 2 + 4 * 16 * 8 * 4)
    kv_bytes = 2 * 1 * 2 * 64 * 128 * 2
    assert engine.backend.kv_slot_bytes(128) == kv_bytes + state_bytes
    engine.close()


def test_a_hub_config_reads_as_transformers_reads_it():
    import transformers

    ours = ModelConfig.from_hf(HUB_0_8B)
    outer = transformers.Qwen3_5Config.from_dict(HUB_0_8B)
    hf = outer.get_text_config()
    assert [i for i, kind in enumerate(hf.layer_types) if kind == "linear_attention"] == \
        list(ours.delta_layers) == [i for i in range(24) if (i + 1) % 4]
    assert ours.delta is not None and (ours.delta.key_heads, ours.delta.value_heads,
                                       ours.delta.key_dim, ours.delta.conv_kernel) == (
        hf.linear_num_key_heads, hf.linear_num_value_heads, hf.linear_key_head_dim,
        hf.linear_conv_kernel_dim)
    assert ours.rotary_dim == 64 and ours.ropes["global"].theta == 1e7
    assert ours.tie_embeddings is outer.tie_word_embeddings is True
    assert ours.attn_gate and ours.eos_token_ids == (248044,)


@pytest.mark.parametrize("change, message", [
    ({"num_experts": 8}, "routed experts are not supported .* qwen3_5_moe_text"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported: the Gated DeltaNet"),
    ({"layer_types": ["linear_attention", "mamba", "full_attention", "linear_attention"]},
     "layer_types holds unsupported kinds: mamba"),
    ({"layer_types": ["linear_attention"] * 4}, "no full_attention layer"),
    ({"linear_num_value_heads": 3}, "multiple of linear_num_key_heads"),
])
def test_a_config_the_export_cannot_honour_is_refused_in_one_line(hf_model, change, message):
    raw = json.loads((hf_model("qwen3_5_text") / "config.json").read_text())
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf({**raw, **change})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", ("qwen3_5_moe_text", "qwen3_next"))
def test_a_moe_delta_net_model_with_another_activation_is_refused_in_one_line(family, hf_model):
    """Their DeltaNet convolution takes hidden_act as the dense model's does."""
    raw = json.loads((hf_model(family) / "config.json").read_text())
    with pytest.raises(ExportError, match="hidden_act 'gelu' is not supported") as err:
        ModelConfig.from_hf({**raw, "hidden_act": "gelu"})
    assert "\n" not in str(err.value)


def test_an_image_text_checkpoint_with_a_moe_language_model_is_refused():
    text = {**HUB_0_8B["text_config"], "model_type": "qwen3_5_moe_text"}
    with pytest.raises(ExportError, match="qwen3_5_moe_text"):
        ModelConfig.from_hf({**HUB_0_8B, "text_config": text})


def test_the_vision_tower_and_the_mtp_head_are_left_out_in_one_line(tmp_path, caplog):
    hf_dir = build_hf_model("qwen3_5", tmp_path / "hf")
    tensors = load_file(hf_dir / "model.safetensors")
    assert any(n.startswith("model.visual.") for n in tensors)
    tensors["mtp.fc.weight"] = np.ones((64, 128), np.float32)  # the Hub's MTP head
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING, logger="edgeprefill"):
        export_small(hf_dir, tmp_path / "b")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages  # no unused-tensor warning
    assert "visual" in messages[0] and "mtp" in messages[0] and "\n" not in messages[0]
    manifest = json.loads((tmp_path / "b" / MANIFEST_FILE).read_text())
    assert any("vision tower left out" in q for q in manifest["source"]["quirks"])
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(tmp_path / "b", ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_the_language_model_saved_alone_by_transformers_exports(tmp_path, family):
    """The Hub's checkpoint loaded with AutoModelForCausalLM (as fine-tuning scripts load
    it) and saved: transformers 5 writes the text model's config (qwen3_5_text) with the
    image-text checkpoint's tensor names, `model.language_model.`, which export had
    refused ("the checkpoint lacks the tensor 'model.embed_tokens.weight'")."""
    text, expected = saved_alone(family, tmp_path)
    saved = load_file(text / "model.safetensors")
    assert any(name.startswith("model.language_model.") for name in saved)
    assert json.loads((text / "config.json").read_text())["model_type"] == f"{family}_text"
    out = export_small(text, tmp_path / "b")
    np.testing.assert_allclose(last_logits(out, prompt_ids(40)), expected, rtol=1e-4,
                               atol=1e-4)


def test_a_manifest_without_its_recurrent_states_is_refused(bundle, tmp_path):
    path = shutil.copytree(bundle("qwen3_5_text"), tmp_path / "b")
    raw = json.loads((path / MANIFEST_FILE).read_text())
    for key in ("state_inputs", "state_outputs"):
        raw["graph"][key] = [n for n in raw["graph"][key] if "recurrent" not in n]
    (path / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="unexpected past_recurrent.0"):
        load_manifest(path)


def test_tensorrt_refuses_the_bundle_in_one_line(bundle):
    from edgeprefill.engines.trt.backend import TensorRTBackend
    from tests.trt_fakes import OrtEngineRuntime

    path = bundle("qwen3_5_text", "standard")
    manifest = load_manifest(path)
    with pytest.raises(BackendError, match="recurrent state") as err:
        TensorRTBackend(path, manifest, BackendOptions(),
                        runtime=OrtEngineRuntime(path, manifest, 128, 4))
    assert "\n" not in str(err.value)


def test_inspect_names_both_states(bundle):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli

    result = CliRunner().invoke(cli, ["inspect", str(bundle("qwen3_5_text"))])
    assert result.exit_code == 0, result.output
    assert "layers 0, 1, 3 carry a recurrent state" in result.output
    assert "conv [96, 3] float32, recurrent [4, 16, 8] float32" in result.output


@pytest.mark.parametrize("family", ("qwen3_5_text", "qwen3_5"))
def test_logits_equal_transformers_chunked_form_too(family, hf_model, bundle):
    """transformers runs a prompt's DeltaNet layers in a chunked form, which equals the
    recurrent one the bundle runs (and the other tests compare) up to rounding."""
    ids = prompt_ids(40)
    expected = reference_logits(hf_model(family), ids, chunked_delta_rule=True)
    engine = Engine.load(bundle(family), threads=2, background=False)
    for position, logits in run_padded(engine.backend, ids, 16, split=37).items():
        np.testing.assert_allclose(logits, expected[position], rtol=1e-4, atol=1e-4)
    engine.close()

