"""Nemotron-H (dense): blocks of one Mamba-2 mixer, attention or MLP each, read as
pre-norm layers of a mixer and the MLP after it (export/layer_groups.py). The fixture
(conftest.FAMILIES "nemotron_h") has 7 blocks making 4 layers, one of them a mamba block
with no MLP after it; the generic suites run it too. The Mamba-2 graph itself is tested in
test_mamba2.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig
from tests.state_models import GRAPHS, assert_padded_chunks_match
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_families import export_small, last_logits

# nvidia/NVIDIA-Nemotron-Nano-9B-v2's config.json as we know its shape (the Hub was not
# reachable here): the legacy pattern string, 56 blocks of which 27 mamba, 4 attention.
HUB_NANO_9B_V2 = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "hidden_size": 4480, "num_hidden_layers": 56,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "mamba_num_heads": 128, "mamba_head_dim": 80, "n_groups": 8, "ssm_state_size": 128,
    "conv_kernel": 4, "chunk_size": 128, "use_conv_bias": True, "use_bias": False,
    "time_step_min": 0.001, "time_step_max": 0.1, "time_step_limit": [0.0, float("inf")],
    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 15680, "mlp_hidden_act": "relu2", "mlp_bias": False,
    "layer_norm_epsilon": 1e-05, "vocab_size": 131072, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 12, "pad_token_id": 0,
}


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("nemotron_h"), bundle("nemotron_h", flavor))


def test_a_hub_config_groups_its_blocks_as_transformers_builds_them():
    ours = ModelConfig.from_hf(HUB_NANO_9B_V2)
    blocks = transformers.NemotronHConfig.from_dict(HUB_NANO_9B_V2).layers_block_type
    mixers = [kind for kind in blocks if kind != "mlp"]
    assert ours.num_layers == len(mixers) == 31
    assert [i for i, kind in enumerate(mixers) if kind == "linear_attention"] == \
        list(ours.mamba_layers)
    # a layer has no MLP where its mixer block another mixer block follows
    followed = [blocks[i + 1] if i + 1 < len(blocks) else None
                for i, kind in enumerate(blocks) if kind != "mlp"]
    assert [i for i, kind in enumerate(followed) if kind != "mlp"] == list(ours.mlp_less)
    m = ours.mamba
    assert m is not None and (m.heads, m.head_dim, m.groups, m.state_size, m.conv_kernel) == (
        128, 80, 8, 128, 4)
    assert (m.dt_min, m.dt_max, m.proj_bias, m.conv_bias) == (0.001, float("inf"), False, True)
    assert [layer.rope for layer in ours.layers] == [None] * 31
    assert ours.activation == "relu2" and ours.norm_eps == 1e-5


def test_a_checkpoint_saved_under_model_reads_as_the_hubs_backbone(hf_model, tmp_path):
    """transformers renames the Hub's `backbone.` to `model.` when it loads; a checkpoint
    saved so exports the same."""
    src = hf_model("nemotron_h")
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (hf_dir / name).write_bytes((src / name).read_bytes())
    tensors = load_file(src / "model.safetensors")
    assert all(n.startswith(("backbone.", "lm_head.")) for n in tensors)
    save_file({n.replace("backbone.", "model.", 1): t for n, t in tensors.items()},
              hf_dir / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(40)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(src, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change, message", [
    ({"layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"]},
     r"^nemotron_h: mixture-of-experts blocks are not supported \(layer_types marks 1 of 4 "
     r"as moe\); only the dense Nemotron-H models$"),
    ({"layers_block_type": ["linear_attention", "mlp", "mlp", "full_attention"]},
     r"^nemotron_h: block 2 \(mlp\) is not supported there; a block is mamba or attention, "
     r"or an MLP right after one$"),
    ({"layers_block_type": ["mlp", "linear_attention", "full_attention"]}, "block 0 .mlp."),
    ({"layers_block_type": ["linear_attention", "mlp"]}, "no full_attention layer"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
])
def test_a_config_the_export_cannot_honour_is_refused_in_one_line(hf_model, change, message):
    raw = json.loads((hf_model("nemotron_h") / "config.json").read_text())
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf({**raw, **change})
    assert "\n" not in str(err.value)


def test_the_pattern_string_reads_as_its_block_list(hf_model):
    raw = json.loads((hf_model("nemotron_h") / "config.json").read_text())
    pattern = {k: v for k, v in raw.items() if k != "layers_block_type"}
    pattern["hybrid_override_pattern"] = "M-M*-M-"
    assert ModelConfig.from_hf(pattern) == ModelConfig.from_hf(raw)
