"""Granite 4.0-H: Mamba-2 layers carrying a conv and a float32 recurrent state beside
attention layers. The fixture (conftest.FAMILIES "granitemoehybrid-mamba") has three
Mamba-2 layers around one attention layer, 8 heads in 2 groups of B and C; the generic
suites (test_exactness, test_families, test_state_runtime) run it too.

transformers runs a prompt's Mamba-2 layers in their chunked (SSD) form and a decode step
in the recurrent one, which the bundle runs for every token; both are compared here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.bundle import load_manifest
from edgeprefill.engines import StepBatch
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.conftest import GRANITE4_H, build_hf_model, load_hf_model
from tests.state_models import GRAPHS, assert_padded_chunks_match, variant_bundles
from tests.test_exactness import checkpoint_key, prompt_ids, reference_logits

FAMILY = "granitemoehybrid-mamba"
FLAVORS = ("ort", "standard")
# The last layer is Mamba-2, one group of B and C for every head, a kernel of 2, biases on
# the projections and none on the convolution, dt clamped (time_step_limit), no rotary.
# transformers clamps dt in its prompt form only, not in its decode steps: on this model the
# two differ by 0.85 at 40 tokens (3.3 at 100). The bundle clamps, as the prompt form does;
# the Hub's configs leave the limit at (0, inf), where the forms agree.
MAMBA_LAST = {**GRANITE4_H, "num_hidden_layers": 3, "position_embedding_type": "nope",
              "layer_types": ["attention", "mamba", "mamba"], "mamba_n_groups": 1,
              "mamba_d_conv": 2, "mamba_conv_bias": False, "mamba_proj_bias": True,
              "time_step_limit": [0.05, 0.5]}
# ibm-granite/granite-4.0-h-1b's config.json as we know its shape (the Hub was not
# reachable here): 40 layers, 4 of them NoPE attention (where is illustrative), 48 Mamba-2
# heads of 64, a state of 128, one group.
HUB_H_1B = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
    "attention_bias": False, "attention_multiplier": 0.0078125, "bos_token_id": 100257,
    "embedding_multiplier": 12, "eos_token_id": 100257, "hidden_act": "silu",
    "hidden_size": 1536, "intermediate_size": 4096, "logits_scaling": 6,
    "layer_types": ["attention" if i in (10, 13, 17, 27) else "mamba" for i in range(40)],
    "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_head": 64,
    "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 48,
    "mamba_proj_bias": False, "max_position_embeddings": 131072, "num_attention_heads": 12,
    "num_experts_per_tok": 0, "num_hidden_layers": 40, "num_key_value_heads": 4,
    "num_local_experts": 0, "position_embedding_type": "nope", "residual_multiplier": 0.22,
    "rms_norm_eps": 1e-05, "rope_theta": 10000, "shared_intermediate_size": 4096,
    "tie_word_embeddings": True, "vocab_size": 100352,
}


@pytest.fixture(scope="module")
def mamba_last(tmp_path_factory):
    """flavor -> (hf dir, bundle) of the MAMBA_LAST model."""
    return variant_bundles(tmp_path_factory, "granitemoehybrid", "g4h-mamba-last", MAMBA_LAST)


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
@pytest.mark.parametrize("model", (FAMILY, "mamba_last"))
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        model, flavor, kernels, hf_model, bundle, mamba_last, monkeypatch):
    """Every call's last-token logits equal transformers' (its prompt form) at that
    position, for chunks of 1 to 40 tokens, with a padded last chunk whose padding must
    leave both states as they were at the row's last valid token."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    hf_dir, path = (hf_model(model), bundle(model, flavor)) if model != "mamba_last" \
        else mamba_last(flavor)
    assert_padded_chunks_match(hf_dir, path)


