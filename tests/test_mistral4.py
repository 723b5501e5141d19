"""Mistral Small 4 (`mistral4`): DeepSeek-V3's latent attention and experts with a softmax
router over groups and Llama 4's query factor. The fixture's logits against transformers,
chunked and decoding, in both flavours: test_exactness; here: that the fixture exercises
what differs from DeepSeek-V3 (each part changes transformers' own logits), and refusals."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import build_hf_model, load_hf_model
from tests.test_exactness import prompt_ids, reference_logits


def _logits(model, ids: list[int]) -> np.ndarray:
    """transformers' logits, never cached (reference_logits' cache is keyed by weights)."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _sigmoid_route(self, hidden_states):
    """Mistral4TopkRouter.forward with DeepSeek-V3's sigmoid in place of its softmax."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    scores = router_logits.sigmoid()
    size = self.num_experts // self.num_group
    group_scores = scores.view(-1, self.num_group, size).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, self.num_group, size).reshape(
        -1, self.num_experts)
    chosen = torch.topk(scores.masked_fill(~score_mask.bool(), 0.0), k=self.top_k, dim=-1,
                        sorted=False)[1]
    weights = scores.gather(1, chosen)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return router_logits, weights * self.routed_scaling_factor, chosen


def test_the_fixtures_softmax_routing_changes_transformers_logits(tmp_path):
    """A sigmoid router (DeepSeek-V3's) on the same weights computes other logits, so the
    exactness tests would catch a graph that routed as DeepSeek-V3."""
    hf_dir = build_hf_model("mistral4", tmp_path / "a")
    ids = prompt_ids(40)
    model = load_hf_model(hf_dir)
    routers = [m for m in model.modules() if type(m).__name__ == "Mistral4TopkRouter"]
    assert routers
    softmax = _logits(model, ids)
    np.testing.assert_allclose(softmax, reference_logits(hf_dir, ids), rtol=1e-5, atol=1e-5)
    for router in routers:
        router.forward = types.MethodType(_sigmoid_route, router)
    assert np.abs(softmax - _logits(model, ids)).max() > 1e-2


def test_the_fixtures_groups_change_transformers_logits(tmp_path):
    """All 3 groups kept (topk_group 3) chooses other experts than the fixture's best 2."""
    ids = prompt_ids(40)
    grouped = _logits(load_hf_model(build_hf_model("mistral4", tmp_path / "a")), ids)
    every = _logits(load_hf_model(build_hf_model("mistral4", tmp_path / "b", topk_group=3)),
                    ids)
    assert np.abs(grouped - every).max() > 1e-2


def test_the_fixtures_query_scale_changes_transformers_logits(tmp_path):
    """The original window of 4 makes the factor vary within the test prompts."""
    ids = prompt_ids(40)
    scaled = _logits(load_hf_model(build_hf_model("mistral4", tmp_path / "a")), ids)
    rope = json.loads((tmp_path / "a" / "config.json").read_text())["rope_parameters"]
    plain = _logits(load_hf_model(build_hf_model(
        "mistral4", tmp_path / "b", rope_parameters={**rope, "llama_4_scaling_beta": 0.0})),
        ids)
    assert np.abs(scaled[:4] - plain[:4]).max() < 1e-5  # the factor is 1 before position 4
    assert np.abs(scaled - plain).max() > 1e-2


def test_a_rotary_over_other_than_the_rope_part_is_refused():
    rope = {"rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 8192}
    with pytest.raises(ExportError, match="partial_rotary_factor"):
        ModelConfig.from_hf({"model_type": "mistral4", "rope_parameters": rope})


def test_a_saved_head_dim_the_rotary_would_not_fit_is_refused(tmp_path):
    """transformers rotates head_dim x partial_rotary_factor dims (here 8 of the 16 rope
    dims) and fails; export refuses it in one line."""
    from tests.conftest import FAMILIES

    hf_dir = build_hf_model("mistral4", tmp_path / "hf", head_dim=16)
    with pytest.raises(RuntimeError):
        _logits(load_hf_model(hf_dir), prompt_ids(8))
    raw = json.loads((hf_dir / "config.json").read_text())
    assert raw["head_dim"] == 16 and FAMILIES["mistral4"]["qk_rope_head_dim"] == 16
    with pytest.raises(ExportError, match="head_dim 16"):
        ModelConfig.from_hf(raw)


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_decode_steps_match_transformers(flavor, hf_model, bundle):
    """A prefill, then one token a step past the query factor's window: each step's logits
    are transformers' at that position (the factor read from the cache's length)."""
    from edgeprefill.engines import StepBatch
    from edgeprefill.sdk import Engine

    ids = prompt_ids(30)
    expected = reference_logits(hf_model("mistral4"), ids)
    engine = Engine.load(bundle("mistral4", flavor), threads=2, background=False)
    spans = [(0, 3)] + [(at, at + 1) for at in range(3, len(ids))]
    for start, end in spans:
        logits = engine.backend.run(StepBatch(
            np.array([ids[start:end]], np.int64), np.array([start], np.int32),
            np.array([end - start], np.int32), first_slot=0))
        np.testing.assert_allclose(logits[0], expected[end - 1], rtol=1e-4, atol=1e-4,
                                   err_msg=f"step at {start}")
    engine.close()


def test_the_image_text_wrapper_of_mistral4_exports_its_language_model(tmp_path):
    """Mistral Small 4 on the Hub is Mistral3ForConditionalGeneration with a mistral4
    text_config: its language model's logits, as transformers computes them on text."""
    from tests.conftest import FAMILIES
    from tests.test_families import export_small, last_logits

    hf_dir = build_hf_model("mistral3", tmp_path / "hf", **FAMILIES["mistral4"],
                            model_type="mistral4", tie_word_embeddings=False,
                            head_dim=32)  # (the mistral3 fixture's 16 is not mistral4's)
    assert json.loads((hf_dir / "config.json").read_text())["text_config"][
        "model_type"] == "mistral4"
    ids = prompt_ids(30)
    out = export_small(hf_dir, tmp_path / "b")
    np.testing.assert_allclose(last_logits(out, ids), reference_logits(hf_dir, ids)[-1],
                               rtol=1e-4, atol=1e-4)
