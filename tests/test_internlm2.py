"""InternLM2 / 2.5 (`model_type: internlm2`, InternLM's remote code; transformers has no
class for it): Llama under other names with q, k and v in one projection, `wqkv`, whose
rows go by KV head: each head's queries, then its key, then its value (InternLM2's
attention reads them back with `rearrange(qkv, "b q (h gs d) -> b q h gs d", gs=2 +
queries per KV head)`). The reference is transformers' Llama whose weights the test
packs into that layout and those names, as InternLM's own convert-to-Llama script reads
them back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeprefill.export.exporter import ExportOptions, export
from tests.conftest import build_hf_model, load_hf_model
from tests.test_quantize import logits_at

IDS = [1, 5, 9, 33, 70, 4, 18, 60, 61]
LAYER = {"input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1",
         "mlp.up_proj": "feed_forward.w3", "mlp.down_proj": "feed_forward.w2"}


def wqkv(q, k, v, kv_heads: int, head_dim: int):
    """[q | k | v] rows (all query heads, then keys, then values) -> InternLM2's rows: per
    KV head its group of queries, its key, its value."""
    per_kv = q.shape[0] // (kv_heads * head_dim)
    q = q.reshape(kv_heads, per_kv, head_dim, *q.shape[1:])
    k = k.reshape(kv_heads, 1, head_dim, *k.shape[1:])
    v = v.reshape(kv_heads, 1, head_dim, *v.shape[1:])
    return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[3:])


def internlm2_checkpoint(root, bias: bool, **overrides):
    """A tiny random Llama (`overrides` of its config), then saved again as InternLM2's
    remote code names and packs it."""
    llama = build_hf_model("llama", root / "llama", attention_bias=bias, **overrides)
    config = json.loads((llama / "config.json").read_text())
    kv, head_dim = config["num_key_value_heads"], config["hidden_size"] // config[
        "num_attention_heads"]
    stored = load_file(llama / "model.safetensors")
    out = {"model.tok_embeddings.weight": stored.pop("model.embed_tokens.weight"),
           "model.norm.weight": stored.pop("model.norm.weight"),
           "output.weight": stored.pop("lm_head.weight")}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for kind in ("weight", "bias") if bias else ("weight",):
            q, k, v = (stored.pop(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv")
            out[f"{p}attention.wqkv.{kind}"] = wqkv(q, k, v, kv, head_dim).contiguous()
        for name in list(stored):
            if name.startswith(p):
                module, kind = name[len(p):].rsplit(".", 1)
                out[f"{p}{LAYER[module]}.{kind}"] = stored.pop(name)
    assert not stored, stored.keys()
    hf = root / "internlm2"
    hf.mkdir()
    save_file(out, hf / "model.safetensors")
    for f in llama.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            (hf / f.name).write_bytes(f.read_bytes())
    config = {k: v for k, v in config.items() if k not in ("attention_bias", "mlp_bias")}
    config.update({"model_type": "internlm2", "architectures": ["InternLM2ForCausalLM"],
                   "auto_map": {"AutoModelForCausalLM":
                                "modeling_internlm2.InternLM2ForCausalLM"}, "bias": bias})
    (hf / "config.json").write_text(json.dumps(config))
    return llama, hf


@pytest.mark.parametrize("bias", [False, True])
def test_internlm2_computes_the_llama_it_was_packed_from(tmp_path, bias):
    llama, hf = internlm2_checkpoint(tmp_path, bias)
    export(hf, tmp_path / "b", ExportOptions(chunks=(4,), max_context=64,
                                             show_progress=False))
    with torch.no_grad():
        expected = load_hf_model(llama)(torch.tensor([IDS])).logits[0, -1].numpy()
    got = logits_at(tmp_path / "b", IDS)  # in chunks of 4: prefill over a past too
    assert np.abs(got - expected).max() < 1e-4 * np.abs(expected).max()


def test_internlm2s_config_default_has_biases(tmp_path):
    """InternLM2Config's `bias` defaults to true: a config without the key reads wqkv's
    and wo's biases."""
    llama, hf = internlm2_checkpoint(tmp_path, bias=True)
    config = json.loads((hf / "config.json").read_text())
    del config["bias"]
    (hf / "config.json").write_text(json.dumps(config))
    export(hf, tmp_path / "b", ExportOptions(chunks=(4,), max_context=64,
                                             show_progress=False))
    with torch.no_grad():
        expected = load_hf_model(llama)(torch.tensor([IDS])).logits[0, -1].numpy()
    assert np.abs(logits_at(tmp_path / "b", IDS) - expected).max() < 1e-4 * np.abs(
        expected).max()


def test_a_config_without_bias_over_a_checkpoint_without_biases_is_one_line(tmp_path):
    from tests.test_cli_errors import assert_one_line_error, cli

    _, hf = internlm2_checkpoint(tmp_path, bias=False)
    config = json.loads((hf / "config.json").read_text())
    del config["bias"]  # InternLM2Config's default: true
    (hf / "config.json").write_text(json.dumps(config))
    result = cli("export", hf, "-o", tmp_path / "b", "--quiet")
    assert_one_line_error(result, "attention.wqkv.bias")