def decode_logits(hf_dir, ids: list[int]) -> np.ndarray:
    """transformers' logits of each position fed one token at a time: its Mamba-2 layers'
    recurrent form (mamba2_selective_state_update), as its decode steps run them."""
    key = (checkpoint_key(hf_dir), tuple(ids))  # both flavours' tests compare with it
    if key not in DECODE_LOGITS:
        DECODE_LOGITS[key] = stepped_logits(hf_dir, ids)
    return DECODE_LOGITS[key].copy()


DECODE_LOGITS: dict[tuple, np.ndarray] = {}


def stepped_logits(hf_dir, ids: list[int]) -> np.ndarray:
    model = load_hf_model(hf_dir)
    out, cache, rows = None, None, []
    with torch.no_grad():
        for token in ids:
            out = model(torch.tensor([[token]]), cache=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0, -1].numpy())
    return np.stack(rows)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_logits_equal_transformers_decode_steps_too(flavor, hf_model, bundle):
    """The recurrent form transformers decodes with equals the chunked form it prefills
    with up to rounding; the bundle (one chunk of 40) equals both at 1e-4."""
    ids = prompt_ids(40)
    stepped = decode_logits(hf_model(FAMILY), ids)
    prompt = reference_logits(hf_model(FAMILY), ids)
    np.testing.assert_allclose(stepped, prompt, rtol=1e-4, atol=1e-4)
    engine = Engine.load(bundle(FAMILY, flavor), threads=2, background=False)
    for start, end in ((0, 40 - 16), (40 - 16, 40)):
        logits = engine.backend.run(StepBatch(np.array([ids[start:end]]),
                                              np.array([start], np.int32),
                                              np.array([end - start], np.int32), 0))
        np.testing.assert_allclose(logits[0], stepped[end - 1], rtol=1e-4, atol=1e-4)
    engine.close()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_slot_restarted_at_position_0_reads_its_states_as_zeros(flavor, hf_model, bundle):
    """A slot whose states are another prompt's starts the next one as transformers does."""
    first, second = prompt_ids(30, seed=3), prompt_ids(20, seed=4)
    expected = reference_logits(hf_model(FAMILY), second)
    engine = Engine.load(bundle(FAMILY, flavor), threads=2, background=False)
    run = engine.backend.run
    run(StepBatch(np.array([first]), np.array([0], np.int32), np.array([30], np.int32), 0))
    for start, end in ((0, 1), (1, 20)):  # a decode-sized call first, then a chunk
        logits = run(StepBatch(np.array([second[start:end]]), np.array([start], np.int32),
                               np.array([end - start], np.int32), 0))
        np.testing.assert_allclose(logits[0], expected[end - 1], rtol=1e-4, atol=1e-4)
    engine.close()


def test_an_fp16_bundle_keeps_the_recurrent_state_float32(hf_model, tmp_path):
    """The conv state in fp16, the SSM state in float32; the backend allocates each as its
    graph input says, and the slot's bytes count both."""
    out = tmp_path / "fp16"
    export(hf_model(FAMILY), out, ExportOptions(dtype="fp16", chunks=(16,), max_context=128,
                                                show_progress=False))
    manifest = load_manifest(out)
    assert manifest.model.state_layers == [0, 2, 3]
    conv_dim = 128 + 2 * 2 * 16
    assert manifest.graph.inputs["past_conv.0"] == ["float16", ["batch", conv_dim, 3]]
    assert manifest.graph.inputs["past_recurrent.0"] == ["float32", ["batch", 8, 16, 16]]
    engine = Engine.load(out, threads=2, background=False, kv_slots=2)
    arrays = engine.backend.state.arrays
    assert [(a.dtype, a.shape) for a in arrays[:2]] == [
        (np.dtype(np.float16), (2, conv_dim, 3)), (np.dtype(np.float32), (2, 8, 16, 16))]
    ids = prompt_ids(30)
    expected = reference_logits(hf_model(FAMILY), ids)
    got = engine.backend.run(StepBatch(np.array([ids]), np.array([0], np.int32),
                                       np.array([30], np.int32), 0))
    assert np.argmax(got[0]) == np.argmax(expected[-1])
    np.testing.assert_allclose(got[0], expected[-1], rtol=0.05, atol=0.05)
    state_bytes = 3 * (conv_dim * 3 * 2 + 8 * 16 * 16 * 4)
    kv_bytes = 2 * 1 * 2 * 128 * 16 * 2
    assert engine.backend.kv_slot_bytes(128) == kv_bytes + state_bytes
    engine.close()


