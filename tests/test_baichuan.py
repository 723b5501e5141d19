"""Baichuan 1 and 2 (`model_type: baichuan`, Baichuan's remote code; transformers has no
class for it): Llama with q, k and v in one projection, `W_pack` (rows: all queries, all
keys, all values), rotary in the 7B models and ALiBi in the 13B ones, and in Baichuan 2 a
NormHead (logits = hidden @ normalize(W).T). export/families/baichuan.py says how config.json
tells them apart.

The 7B models' reference is transformers' Llama whose weights the test packs into W_pack,
its LM head's rows stored times random positive factors (which NormHead's normalization
takes out: the reference's head is the normalized rows). The 13B models' is their forward
written here from the remote code's definition (BaichuanModel in eval: `_get_interleave`'s
slopes times the key position, added to q.k / sqrt(head_dim) under the causal mask), over
the checkpoint's own tensors. Each compares a prefill in chunks of 4 (over a past) and then
single-token decode steps."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeprefill.bundle import MANIFEST_FILE
from edgeprefill.engines import StepBatch
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int4_dequantize
from edgeprefill.sdk import Engine
from tests.conftest import build_hf_model, load_hf_model
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_exactness import FLAVORS
from tests.test_quantize import logits_at

IDS = [1, 5, 9, 33, 70, 4, 18, 60, 61, 7, 3]
STEPS = (4, 4, 1, 1, 1)  # a prefill of two chunks, then three decode steps
AUTO_MAP = {"AutoConfig": "configuration_baichuan.BaichuanConfig",
            "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"}


def baichuan_checkpoint(root, *, alibi: bool, version: int, heads: int = 4, **llama):
    """A tiny random Llama of one KV head per query head, saved again as Baichuan's remote
    code saves it: q/k/v packed into W_pack; in Baichuan 2 the LM head's rows times random
    factors in [0.2, 5]; config.json with the keys of the model's config class (7B:
    max_position_embeddings, 13B: model_max_length alone; Baichuan 2: z_loss_weight)."""
    llama_dir = build_hf_model("llama", root / "llama", hidden_size=16 * heads,
                               num_attention_heads=heads, num_key_value_heads=heads, **llama)
    config = json.loads((llama_dir / "config.json").read_text())
    stored = load_file(llama_dir / "model.safetensors")
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        stored[p + "W_pack.weight"] = torch.cat(
            [stored.pop(f"{p}{x}_proj.weight") for x in "qkv"]).contiguous()
    if version == 2:
        factors = torch.empty(config["vocab_size"], 1).uniform_(0.2, 5.0,
                                                                generator=torch.Generator().manual_seed(1))
        stored["lm_head.weight"] = stored["lm_head.weight"] * factors
    hf = root / "baichuan"
    hf.mkdir()
    save_file(stored, hf / "model.safetensors")
    for f in llama_dir.iterdir():  # the tokenizer's files
        if f.name not in ("model.safetensors", "config.json"):
            (hf / f.name).write_bytes(f.read_bytes())
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "hidden_act", "rms_norm_eps", "vocab_size", "bos_token_id", "eos_token_id",
            "pad_token_id", "tie_word_embeddings", "initializer_range")
    raw = {k: config[k] for k in keys}
    raw.update({"model_type": "baichuan", "architectures": ["BaichuanForCausalLM"],
                "auto_map": AUTO_MAP, "model_max_length": 4096})
    if not alibi:
        raw["max_position_embeddings"] = 4096
    if version == 2:
        raw["z_loss_weight"] = 0
    (hf / "config.json").write_text(json.dumps(raw))
    return llama_dir, hf


def bundle_logits(hf, out, ids=IDS, flavor: str = "ort") -> np.ndarray:
    """Each step's last-token logits, the steps of STEPS run one after another."""
    export(hf, out, ExportOptions(chunks=(4,), max_context=64, show_progress=False,
                                  flavor=flavor))
    got = []
    with Engine.load(out, threads=2, background=False) as engine:
        start = 0
        for size in STEPS:
            part = ids[start:start + size]
            got.append(engine.backend.run(StepBatch(
                np.array([part], np.int64), np.array([start], np.int32),
                np.array([len(part)], np.int32), 0))[0].copy())
            start += size
    return np.stack(got)


def at_step_ends(logits: np.ndarray) -> np.ndarray:
    return logits[np.cumsum(STEPS) - 1]


