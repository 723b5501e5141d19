"""Step 3.7 (export/families/step3p5.py: its step3p5 language model in the step3p7
image-text wrapper). Its fixture (conftest.FAMILIES step3p7) runs in the generic suites:
test_exactness compares every chunk's logits with transformers in both flavours, test_moe
runs its matrix under slow (chunks of 1, 2, 3, 16 and 40 with a padded last chunk, rows of
different lengths in one call, int4 experts against the dequantized model, greedy text
across chunk sizes). Here: config.json read as transformers builds the model (the
fixture's, and one shaped as the Hub's), each new piece shown to matter (a bundle with it
broken is off transformers), Step 3.5's flat layout, and what export refuses."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import onnx
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export import decoder
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine
from tests.conftest import FAMILIES, IMAGE_TEXT, build_hf_model
from tests.state_models import assert_engine_chunks_match, assert_padded_chunks_match
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import last_logits
from tests.test_moe import run_rows

SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
# A text_config shaped as Step-3.7-Flash's (the remote code's keys: attribute_map aliases,
# attention_other_setting, moe_layers_enum, per-layer rope_theta, partial_rotary_factors and
# clamps padded with 3 multi-token-prediction layers' entries, rope_scaling, the keys its
# config class ignores), at the fixture's sizes; its clamps on the last two layers, as
# the Hub's on layers 43-44.
HUB_TEXT = {
    "model_type": "step3p5", "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "vocab_size": 128, "num_attention_heads": 4,
    "num_attention_groups": 2, "head_dim": 32, "sliding_window": 8,
    "attention_other_setting": {"attention_type": "sliding_attention",
                                "num_attention_heads": 6, "num_attention_groups": 2,
                                "head_dim": 32, "true_head_dim": 32},
    "layer_types": ["sliding_attention", "full_attention"] * 2 + ["full_attention"] * 3,
    "num_nextn_predict_layers": 3, "moe_layers_enum": "1,2,3,4,5,6",
    "moe_num_experts": 8, "moe_top_k": 2, "moe_intermediate_size": 32,
    "share_expert_dim": 48, "moe_router_scaling_factor": 3.0,
    "moe_router_activation": "sigmoid", "use_moe_router_bias": True, "need_fp32_gate": True,
    "rope_theta": [1e4, 5e6, 1e4, 5e6, 5e6, 5e6, 5e6],
    "partial_rotary_factors": [1.0, 0.5, 1.0, 0.5, 0.5, 0.5, 0.5],
    "rope_scaling": {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 32.0, "original_max_position_embeddings": 64},
    "swiglu_limits": [0.0, 0.0, 7.0, 7.0, 0.0, 0.0, 0.0],
    "swiglu_limits_shared": [0.0, 0.0, 16.0, 16.0, 0.0, 0.0, 0.0],
    "hidden_act": "swigluoai", "use_head_wise_attn_gate": True, "max_position_embeddings": 1024}
FIXTURE_TEXT = {**SMALL, "model_type": "step3p5", **FAMILIES["step3p7"]}


def hf_text_model(text: dict):
    """transformers' Step 3.7 of `text` (a tiny tower beside), its language model, on the
    meta device (the defaults' 288 experts took seconds to initialise)."""
    config = transformers.AutoConfig.for_model("step3p7", text_config=dict(text),
                                               **IMAGE_TEXT["step3p7"])
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    return model.model.language_model


def bound(limit: float) -> float | None:
    return None if math.isinf(limit) else limit


@pytest.mark.parametrize("text", [
    FIXTURE_TEXT, HUB_TEXT, {**FIXTURE_TEXT, "gating": "per-element"},
    {**SMALL, "head_dim": 16},  # the config class's defaults: full layers, 4th on sparse
], ids=["fixture", "hub", "per-element", "defaults"])
def test_step3p7_reads_as_transformers_builds_its_layers(text):
    """Each layer's query heads, window, gate width, scale and clamps, each layer type's
    rope (scaled and partly rotating), the experts' layers, routing and shared MLP."""
    ours = ModelConfig.from_hf({"model_type": "step3p7", "text_config": text})
    model = hf_text_model(text)
    config = model.config
    attention = [layer.self_attn for layer in model.layers]
    assert [ours.layer_heads(i) for i in range(ours.num_layers)] == [
        a.num_heads for a in attention]
    assert [layer.window for layer in ours.layers] == [a.sliding_window for a in attention]
    assert [ours.for_layer(i).num_heads * (ours.head_dim if ours.gate_per_channel else 1)
            for i in range(ours.num_layers)] == [a.g_proj.out_features for a in attention]
    assert ours.attn_scale == pytest.approx(attention[0].scaling)
    rotary = type(model.rotary_emb)(config)  # (on the CPU: its frequencies)
    for name, kind in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        if kind in config.layer_types:
            inv_freq = getattr(rotary, f"{kind}_inv_freq")
            assert ours.ropes[name].rotary_dim == 2 * len(inv_freq)
            torch.testing.assert_close(
                torch.tensor(ours.ropes[name].inv_freq(), dtype=torch.float32), inv_freq)
    sparse = [i for i, layer in enumerate(model.layers) if hasattr(layer.mlp, "experts")]
    assert ours.moe is not None and list(ours.moe.layers) == sparse
    block = model.layers[sparse[0]].mlp
    assert (ours.moe.experts, ours.moe.top_k, ours.moe.width, ours.moe.shared_width,
            ours.moe.scaling) == (block.experts.num_experts, block.gate.top_k,
                                  block.experts.intermediate_dim,
                                  block.shared_experts.intermediate_size,
                                  block.routed_scaling_factor)
    clamps = ours.swiglu_clamps
    routed = [bound(layer.mlp.experts.limit) if i in sparse else None
              for i, layer in enumerate(model.layers)]
    shared = [bound((layer.mlp.shared_experts if i in sparse else layer.mlp).limit)
              for i, layer in enumerate(model.layers)]
    assert (list(clamps.routed), list(clamps.shared)) == (routed, shared) if clamps else \
        routed == shared == [None] * len(routed)
    assert ours.mtp_layers == config.num_nextn_predict_layers
    assert not ours.tie_embeddings


def test_the_hub_texts_model_type_is_read_as_step3p5_whatever_it_says():
    """Step3p7Config drops text_config's model_type (the Hub's is its remote code's)."""
    raw = {"model_type": "step3p7", "text_config": HUB_TEXT}
    other = {**raw, "text_config": {**HUB_TEXT, "model_type": "step3p7_text"}}
    assert ModelConfig.from_hf(other) == ModelConfig.from_hf(raw)


def unclamped(which: int):
    """decoder.bounds_by_prefix with the routed (0) or shared and dense (1) bounds dropped."""
    real = decoder.bounds_by_prefix

    def bounds(*args):
        return {p: tuple(None if k == which else b for k, b in enumerate(pair))
                for p, pair in real(*args).items()}
    return bounds


BROKEN = {  # each new piece, broken in the exporter
    "routed clamp": ("bounds_by_prefix", unclamped(0)),
    "shared and dense clamps": ("bounds_by_prefix", unclamped(1)),
    "sigmoid gate": ("DecoderBuilder._gate_activation", lambda self, gate: gate),
}


@pytest.mark.parametrize("piece", list(BROKEN))
def test_each_piece_broken_puts_the_bundle_off_transformers(piece, hf_model, tmp_path,
                                                           monkeypatch):
    """What the exactness tests check is there to check: without the piece, the
    fixture's last logits move well past their tolerance (1e-4)."""
    name, patch = BROKEN[piece]
    owner, _, attr = name.rpartition(".")
    monkeypatch.setattr(getattr(decoder, owner) if owner else decoder, attr, patch)
    hf_dir = hf_model("step3p7")
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 show_progress=False))
    ids = prompt_ids(40)
    moved = np.abs(last_logits(tmp_path / "b", ids) - reference_logits(hf_dir, ids)[-1])
    assert moved.max() > 0.05


