"""Llama 4's language model (llama4_text; llama4, its image-text checkpoint). The fixtures'
chunk logits against transformers in both flavours run in test_exactness and the
mixture-of-experts matrix in test_moe (slow); here what those rest on (each of the
family's switches changes transformers' logits on the fixture) and the context cap of
chunked attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.llama4 import modeling_llama4

from edgeprefill.bundle import load_manifest
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import build_hf_model, load_hf_model
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import last_logits


def weighed_after(self, hidden_states):
    """Llama4TextMoe with each chosen expert's output weighed, not its input."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    scores, logits = self.router(x)
    out = self.shared_expert(x)
    experts = self.experts
    for e in range(self.num_experts):
        gate, up = (x @ experts.gate_up_proj[e]).chunk(2, dim=-1)
        out = out + scores[:, e:e + 1] * ((up * experts.act_fn(gate)) @ experts.down_proj[e])
    return out, logits


def without_temperature(model) -> None:
    for module in model.modules():
        if isinstance(module, modeling_llama4.Llama4TextAttention):
            module.attn_temperature_tuning = False


def without_qk_norm(model) -> None:
    for module in model.modules():
        if isinstance(module, modeling_llama4.Llama4TextAttention) and \
                hasattr(module, "qk_norm"):
            del module.qk_norm


@pytest.mark.parametrize("change", ("weighed after", "no temperature", "no qk norm"))
def test_each_of_the_fixtures_switches_changes_transformers_logits(change, hf_model,
                                                                    monkeypatch):
    """What makes test_exactness check them: the experts' input scaling, the NoPE layer's
    temperature (a step every 8 positions) and the L2 q/k norm each move the logits."""
    model = load_hf_model(hf_model("llama4_text"))
    ids = torch.tensor([prompt_ids(40)])
    with torch.no_grad():
        before = model(ids).logits
        if change == "weighed after":
            monkeypatch.setattr(modeling_llama4.Llama4TextMoe, "forward", weighed_after)
        else:
            (without_temperature if change == "no temperature" else without_qk_norm)(model)
        after = model(ids).logits
    assert (after - before).abs().max() > 1e-2


def test_chunked_attention_caps_the_context_at_one_chunk(tmp_path):
    """Within its first chunk chunked attention is causal attention: a bundle holds one
    chunk (its logits transformers'), and a longer context is refused in one line."""
    hf_dir = build_hf_model("llama4_text", tmp_path / "hf", attention_chunk_size=32)
    with pytest.raises(ExportError, match=r"^--max-context 64 exceeds attention_chunk_size "
                                          r"\(32\): chunked attention past one chunk is not "
                                          r"supported$"):
        export(hf_dir, tmp_path / "refused", ExportOptions(chunks=(16,), max_context=64,
                                                           show_progress=False))
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), show_progress=False))
    assert load_manifest(tmp_path / "b").max_context == 32
    ids = prompt_ids(32)
    np.testing.assert_allclose(last_logits(tmp_path / "b", ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)
    # past the chunk transformers' rope layers see their own chunk only: not causal
    longer = prompt_ids(40)
    unchunked = build_hf_model("llama4_text", tmp_path / "hf8192")
    assert np.abs(reference_logits(hf_dir, longer)[-1]
                  - reference_logits(unchunked, longer)[-1]).max() > 1e-2


# meta-llama/Llama-4-Scout-17B-16E's text_config (its keys transformers' model reads), as
# the Hub's image-text config.json nests it; Maverick's differs in the keys below.
SCOUT_TEXT = {
    "model_type": "llama4_text", "vocab_size": 202048, "hidden_size": 5120,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_hidden_layers": 48,
    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 10485760, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
    "num_experts_per_tok": 1, "num_local_experts": 16, "interleave_moe_layer_step": 1,
    "use_qk_norm": True, "no_rope_layers": [], "attention_chunk_size": 8192,
    "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
}
MAVERICK_TEXT = {**SCOUT_TEXT, "num_local_experts": 128, "interleave_moe_layer_step": 2,
                 "use_qk_norm": False, "rope_scaling": None}


@pytest.mark.parametrize("text", (SCOUT_TEXT, MAVERICK_TEXT), ids=("scout", "maverick"))
def test_the_hub_configs_read_as_transformers_builds_the_model(text):
    import transformers

    ours = ModelConfig.from_hf({"model_type": "llama4", "text_config": text})
    hf = transformers.Llama4TextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    assert [layer.rope is not None for layer in ours.layers] == \
        [bool(flag) for flag in hf.no_rope_layers]
    assert list(ours.moe.layers) == hf.moe_layers
    assert (ours.moe.experts, ours.moe.top_k, ours.moe.width, ours.moe.shared_width,
            ours.intermediate_size) == (hf.num_local_experts, 1, 8192, 8192, 16384)
    assert ours.context_cap.tokens == 8192 and ours.query_scale.window == 8192
    assert ours.qk_norm == ("l2" if hf.use_qk_norm else None)
    assert ours.ropes[GLOBAL].kind == (hf.rope_parameters["rope_type"])