def assert_close(got: np.ndarray, expected: np.ndarray) -> None:
    assert np.abs(got - expected).max() < 1e-4 * np.abs(expected).max()


def llama_logits(llama_dir, normalize: bool, **inputs) -> np.ndarray:
    """The reference for a 7B model: the Llama it was packed from, its head normalized
    (Baichuan 2's NormHead: the stored rows' factors do not matter) or as it is."""
    model = load_hf_model(llama_dir)
    with torch.no_grad():
        if normalize:
            model.lm_head.weight.copy_(torch.nn.functional.normalize(model.lm_head.weight))
        return model(torch.tensor([IDS]), **inputs).logits[0].numpy()


@pytest.mark.parametrize("version", [1, 2])
def test_baichuan_7b_computes_the_llama_it_was_packed_from(tmp_path, version):
    # Baichuan 1 is told by its vocabulary alone (64,000), Baichuan 2 here by z_loss_weight
    vocab = {"vocab_size": 64000} if version == 1 else {}
    llama_dir, hf = baichuan_checkpoint(tmp_path, alibi=False, version=version, **vocab)
    expected = llama_logits(llama_dir, normalize=version == 2)
    if version == 2:  # the stored rows' lengths differ: a missing normalization would show
        assert not np.allclose(llama_logits(llama_dir, normalize=False), expected,
                               rtol=0.1, atol=0.1)
    assert_close(bundle_logits(hf, tmp_path / "b"), at_step_ends(expected))


def test_baichuan_2s_int4_head_quantizes_the_normalized_rows(tmp_path):
    """The LM head quantized alone (float compute): its int4 blocks are those of the
    normalized rows, so the bundle is the Llama whose head is their dequantized values."""
    llama_dir, hf = baichuan_checkpoint(tmp_path, alibi=False, version=2)
    export(hf, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0, float_layers=False, embeddings=False)))
    model = load_hf_model(llama_dir)
    with torch.no_grad():
        rows = torch.nn.functional.normalize(model.lm_head.weight).numpy()
        packed, scales = int4_blockwise(rows, 32)
        model.lm_head.weight.copy_(torch.from_numpy(int4_dequantize(packed, scales, rows.shape[1])))
        expected = model(torch.tensor([IDS])).logits[0, -1].numpy()
    assert_close(logits_at(tmp_path / "b", IDS), expected)


# -- the 13B models: ALiBi ----------------------------------------------------------------

def interleave(n: int) -> list[float]:
    """Baichuan 13B's `_get_interleave` (its remote code): the ALiBi slopes of n heads."""
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + interleave(2 * closest)[0::2][:n - closest]


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def baichuan_13b_logits(hf, ids, normalize: bool, slopes: list[float] | None = None
                        ) -> np.ndarray:
    """Baichuan 13B's forward, BaichuanForCausalLM in eval over the checkpoint's tensors
    (float32): each layer x += o_proj(attention(norm(x))), x += mlp(norm(x)); attention
    scores q.k / sqrt(head_dim) + slope * key position, -inf above the diagonal
    (_gen_alibi_mask), clamped to the float's min; the final norm, then the head (Baichuan
    2's NormHead: its rows normalized). `slopes`: other than _get_interleave's."""
    w = load_file(hf / "model.safetensors")
    cfg = json.loads((hf / "config.json").read_text())
    heads, hidden, eps = cfg["num_attention_heads"], cfg["hidden_size"], cfg["rms_norm_eps"]
    d, n = hidden // heads, len(ids)
    per_head = torch.tensor(interleave(heads) if slopes is None else slopes)
    causal = torch.triu(torch.full((n, n), float("-inf")), 1)
    mask = per_head[:, None, None] * torch.arange(n)[None, None, :] + causal
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = (h @ w[p + "self_attn.W_pack.weight"].T).unflatten(-1, (3, hidden)).unbind(-2)
        q, k, v = (t.view(n, heads, d).transpose(0, 1) for t in (q, k, v))
        scores = torch.clamp(q @ k.transpose(1, 2) / math.sqrt(d) + mask,
                             min=torch.finfo(torch.float32).min)
        attn = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(n, hidden)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gated = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (
            h @ w[p + "mlp.up_proj.weight"].T)
        x = x + gated @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["lm_head.weight"]
    return (x @ (torch.nn.functional.normalize(head) if normalize else head).T).numpy()


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("heads", [4, 5])  # 5: slopes interleaved, as Baichuan 13B's 40
def test_baichuan2_13b_computes_its_alibi_forward(tmp_path, heads, flavor):
    _, hf = baichuan_checkpoint(tmp_path, alibi=True, version=2, heads=heads)
    with torch.no_grad():
        expected = baichuan_13b_logits(hf, IDS, normalize=True)
        stored_head = baichuan_13b_logits(hf, IDS, normalize=False)
    assert not np.allclose(stored_head, expected, rtol=0.1, atol=0.1)  # normalization shows
    assert_close(bundle_logits(hf, tmp_path / "b", flavor=flavor), at_step_ends(expected))
    quirks = json.loads((tmp_path / "b" / MANIFEST_FILE).read_text())["source"]["quirks"]
    assert any(q.startswith("ALiBi") for q in quirks)
    assert any(q.startswith("LM head rows L2-normalized") for q in quirks)