def step3p5_checkpoint(hf_dir, out):
    """hf_dir's Step 3.7 as Step 3.5's Hub layout: config.json flat (model_type step3p5),
    the language model's tensors alone, at the same names."""
    shutil.copytree(hf_dir, out)
    config = json.loads((hf_dir / "config.json").read_text())
    flat = {**config["text_config"], "model_type": "step3p5",
            "architectures": ["Step3p5ForCausalLM"]}
    (out / "config.json").write_text(json.dumps(flat))
    tensors = load_file(hf_dir / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k.startswith(("model.", "lm_head."))},
              out / "model.safetensors")
    return out


def test_step3p5s_flat_checkpoint_runs_as_step3p7s_language_model(hf_model, tmp_path):
    hf_dir = hf_model("step3p7")
    flat = step3p5_checkpoint(hf_dir, tmp_path / "flat")
    export(flat, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                               show_progress=False))
    assert_padded_chunks_match(hf_dir, tmp_path / "b", chunks=(3, 16))


@pytest.mark.parametrize("keys, message", [
    ({"layer_types": ["minimax_m3_sparse", "full_attention"] * 2},
     "layer_types holds minimax_m3_sparse"),
    ({"mlp_layer_types": ["dense", "sparse", "moe", "dense"]}, "mlp_layer_types holds moe"),
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types lists 2 layers"),
    ({"sliding_window": None}, "config.json needs sliding_window"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ({"swiglu_limits": [0, 1.0]}, "swiglu_limits must list a bound"),
    ({"swiglu_limits_shared": [0, -1.0, 0, 0]}, "swiglu_limits_shared must list a bound"),
    ({"rope_theta": [1e4, 5e5]}, "rope_theta lists 2 layers"),
    ({"per_layer_config": {"0": {"head_dim": 16}}}, r"per_layer_config\[0\] overrides"),
    ({"num_sliding_attention_heads": 3}, "layer 0 has 3 query heads"),
    ({"num_sliding_attention_heads": None, "attention_other_setting": [6]},
     "attention_other_setting must be an object"),
])
def test_what_step3p7_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "step3p7", "text_config": {**FIXTURE_TEXT, **keys}})
    assert "\n" not in str(refused.value)


