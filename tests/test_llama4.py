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