def test_a_hub_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(HUB_H_1B)
    hf = transformers.GraniteMoeHybridConfig.from_dict(HUB_H_1B)
    assert list(ours.mamba_layers) == [
        i for i, kind in enumerate(hf.layer_types) if kind == "linear_attention"]
    m = ours.mamba
    assert m is not None and (m.heads, m.head_dim, m.groups, m.state_size, m.conv_kernel) == (
        hf.mamba_n_heads, hf.mamba_d_head, hf.mamba_n_groups, hf.mamba_d_state,
        hf.mamba_d_conv)
    assert (m.conv_bias, m.proj_bias, m.dt_min, m.dt_max) == (True, False, 0.0, float("inf"))
    assert ours.intermediate_size == hf.shared_intermediate_size
    assert [layer.rope for layer in ours.layers] == [None] * 40  # NoPE


def test_a_hub_width_model_exports_and_matches_transformers(tmp_path):
    """Two layers at granite-4.0-h-1b's widths (a narrow MLP and vocabulary to keep it
    small): the states the manifest declares are transformers' cache shapes, and the
    logits equal its."""
    keys = {k: v for k, v in HUB_H_1B.items() if k not in ("architectures", "model_type")}
    keys.update(num_hidden_layers=2, layer_types=["mamba", "attention"], vocab_size=128,
                shared_intermediate_size=64, bos_token_id=1, eos_token_id=2,
                tie_word_embeddings=False, initializer_range=0.02)
    hf_dir = build_hf_model("granitemoehybrid", tmp_path / "hf", **keys)
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    manifest = load_manifest(tmp_path / "b")
    assert manifest.graph.inputs["past_conv.0"] == ["float32", ["batch", 3072 + 256, 3]]
    assert manifest.graph.inputs["past_recurrent.0"] == ["float32", ["batch", 48, 64, 128]]
    ids = prompt_ids(20)
    expected = reference_logits(hf_dir, ids)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    logits = engine.backend.run(StepBatch(np.array([ids]), np.array([0], np.int32),
                                          np.array([20], np.int32), 0))
    np.testing.assert_allclose(logits[0], expected[-1], rtol=1e-4, atol=1e-4)
    engine.close()


@pytest.mark.parametrize("change, message", [
    ({"num_local_experts": 4}, "routed experts are not supported"),
    ({"mamba_n_groups": 3}, "mamba_n_heads .8. a multiple of mamba_n_groups .3."),
    ({"mamba_d_conv": 1}, "mamba_d_conv must be at least 2"),
    ({"layer_types": ["mamba"] * 4}, "no full_attention layer"),
])
def test_a_config_the_export_cannot_honour_is_refused_in_one_line(hf_model, change, message):
    raw = json.loads((hf_model(FAMILY) / "config.json").read_text())
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf({**raw, **change})
    assert "\n" not in str(err.value)


def test_a_checkpoint_that_disagrees_with_its_config_is_refused_in_one_line(hf_model,
                                                                          tmp_path):
    hf_dir = build_hf_model(FAMILY, tmp_path / "hf")
    tensors = load_file(hf_dir / "model.safetensors")
    name = "model.layers.0.mamba.D"
    tensors[name] = np.ones(4, np.float32)
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ExportError, match=f"{name} has shape .4,., but config.json implies "
                                          r"\(8,\)") as err:
        export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                     show_progress=False))
    assert "\n" not in str(err.value)