def test_an_int8_bundle_stays_close_to_fp32(hf_model, bundle, tmp_path):
    """int8 as test_moe's quantized experts: within 5% of the fp32 bundle (its activations
    are quantized on the fly, so transformers cannot be the reference at a tight
    tolerance; int4 is compared with the dequantized model in test_moe's matrix)."""
    export(hf_model("step3p7"), tmp_path / "int8", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    ids = prompt_ids(12)
    reference = last_logits(bundle("step3p7"), ids)
    got = last_logits(tmp_path / "int8", ids)
    assert np.abs(got - reference).max() / np.abs(reference).max() < 0.05


def test_only_the_layers_that_clamp_after_the_activation_keep_their_experts_unrolled(
        tmp_path, caplog):
    """The fixture clamps both expert layers; here layer 2's experts are unclamped: the
    `ort` flavour runs them through ONNX Runtime's MoE op and keeps layer 1's unrolled
    (export/moe_op.py, clamped_after), says so, and the bundle is transformers' model."""
    hf_dir = build_hf_model("step3p7", tmp_path / "hf", swiglu_limits=[0, 1.0, 0, 0])
    with caplog.at_level("WARNING", logger="edgeprefill"):
        export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                                     show_progress=False))
    graph = onnx.load(str(tmp_path / "b" / "model.onnx"), load_external_data=False).graph
    assert [n.op_type for n in graph.node].count("MoE") == 1
    assert "on 1 of the 2 expert layers" in caplog.text
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(tmp_path / "b", ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flavor", ["ort", pytest.param("standard", marks=pytest.mark.slow)])
def test_decode_steps_chunks_and_rows_of_different_lengths_equal_transformers(
        flavor, hf_model, bundle):
    """Chunks of 1 (each a decode step), 3 and 16 tokens, the last before the split
    padded; then one call of three rows of different valid lengths (test_moe's matrix
    runs the rest under slow)."""
    hf_dir, path = hf_model("step3p7"), bundle("step3p7", flavor)
    assert_engine_chunks_match(Engine.load(path, threads=2, background=False), hf_dir,
                               chunks=(1, 3, 16))
    prompts = [prompt_ids(30, seed=s) for s in (3, 4, 5)]
    engine = Engine.load(path, threads=2, background=False, kv_slots=3)
    got = run_rows(engine.backend, prompts, [21, 29, 26])
    engine.close()
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(got[row], reference_logits(hf_dir, ids)[-1], rtol=1e-4,
                                   atol=1e-4, err_msg=f"row {row}")
