"""LongCat-Flash (families/longcat.py): two MLA sublayers per layer as two decoder and cache
layers, shortcut experts beside them whose router may choose identity experts, the
query and latent LoRA scaling. Its fixture's chunk logits in both flavours also run in
test_exactness; here: a Hub config read as transformers builds the model, padded chunks
of 1, 3 and 16 tokens (decode steps among them), rows of different lengths at once,
quantized bundles, and each new piece breaking the comparison when left out."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import transformers

from edgeprefill.engines import StepBatch
from edgeprefill.errors import ExportError
from edgeprefill.export import decoder, latent_attention, moe
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.families.longcat import stored_layout
from edgeprefill.export.layer_attention import GLOBAL
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine
from tests.conftest import load_hf_model
from tests.state_models import assert_padded_chunks_match
from tests.test_exactness import check_together, prompt_ids, reference_logits
from tests.test_families import last_logits
from tests.test_kda import decoded_logits
from tests.test_mla import dequantized_int4_but_kv_b

FAMILY = "longcat_flash"
# Shaped as meituan-longcat/LongCat-Flash-Chat's config.json (its auto_map left out)
LONGCAT_FLASH_CHAT = {
    "model_type": "longcat_flash", "vocab_size": 131072, "hidden_size": 6144,
    "ffn_hidden_size": 12288, "expert_ffn_hidden_size": 2048, "num_layers": 28,
    "num_attention_heads": 64, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "n_routed_experts": 512, "zero_expert_num": 256, "zero_expert_type": "identity",
    "moe_topk": 12, "routed_scaling_factor": 6.0, "router_bias": False,
    "mla_scale_q_lora": True, "mla_scale_kv_lora": True, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 10000000.0, "attention_bias": False,
    "bos_token_id": 1, "eos_token_id": 2,
}


def test_a_hub_config_reads_as_transformers_builds_the_model():
    ours = ModelConfig.from_hf(LONGCAT_FLASH_CHAT)
    config = transformers.AutoConfig.for_model(**LONGCAT_FLASH_CHAT)
    one_layer = transformers.AutoConfig.for_model(**{**LONGCAT_FLASH_CHAT, "num_layers": 1})
    with torch.device("meta"):  # (its layers alike: the first one built)
        model = transformers.AutoModelForCausalLM.from_config(one_layer).model
    attn, block = model.layers[0].self_attn[0], model.layers[0].mlp
    rotary = type(model.rotary_emb)(config)
    np.testing.assert_allclose(ours.ropes[GLOBAL].inv_freq(), rotary.inv_freq.numpy(),
                               rtol=1e-6)
    # one decoder and cache layer per attention: transformers' cache layers
    assert ours.num_layers == config.num_hidden_layers == 2 * config.num_layers == 56
    assert ours.kv_layers == tuple(range(56))
    s = ours.latent
    assert s is not None
    assert (s.q_lora_rank, s.kv_lora_rank, s.nope_dim, s.rope_dim, s.v_dim) == (
        attn.q_lora_rank, attn.kv_lora_rank, attn.qk_nope_head_dim, attn.qk_rope_head_dim,
        attn.v_head_dim)
    assert (s.q_scale, s.latent_scale) == pytest.approx(
        (attn.mla_scale_q_lora, attn.mla_scale_kv_lora), rel=1e-12)
    assert ours.attn_scale == pytest.approx(attn.scaling, rel=1e-12)
    assert ours.intermediate_size == model.layers[0].mlps[0].intermediate_size
    m = ours.moe
    assert m is not None and m.layers == tuple(range(0, 56, 2))
    assert (m.experts, m.zero_experts, m.choices, m.top_k, m.width, m.scaling) == (
        block.experts.num_routed_experts, block.experts.zero_expert_num,
        block.router.n_routed_experts, block.router.top_k, block.intermediate_size,
        block.router.routed_scaling_factor)
    assert (m.routing, m.norm_topk, m.expert_bias) == ("softmax_bias", False, True)


def test_the_hub_names_read_as_each_sublayers_own():
    assert stored_layout("model.layers.3.self_attn.1.kv_b_proj.weight") == \
        "model.layers.7.self_attn.kv_b_proj.weight"
    assert stored_layout("model.layers.3.input_layernorm.0.weight") == \
        "model.layers.6.input_layernorm.weight"
    assert stored_layout("model.layers.3.post_attention_layernorm.1.weight") == \
        "model.layers.7.post_attention_layernorm.weight"
    assert stored_layout("model.layers.3.mlps.1.down_proj.weight") == \
        "model.layers.7.mlp.down_proj.weight"
    assert stored_layout("model.layers.3.mlp.experts.5.up_proj.weight") == \
        "model.layers.6.moe.experts.5.up_proj.weight"
    assert stored_layout("model.layers.3.mlp.router.e_score_correction_bias") == \
        "model.layers.6.moe.router.e_score_correction_bias"
    assert stored_layout("model.norm.weight") == "model.norm.weight"


@pytest.mark.parametrize("keys, message", [
    ({"router_bias": True}, "router_bias (a router classifier bias) is not supported"),
    ({"zero_expert_type": "zero"}, "zero_expert_type 'zero' is not supported; supported: "
                                   "identity"),
    ({"mla_scale_kv_lora": False}, "mla_scale_kv_lora false is not supported "
                                   "(transformers always scales)"),
    ({"head_dim": 32}, "head_dim 32 must be qk_rope_head_dim (64), the dims the attention "
                       "rotates"),
])
def test_a_longcat_option_export_does_not_compute_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf({**LONGCAT_FLASH_CHAT, **keys})
    assert str(err.value) == f"longcat_flash: {message}"


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_padded_chunks_and_decode_steps_match_transformers(flavor, hf_model, bundle):
    """Calls of 1 (decode steps on the carried cache), 3 and 16 tokens, the last before
    the split padded with junk: every call's logits as transformers computes them."""
    assert_padded_chunks_match(hf_model(FAMILY), bundle(FAMILY, flavor), chunks=(1, 3, 16))


