"""MiniCPM 1/2/4 (`model_type: minicpm`, OpenBMB's remote code; transformers has no class
for it): Llama with muP's scalings. The reference is transformers' Llama with the scalings
folded into the weights, the conversion OpenBMB publishes for llama.cpp: the embedding
times scale_emb, o_proj and down_proj times scale_depth / sqrt(layers) (each is the last
linear map before its residual add), the LM head divided by hidden_size / dim_model_base
(a tied head untied for that). The bundle applies them as multipliers at run time
(export/families/dense.py), so the two agree only if each scaling sits where MiniCPM's
forward puts it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from edgeprefill.export.exporter import ExportOptions, export
from tests.conftest import build_hf_model, load_hf_model
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_quantize import logits_at

IDS = [1, 5, 9, 33, 70, 4, 18, 60, 61]
SCALES = {"scale_emb": 12.0, "scale_depth": 1.4, "dim_model_base": 16}  # hidden 64: width 4


def minicpm_checkpoint(root, tied: bool, **config):
    """A tiny random Llama saved as transformers saves it, its config.json rewritten as
    MiniCPM's (remote code: model_type minicpm, MiniCPMForCausalLM, the scales)."""
    hf = build_hf_model("llama", root, tie_word_embeddings=tied)
    raw = json.loads((hf / "config.json").read_text())
    raw.update({"model_type": "minicpm", "architectures": ["MiniCPMForCausalLM"],
                "auto_map": {"AutoModelForCausalLM": "modeling_minicpm.MiniCPMForCausalLM"},
                **SCALES, **config})
    raw = {k: v for k, v in raw.items() if v is not None}
    (hf / "config.json").write_text(json.dumps(raw))
    return hf


def folded_llama(hf, scales=SCALES):
    """transformers' Llama computing MiniCPM's forward: its weights with the scalings in."""
    model = load_hf_model_as_llama(hf)
    layers = model.config.num_hidden_layers
    residual = scales["scale_depth"] / math.sqrt(layers)
    width = model.config.hidden_size / scales["dim_model_base"]
    with torch.no_grad():
        head = model.lm_head.weight.clone()
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(head / width)
        model.model.embed_tokens.weight = torch.nn.Parameter(
            model.model.embed_tokens.weight.clone() * scales["scale_emb"])
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(residual)
            layer.mlp.down_proj.weight.mul_(residual)
    return model


def load_hf_model_as_llama(hf):
    raw = json.loads((hf / "config.json").read_text())
    raw["model_type"] = "llama"
    as_llama = hf.parent / "as-llama"
    as_llama.mkdir(exist_ok=True)
    for f in hf.iterdir():
        if f.name != "config.json":
            target = as_llama / f.name
            if not target.exists():
                target.symlink_to(f)
    (as_llama / "config.json").write_text(json.dumps(raw))
    return load_hf_model(as_llama)


def assert_computes_folded_llama(hf, out):
    export(hf, out, ExportOptions(chunks=(4,), max_context=64, show_progress=False))
    with torch.no_grad():
        expected = folded_llama(hf)(torch.tensor([IDS])).logits[0, -1].numpy()
    got = logits_at(out, IDS)  # in chunks of 4: prefill over a past too
    assert np.abs(got - expected).max() < 1e-4 * np.abs(expected).max()


@pytest.mark.parametrize("tied", [True, False])
def test_minicpm_computes_llama_with_its_scalings_folded_in(tmp_path, tied):
    hf = minicpm_checkpoint(tmp_path / "hf", tied)
    export(hf, tmp_path / "b", ExportOptions(chunks=(4,), max_context=64,
                                             show_progress=False))
    with torch.no_grad():
        expected = folded_llama(hf)(torch.tensor([IDS])).logits[0, -1].numpy()
        plain = load_hf_model_as_llama(hf)(torch.tensor([IDS])).logits[0, -1].numpy()
    got = logits_at(tmp_path / "b", IDS)  # in chunks of 4: prefill over a past too
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() < 1e-4 * scale
    assert np.abs(plain - expected).max() > 0.1 * scale  # the scalings matter here


def test_minicpm_with_kv_channels_reads_it_as_the_head_width(tmp_path):
    """MiniCPM4's configs give the head width as kv_channels (here the usual one: 16); the
    attention scale is 1 / sqrt of it."""
    hf = minicpm_checkpoint(tmp_path / "hf", True, kv_channels=16)
    assert_computes_folded_llama(hf, tmp_path / "b")


@pytest.mark.parametrize("config, fragment", [
    ({"scale_depth": None}, "lacks scale_depth"),
    ({"use_mup": False}, "use_mup false"),
    ({"sparse_config": {"dense_len": 8192}}, "sparse attention"),
    ({"num_experts": 8}, "MiniCPM-MoE"),
])
def test_what_minicpm_export_does_not_compute_is_one_line(tmp_path, config, fragment):
    hf = minicpm_checkpoint(tmp_path / "hf", True, **config)
    result = cli("export", hf, "-o", tmp_path / "b", "--quiet")
    assert_one_line_error(result, fragment)


def test_minicpm4s_longrope_is_read_as_phi3s(tmp_path):
    """MiniCPM4's rope_scaling (longrope: per-frequency short and long factors and the
    attention factor sqrt(1 + ln(scale) / ln(original positions))), as transformers'
    longrope computes it for Llama: here the short factors (the bundle's context is
    within the original positions)."""
    rope = {"rope_type": "longrope", "short_factor": [1.0 + 0.3 * i for i in range(8)],
            "long_factor": [2.0 + i for i in range(8)], "original_max_position_embeddings": 256}
    hf = minicpm_checkpoint(tmp_path / "hf", True, rope_scaling=rope,
                            max_position_embeddings=1024)
    assert_computes_folded_llama(hf, tmp_path / "b")
