"""PhiMoE (Phi-3.5-MoE): sparsemixer routing. Its fixture's chunk logits against
transformers in both flavours run in test_exactness and the mixture-of-experts matrix in
test_moe (slow); here what those rest on (the routing's rule and gap change transformers'
logits on the fixture) and the Hub config as export reads it."""

from __future__ import annotations

import pytest
import torch
from transformers.models.phimoe import modeling_phimoe

from edgeprefill.errors import ExportError
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import load_hf_model
from tests.test_exactness import prompt_ids


def softmax_top2(scores, jitter_eps, training, top_k=2):
    """Mixtral's rule in sparsemixer's place: softmax, the top 2, renormalized."""
    weights, chosen = torch.topk(torch.softmax(scores, dim=-1), 2, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), chosen


@pytest.mark.parametrize("change", ("softmax top 2", "gap 0.01"))
def test_the_fixtures_routing_rule_and_gap_change_transformers_logits(change, hf_model,
                                                                     monkeypatch):
    model = load_hf_model(hf_model("phimoe"))
    ids = torch.tensor([prompt_ids(40)])
    with torch.no_grad():
        before = model(ids).logits
        if change == "softmax top 2":
            monkeypatch.setattr(modeling_phimoe, "sparsemixer", softmax_top2)
        else:
            for module in model.modules():
                if isinstance(module, modeling_phimoe.PhimoeTopKRouter):
                    module.router_jitter_noise = 0.01
        after = model(ids).logits
    assert (after - before).abs().max() > 1e-2


# microsoft/Phi-3.5-MoE-instruct's config.json, its factor lists cut to the rotary's 64
PHI35_MOE = {
    "model_type": "phimoe", "vocab_size": 32064, "hidden_size": 4096,
    "intermediate_size": 6400, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "sliding_window": 131072, "num_experts_per_tok": 2,
    "num_local_experts": 16, "router_jitter_noise": 0.01, "attention_bias": True,
    "lm_head_bias": True, "original_max_position_embeddings": 4096,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.01 * i for i in range(64)],
                     "long_factor": [1.0 + 0.5 * i for i in range(64)],
                     "short_mscale": 1.243163121016122, "long_mscale": 1.243163121016122,
                     "original_max_position_embeddings": 4096},
}


def test_the_hub_config_reads_its_short_rope_and_caps_the_context_at_its_window():
    cfg = ModelConfig.from_hf(PHI35_MOE)
    rope = cfg.ropes[GLOBAL].for_context(cfg.context_cap.tokens)
    assert (cfg.max_positions, cfg.context_cap.tokens, rope.use_long_factor) == \
        (131072, 4096, False)
    assert rope.cos_sin_scale() == pytest.approx(1.243163121016122)
    assert (cfg.moe.routing, cfg.moe.top_k, cfg.moe.jitter) == ("sparsemixer", 2, 0.01)
    assert cfg.lm_head_bias and cfg.qkv_bias and cfg.o_bias


def test_a_longrope_without_its_mscale_is_refused_in_one_line():
    raw = {**PHI35_MOE, "rope_scaling": {k: v for k, v in PHI35_MOE["rope_scaling"].items()
                                         if k != "short_mscale"}}
    with pytest.raises(ExportError, match="^config.json lacks the required key 'short_mscale'$"):
        ModelConfig.from_hf(raw)
