"""Mamba-1 (mamba, falcon_mamba): every layer a selective-scan mixer after an RMS norm,
none attending (export/mamba1.py, on Mamba-2's Scan body). The fixtures (conftest.FAMILIES
"mamba": biased projections, a mixer `intermediate_size` wide rather than expand x hidden;
"falcon_mamba": weightless norms on B, C and dt) also run in test_exactness.py, and in
test_state_runtime.py under `slow` (batched rows, slot copies, prefix reuse, snapshots)."""

from __future__ import annotations

import pytest
import transformers

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.sdk import Engine
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import check_together

# state-spaces/mamba-130m-hf's and tiiuae/falcon-mamba-7b's config.json as we know their
# shape (the Hub was not reachable here). Falcon-Mamba's `expand` disagrees with its
# `intermediate_size`, which wins (MambaConfig sets the given keys over its own).
HUB_130M = {
    "architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 768,
    "num_hidden_layers": 24, "intermediate_size": 1536, "expand": 2, "state_size": 16,
    "conv_kernel": 4, "time_step_rank": 48, "use_bias": False, "use_conv_bias": True,
    "hidden_act": "silu", "layer_norm_epsilon": 1e-05, "residual_in_fp32": True,
    "vocab_size": 50280, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
}
HUB_FALCON_7B = {
    **HUB_130M, "architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba",
    "hidden_size": 4096, "num_hidden_layers": 64, "intermediate_size": 8192, "expand": 16,
    "time_step_rank": 256, "mixer_rms_eps": 1e-6, "vocab_size": 65024,
    "tie_word_embeddings": False, "eos_token_id": 11,
}


@pytest.mark.parametrize("flavor", ("ort", "standard"))
@pytest.mark.parametrize("family", ("mamba", "falcon_mamba"))
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        family, flavor, hf_model, bundle):
    assert_padded_chunks_match(hf_model(family), bundle(family, flavor))


@pytest.mark.parametrize("raw, config_class", ((HUB_130M, transformers.MambaConfig),
                                               (HUB_FALCON_7B, transformers.FalconMambaConfig)))
def test_a_hub_config_reads_as_transformers_reads_it(raw, config_class):
    ours = ModelConfig.from_hf(raw)
    hf = config_class.from_dict(raw)
    s = ours.selective
    assert s is not None and (s.inner, s.state_size, s.conv_kernel, s.dt_rank) == (
        hf.intermediate_size, hf.state_size, hf.conv_kernel, hf.time_step_rank)
    assert s.bc_dt_eps == getattr(hf, "mixer_rms_eps", None)
    assert ours.mamba_layers == tuple(range(hf.num_hidden_layers)) and not ours.kv_layers
    assert ours.tie_embeddings == hf.tie_word_embeddings


def test_only_falcon_mamba_norms_b_c_and_dt():
    """MambaMixer ignores a mixer_rms_eps its config carries (copied from Falcon-Mamba's)."""
    assert ModelConfig.from_hf({**HUB_130M, "mixer_rms_eps": 1e-6}).selective.bc_dt_eps is None


def test_an_auto_time_step_rank_is_hidden_over_16_rounded_up():
    raw = {**HUB_130M, "hidden_size": 100, "time_step_rank": "auto"}
    del raw["intermediate_size"]
    s = ModelConfig.from_hf(raw).selective
    hf = transformers.MambaConfig.from_dict(raw)
    assert s is not None and (s.dt_rank, s.inner) == (hf.time_step_rank, hf.intermediate_size)


def test_a_convolution_activation_other_than_silu_is_refused_in_one_line():
    with pytest.raises(ExportError, match="^mamba: hidden_act 'gelu' is not supported; "
                                          "the mixer's convolution takes silu only$"):
        ModelConfig.from_hf({**HUB_130M, "hidden_act": "gelu"})


def test_prompts_of_different_lengths_generated_together_are_transformers_greedy(
        hf_model, bundle):
    engine = Engine.load(bundle("mamba", "ort"), threads=2, background=False)
    assert engine.backend.kernels.described.startswith("no layer attends; ")
    assert "Mamba2Scan" not in engine.backend.kernels.described  # another body
    check_together(engine, hf_model("mamba"), new_tokens=8)
    engine.close()
