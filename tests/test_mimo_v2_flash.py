"""MiMo-V2-Flash: sliding layers with twice the KV heads and attention sinks beside full
layers with neither, value heads narrower than the q/k heads (padded to them in the cache:
export/value_heads.py) times attention_value_scale, a partial rope per layer type, and
DeepSeek-V3's experts without a shared one. Its fixture (conftest.FAMILIES) runs in the
generic suites too: test_exactness compares every chunk's logits with transformers in both
flavours (greedy text under slow), test_moe its matrix (slow)."""

from __future__ import annotations

import pytest
import torch
import transformers

from edgeprefill.bundle import load_manifest
from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import GLOBAL, LOCAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import check_together
from tests.test_moe import hf_moe_model_shapes

FLAVORS = ("ort", "standard")
# MiMoV2FlashConfig's defaults (XiaomiMiMo/MiMo-V2-Flash's shape), 12 of its 48 layers;
# the Hub's config.json stores routed_scaling_factor null
MIMO_V2_FLASH = {"model_type": "mimo_v2_flash", "num_hidden_layers": 12,
                 "routed_scaling_factor": None}


def test_the_hub_config_reads_as_transformers_builds_each_layers_attention():
    ours = ModelConfig.from_hf(MIMO_V2_FLASH)
    config = transformers.AutoConfig.for_model(**MIMO_V2_FLASH)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).model
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        assert ours.layer_kv_heads(i) * ours.head_dim == attn.k_proj.out_features
        assert ours.layer_kv_heads(i) * ours.v_head_dim == attn.v_proj.out_features
        has_sinks = bool(ours.spec.sinks and ours.layers[i].window)
        assert has_sinks == (attn.sinks is not None), i
        assert ours.layers[i].window == (attn.sliding_window or None)
    assert [layer.kv_heads for layer in ours.layers[:6]] == [None, 8, 8, 8, 8, None]
    assert (ours.head_dim, ours.v_head_dim, ours.value_scale) == (192, 128, 0.707)
    assert ours.attn_scale == pytest.approx(model.layers[0].self_attn.scaling)
    rotary = type(model.rotary_emb)(config)  # on the CPU: its inv_freq per layer type
    for rope, kind in ((GLOBAL, "full_attention"), (LOCAL, "sliding_attention")):
        inv_freq = getattr(rotary, f"{kind}_inv_freq")
        assert ours.ropes[rope].rotary_dim == 2 * len(inv_freq) == 64
        torch.testing.assert_close(torch.tensor(ours.ropes[rope].inv_freq(),
                                                dtype=torch.float32), inv_freq)
    moe = ours.moe
    assert moe is not None
    assert (moe.experts, moe.top_k, moe.width, list(moe.layers), moe.shared_width,
            moe.scaling, moe.norm_topk, moe.expert_bias, moe.groups,
            moe.top_groups) == hf_moe_model_shapes(MIMO_V2_FLASH)


def test_the_remote_sliding_window_size_excludes_the_query():
    raw = {**MIMO_V2_FLASH, "sliding_window_size": 128}
    config = transformers.AutoConfig.for_model(**raw)
    assert ModelConfig.from_hf(raw).sliding_window == config.sliding_window == 129


def test_a_partial_rotary_factor_per_layer_type_is_refused_in_one_line():
    ropes = {"full_attention": {"rope_type": "default", "rope_theta": 5e6,
                                "partial_rotary_factor": 0.5},
             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    with pytest.raises(ExportError, match=r"a partial_rotary_factor per layer type .* is not "
                                          "supported") as err:
        ModelConfig.from_hf({**MIMO_V2_FLASH, "rope_parameters": ropes})
    assert "\n" not in str(err.value)


def test_the_manifest_gives_each_layer_its_kv_heads_and_the_padded_value_heads(bundle):
    model = load_manifest(bundle("mimo_v2_flash", "ort")).model
    assert [model.kv_dims(i) for i in range(3)] == [(1, 32), (2, 32), (2, 32)]


def test_the_native_kernels_run_it_as_transformers(hf_model, bundle, monkeypatch):
    """The ort flavour on the native kernels: chunks of 1 to 40 tokens, crossing the
    window, the last before the split padded."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", "require")
    path = bundle("mimo_v2_flash", "ort")
    engine = Engine.load(path, threads=2, background=False)
    assert engine.backend.kernels.described.startswith("native")
    engine.close()
    assert_padded_chunks_match(hf_model("mimo_v2_flash"), path)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_different_lengths_decode_together_as_transformers(flavor, hf_model, bundle):
    engine = Engine.load(bundle("mimo_v2_flash", flavor), threads=2, background=False,
                         chunk_size=16)
    check_together(engine, hf_model("mimo_v2_flash"), 8)
    engine.close()
