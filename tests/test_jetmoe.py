"""JetMoE (export/families/jetmoe.py, export/mixture_attention.py): a mixture of attention
heads (routed query and output projections over shared keys and values) mapped onto
grouped-query attention, and routed MLP experts, each with its output bias. Its fixture
(conftest.FAMILIES: jetmoe) runs in the generic suites too. Here against transformers'
JetMoeForCausalLM (eager, float32): chunks of 1 (decode steps), 3 and 16 and a padded
chunk in both flavours; rows of other lengths in one call; int4 against the dequantized
weights and int8 close; the routing shown to matter; a Hub-shaped config.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeprefill.engines import StepBatch
from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine
from tests.conftest import hf_config_of, load_hf_model
from tests.flavour_bundles import check_an_edit_moves_both, flavour_fixtures, hf_logits
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_openelm import check_chunks_and_padding, check_rows_decode_together, run_chunks
from tests.test_quantize import dequantize_embeddings, int4_blockwise, int4_dequantize

hf, bundle = flavour_fixtures("jetmoe")


def copied(hf: Path, out: Path) -> Path:
    out.mkdir()
    for f in hf.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunks_decode_and_padding_match_transformers(flavor, hf, bundle):
    ids = prompt_ids(40)
    check_chunks_and_padding(bundle(flavor), ids, hf_logits(load_hf_model(hf), ids))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_other_lengths_decode_together(flavor, hf, bundle):
    model = load_hf_model(hf)
    check_rows_decode_together(bundle(flavor), lambda ids: hf_logits(model, ids)[-1], 3)


def test_rows_of_other_valid_lengths_prefill_in_one_call(hf, bundle):
    """Three rows prefilled to 30, 12 and 21 tokens, then one standard-flavour call of
    4-token chunks holding 4, 1 and 4 valid tokens (padding routed like any token): each
    row's logits are transformers' of its own prompt."""
    model = load_hf_model(hf)
    prompts = [prompt_ids(35, seed) for seed in (1, 2, 3)]
    past, valid = [30, 12, 21], [4, 1, 4]
    engine = Engine.load(bundle("standard"), threads=2, background=False)
    for slot, (ids, n) in enumerate(zip(prompts, past, strict=True)):
        run_chunks(engine, ids[:n], 16, slot=slot)
    chunk = np.array([ids[n:n + 4] for ids, n in zip(prompts, past, strict=True)], np.int64)
    logits = engine.backend.run(StepBatch(chunk, np.array(past, np.int32),
                                          np.array(valid, np.int32), first_slot=0)).copy()
    engine.close()
    for row, (ids, n) in enumerate(zip(prompts, past, strict=True)):
        want = hf_logits(model, ids[:n + valid[row]])[-1]
        np.testing.assert_allclose(logits[row], want, rtol=1e-4, atol=1e-4)


def test_the_fixture_routes_tokens_to_different_attention_experts(hf):
    """Each layer's attention router sends the prompt's tokens to every expert pair it
    can: a bundle that ignored the routing (or the slot order) would compute other
    queries for some tokens."""
    model = load_hf_model(hf)
    ids = torch.tensor([prompt_ids(40)])
    with torch.no_grad():
        h = model.model.embed_tokens(ids)[0]
        layer = model.model.layers[0]
        logits = layer.self_attention.experts.router.layer(layer.input_layernorm(h))
    chosen = {tuple(sorted(row)) for row in logits.topk(2, dim=-1).indices.tolist()}
    assert len(chosen) >= 4


def test_the_attention_experts_bias_moves_transformers_logits_and_the_bundles_alike(
        hf, tmp_path):
    """Every layer's attention experts' bias changed in the checkpoint: transformers'
    logits move, and a bundle exported from it moves with them."""
    check_an_edit_moves_both(hf, tmp_path, "self_attention.experts.bias")


def dequantized_int4(model, block: int = 32) -> None:
    """Every projection of `model` as the int4 bundle stores it: kv_proj, the attention's
    and the MLP's fused experts [E, out, in] (quantized along their input), the LM head
    and the embedding table; the routers stay float."""
    with torch.no_grad():
        dequantize_embeddings(model, "int4", block)
        for name, param in model.named_parameters():
            if param.dim() == 1 or "embed" in name or name.endswith("router.layer.weight"):
                continue
            flat = param.reshape(-1, param.shape[-1]).numpy()
            param.copy_(torch.from_numpy(int4_dequantize(
                *int4_blockwise(flat, block), flat.shape[1])).reshape(param.shape))


@pytest.mark.parametrize("block", [32, 64])
def test_int4_computes_transformers_forward_with_dequantized_weights(block, hf, tmp_path):
    """int4 at float compute (accuracy level 0) in chunks of 3: the routed query and
    output projections' MatMulNBits and the MLP experts' QMoE (block 32; block 64 is wider
    than an expert's 32 inputs: their unrolled MatMulNBits) are exact up to rounding
    against the dequantized weights."""
    export(hf, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", block, accuracy_level=0)))
    model = load_hf_model(hf)
    dequantized_int4(model, block)
    ids = prompt_ids(20)
    want = hf_logits(model, ids)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 3)
    engine.close()
    np.testing.assert_allclose(np.stack(got), want[[min(s + 2, 19) for s in range(0, 20, 3)]],
                               rtol=1e-3, atol=1e-3)


def test_int8_stays_close_to_transformers(hf, tmp_path):
    """int8 quantizes each projection's input on the fly too: only close to the float
    forward, within a tenth of the largest logit."""
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False,
                                             quant=QuantConfig("int8", embeddings=False)))
    ids = prompt_ids(40)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)[-1]
    engine.close()
    want = hf_logits(load_hf_model(hf), ids)[-1]
    assert np.abs(got - want).max() / np.abs(want).max() < 0.1


# jetmoe/jetmoe-8b's config.json keys, as JetMoeConfig of transformers 4.40 saved them:
# no num_attention_heads or head_dim (the config class derives them), rope_theta at the
# top, rms_norm_eps read by the final norm only.
HUB = {"activation_function": "silu", "architectures": ["JetMoeForCausalLM"],
       "aux_loss_coef": 0.01, "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 2048,
       "initializer_range": 0.01, "intermediate_size": 5632, "kv_channels": 128,
       "max_position_embeddings": 4096, "model_type": "jetmoe", "num_experts_per_tok": 2,
       "num_hidden_layers": 24, "num_key_value_heads": 16, "num_local_experts": 8,
       "output_router_logits": False, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
       "tie_word_embeddings": True, "torch_dtype": "bfloat16",
       "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 32000}


def test_the_hub_config_reads_as_jetmoe_config_builds_the_model():
    cfg = ModelConfig.from_hf(HUB)
    ref = hf_config_of("jetmoe", {k: v for k, v in HUB.items()
                                  if k not in ("model_type", "torch_dtype",
                                               "transformers_version", "architectures")})
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        ref.num_attention_heads, ref.num_key_value_heads, ref.kv_channels) == (32, 16, 128)
    assert cfg.moe is not None
    assert (cfg.moe.experts, cfg.moe.top_k, cfg.moe.width, cfg.moe.routing) == (
        8, 2, 5632, "topk_softmax")
    assert (cfg.norm_eps, cfg.final_norm_eps) == (1e-6, 1e-5)
    assert cfg.tie_embeddings and cfg.activation == "silu" and cfg.num_layers == 24


def test_defaults_read_as_jetmoe_config():
    cfg = ModelConfig.from_hf({"model_type": "jetmoe"})
    ref = hf_config_of("jetmoe", {})
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.vocab_size, cfg.max_positions, cfg.final_norm_eps, cfg.tie_embeddings) == (
        ref.hidden_size, ref.num_hidden_layers, ref.num_attention_heads,
        ref.num_key_value_heads, ref.kv_channels, ref.vocab_size,
        ref.max_position_embeddings, ref.rms_norm_eps, ref.tie_word_embeddings)


def test_a_hub_shaped_checkpoint_exports_as_transformers_reads_it(hf, tmp_path):
    """The fixture's config.json in the Hub's shape (HUB's keys: rope_theta at the top, no
    num_attention_heads, head_dim or rope_parameters), its head tied as the Hub's is:
    the bundle computes transformers' logits."""
    hub = copied(hf, tmp_path / "hub")
    raw = json.loads((hub / "config.json").read_text())
    for key in ("rope_parameters", "dtype", "num_attention_heads", "head_dim",
                "tie_word_embeddings"):
        raw.pop(key, None)
    raw.update({"rope_theta": 500.0, "torch_dtype": "float32",
                "transformers_version": "4.40.0.dev0"})
    (hub / "config.json").write_text(json.dumps(raw))
    weights = load_file(str(hub / "model.safetensors"))
    weights.pop("lm_head.weight")
    save_file(weights, str(hub / "model.safetensors"), metadata={"format": "pt"})
    export(hub, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                              show_progress=False))
    ids = prompt_ids(20, seed=3)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)
    engine.close()
    want = hf_logits(load_hf_model(hub), ids)
    np.testing.assert_allclose(np.stack(got), want[[15, 19]], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keys, message", [
    ({"num_experts_per_tok": 3, "num_local_experts": 2},
     "num_experts_per_tok (3) must be 1 to num_local_experts (2)"),
    ({"num_local_experts": 0}, "num_experts_per_tok (2) must be 1 to num_local_experts (0)"),
    ({"kv_channels": None}, "kv_channels must be a positive integer, got None"),
])
def test_what_jetmoe_config_refuses_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=re.escape(f"jetmoe: {message}")) as info:
        ModelConfig.from_hf({**HUB, **keys})
    assert "\n" not in str(info.value)