def test_the_13b_reference_without_its_slopes_is_llama_at_one_position(tmp_path):
    """The hand-written forward checked but for ALiBi: with zero slopes it is a causal
    Llama without positions, which transformers' Llama computes with every position 0
    (rotary by angle 0: no rotation)."""
    llama_dir, hf = baichuan_checkpoint(tmp_path, alibi=True, version=2)
    expected = llama_logits(llama_dir, normalize=True,
                            position_ids=torch.zeros(1, len(IDS), dtype=torch.long))
    with torch.no_grad():
        got = baichuan_13b_logits(hf, IDS, normalize=True, slopes=[0.0] * 4)
    assert_close(got, expected)


# -- config.json: which model, and what is refused ------------------------------------------

# The keys of each release's config class that decide (as config.json writes them).
RELEASES = {
    "Baichuan-7B": {"architectures": ["BaiChuanForCausalLM"], "hidden_size": 4096,
                    "num_attention_heads": 32, "max_position_embeddings": 4096,
                    "vocab_size": 64000},
    "Baichuan2-7B": {"hidden_size": 4096, "num_attention_heads": 32,
                     "max_position_embeddings": 4096, "model_max_length": 4096,
                     "vocab_size": 125696, "z_loss_weight": 0},
    "Baichuan-13B": {"hidden_size": 5120, "num_attention_heads": 40, "model_max_length": 4096,
                     "vocab_size": 64000},
    "Baichuan2-13B": {"hidden_size": 5120, "num_attention_heads": 40,
                      "model_max_length": 4096, "vocab_size": 125696},
}


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_reads_as_its_positions_and_head(release):
    raw = {"model_type": "baichuan", "intermediate_size": 11008, "num_hidden_layers": 2,
           "rms_norm_eps": 1e-6, **RELEASES[release]}
    cfg = ModelConfig.from_hf(raw)
    if "13B" in release:
        np.testing.assert_allclose(cfg.alibi, interleave(40), rtol=1e-6, atol=0)
        assert all(layer.rope is None for layer in cfg.layers)
    else:
        assert cfg.alibi is None and all(layer.rope is not None for layer in cfg.layers)
    assert cfg.lm_head_normalized == release.startswith("Baichuan2")
    assert cfg.max_positions == 4096
    assert cfg.num_kv_heads == cfg.num_heads == raw["num_attention_heads"]


@pytest.mark.parametrize("change, fragments", [
    ({"max_position_embeddings": None, "model_max_length": None},
     ("neither max_position_embeddings", "which positions")),
    ({"z_loss_weight": None, "vocab_size": 1000},
     ("vocab_size 1000 is neither Baichuan 2's", "no z_loss_weight")),
    ({"hidden_size": 5120, "num_attention_heads": 40},
     ("max_position_embeddings (rotary)", "Baichuan 13B's, which uses ALiBi")),
])
def test_what_cannot_be_told_apart_is_refused_in_one_line(tmp_path, change, fragments):
    _, hf = baichuan_checkpoint(tmp_path, alibi=False, version=2)
    raw = json.loads((hf / "config.json").read_text())
    raw = {k: v for k, v in {**raw, **change}.items() if v is not None}
    (hf / "config.json").write_text(json.dumps(raw))
    result = cli("export", hf, "-o", tmp_path / "b", "--quiet")
    assert_one_line_error(result, "baichuan: ", *fragments)