@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_rows_of_different_lengths_in_one_call_match_transformers(flavor, hf_model, bundle):
    """Three prompts of 5, 16 and 11 tokens prefilled in one padded call, then a decode
    step of all three in one call: each row's logits as transformers' for its prompt."""
    hf_dir = hf_model(FAMILY)
    prompts = [prompt_ids(n + 1, seed=n) for n in (5, 16, 11)]
    expected = [reference_logits(hf_dir, ids) for ids in prompts]
    lengths = np.array([len(ids) - 1 for ids in prompts], np.int32)
    padded = np.full((3, 16), 77, np.int64)
    for row, ids in enumerate(prompts):
        padded[row, : len(ids) - 1] = ids[:-1]
    with Engine.load(bundle(FAMILY, flavor), threads=2, background=False) as engine:
        run = engine.backend.run
        prefill = run(StepBatch(padded, np.zeros(3, np.int32), lengths, 0)).copy()
        last = np.array([[ids[-1]] for ids in prompts], np.int64)
        decode = run(StepBatch(last, lengths, np.ones(3, np.int32), 0)).copy()
    for row, want in enumerate(expected):
        np.testing.assert_allclose(prefill[row], want[-2], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(decode[row], want[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_rows_of_different_lengths_generate_transformers_greedy_text(flavor, hf_model,
                                                                      bundle):
    with Engine.load(bundle(FAMILY, flavor), threads=2) as engine:
        check_together(engine, hf_model(FAMILY), 8)


def test_the_ort_flavour_runs_the_experts_as_the_moe_op(hf_model, bundle):
    """The identity experts go beside ONNX Runtime's MoE op (export/moe_op.py), which runs
    the real ones a token chose: one op per layer with experts, none unrolled (the tests
    above check its logits, on tokens routed to both kinds)."""
    cfg = ModelConfig.from_dir(hf_model(FAMILY))
    graph = onnx.load(str(bundle(FAMILY, "ort") / "model.onnx"), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("MoE") == len(cfg.moe.layers) > 0
    assert "ScatterND" not in ops  # the unrolled dispatch's


@pytest.mark.slow
def test_int4_equals_transformers_with_the_dequantized_projections(hf_model, tmp_path):
    """Every projection int4 as the bundle stores it, but kv_b_proj (folded into W_UK and
    W_UV, kept float) and the router (float)."""
    hf_dir = hf_model(FAMILY)
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", accuracy_level=0)))
    model = load_hf_model(hf_dir)
    dequantized_int4_but_kv_b(model, keep=("router.",))
    ids = prompt_ids(20)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(last_logits(tmp_path / "b", ids), expected, rtol=1e-3,
                               atol=1e-3)


@pytest.mark.slow
def test_the_int8_bundle_drifts_as_the_other_routed_fixtures_do(hf_model, bundle, tmp_path):
    """int8 quantizes each projection's input on the fly too, so no float reference
    computes it: against the fp32 bundle, token by token over 40 positions, the median of
    each position's drift (of its largest logit), test_kda's measure and bound (an expert
    choice that flips moves a position's logits a lot; measured here: median 0.066, max
    0.18)."""
    export(hf_model(FAMILY), tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    ids = prompt_ids(40)
    reference = decoded_logits(bundle(FAMILY), ids)
    drift = np.abs(decoded_logits(tmp_path / "b", ids) - reference).max(-1) / \
        np.abs(reference).max(-1)
    assert np.median(drift) < 0.15


def _no_identity_experts(self, x, chosen, weights):
    return self.g.op("Sub", [x, x])


def _experts_in_the_first_sublayer(self, i, x, delta, step, rows):
    """The shortcut block with the experts' output added to the first sublayer's MLP."""
    n = self.names
    p = n.layer.format(i=i)
    x, h = self._add_norm(x, delta, p + n.input_norm)
    attn = self._attention(i, h, step, rows)
    x, h = self._add_norm(rows(x), attn, p + n.post_attn_norm)
    mlp = self._dense_mlp(p, h)
    if i % 2 == 0:
        return x, self.g.op("Add", [mlp, self.experts.block(p, h)])
    return x, mlp


BREAKS = {
    "identity experts": (moe.MixtureOfExperts, "_identity", _no_identity_experts),
    "LoRA scaling": (latent_attention, "_lora_scales", lambda raw, shape: {}),
    "shortcut": (decoder.DecoderBuilder, "_shortcut_layer", _experts_in_the_first_sublayer),
    "selection bias": (moe.MixtureOfExperts, "_has_expert_bias", lambda self, p: False),
}


@pytest.mark.parametrize("piece", sorted(BREAKS))
def test_each_piece_left_out_moves_the_logits_off_transformers(piece, hf_model, tmp_path,
                                                               monkeypatch):
    """The fixture needs each piece: without it the bundle's logits leave transformers'
    (with it they match within 1e-4: test_exactness, the tests above)."""
    hf_dir = hf_model(FAMILY)
    monkeypatch.setattr(*BREAKS[piece])
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 flavor="standard", show_progress=False))
    ids = prompt_ids(20)
    assert np.abs(last_logits(tmp_path / "b", ids) - reference_logits(hf_dir, ids)[-1]).max() \
        > 1e-2


def test_the_fixture_routes_tokens_to_identity_experts(hf_model):
    """What the identity experts' test above rests on: transformers' routers choose them."""
    model = load_hf_model(hf_model(FAMILY))
    chosen = []
    for layer in model.model.layers:
        layer.mlp.router.register_forward_hook(lambda m, i, out: chosen.append(out[2]))
    with torch.no_grad():
        model(torch.tensor([prompt_ids(20)]))
    picks = torch.cat([c.flatten() for c in chosen])
    real = model.config.n_routed_experts
    assert (picks >= real).any() and (picks < real).any()


def test_the_identity_experts_stored_projections_are_left_out_quietly(hf_model, tmp_path,
                                                                      caplog):
    """transformers saves a gate and up projection for each identity expert too (its
    gate_up_proj counts them), which nothing reads: no unused-tensor warning names them."""
    hf_dir = hf_model(FAMILY)
    from safetensors import safe_open

    with safe_open(str(hf_dir / "model.safetensors"), "np") as f:
        assert "model.layers.0.mlp.experts.5.up_proj.weight" in f.keys()
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                                 flavor="standard", show_progress=False))
    assert not [r for r in caplog.records if "does not use" in r.getMessage()]
