"""MiniMax (minimax: MiniMax-Text-01, MiniMax-M1): lightning attention layers (linear
attention with a fixed decay per head, one float32 state each; export/lightning.py) beside
softmax attention layers, Mixtral's experts, and residual adds on the normed stream scaled
per layer type. The fixture (conftest.FAMILIES "minimax": softmax, lightning, lightning,
softmax; block_size 8, so transformers' prompt blocks cross inside a 40-token prompt) also
runs in test_exactness.py, test_families.py and test_state_runtime.py (rows of different
lengths in one call, slot copies, turns, snapshots)."""

from __future__ import annotations

import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.lightning import slopes
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from tests.conftest import build_hf_model, load_hf_model
from tests.state_models import GRAPHS, assert_padded_chunks_match, variant_bundles
from tests.test_exactness import prompt_ids, reference_logits
from tests.test_kda import decoded_logits
from tests.test_mla import check_int4_dequantized_but_kv_b

LIGHTNING = (1, 2)  # the fixture's lightning layers
# Shaped as MiniMaxAI/MiniMax-Text-01-hf's config.json as we know it (the Hub was not
# reachable here): 80 layers, every 8th softmax attention, DeepNorm-like residual factors
# (alpha (2 x 80)^(1/4)), 32 experts, rotary_dim 64 of each 128-wide head (which
# transformers' MiniMax ignores: its default rope rotates the whole head).
ALPHA = 3.5565588200778455
HUB_TEXT_01 = {
    "architectures": ["MiniMaxForCausalLM"], "model_type": "minimax", "vocab_size": 200064,
    "hidden_size": 6144, "intermediate_size": 9216, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "rotary_dim": 64,
    "hidden_act": "silu", "max_position_embeddings": 10240000, "rms_norm_eps": 1e-5,
    "rope_theta": 10000000, "num_local_experts": 32, "num_experts_per_tok": 2,
    "block_size": 256, "sliding_window": None, "tie_word_embeddings": False,
    "bos_token_id": 200034, "eos_token_id": 200020,
    "layer_types": ["full_attention" if (i + 1) % 8 == 0 else "linear_attention"
                    for i in range(80)],
    "full_attn_alpha_factor": ALPHA, "full_attn_beta_factor": 1.0,
    "linear_attn_alpha_factor": ALPHA, "linear_attn_beta_factor": 1.0,
    "mlp_alpha_factor": ALPHA, "mlp_beta_factor": 1.0,
}


@pytest.mark.parametrize("flavor, kernels", GRAPHS)
def test_logits_equal_transformers_for_any_chunk_with_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    """Every call's last-token logits equal transformers' (its block-wise prompt form) at
    that position, for chunks of 1 to 40 tokens, the last chunk padded: its padding must
    leave the lightning states as they were at the row's last valid token."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model("minimax"), bundle("minimax", flavor))


def test_decode_token_by_token_equals_transformers(hf_model, bundle):
    """One token a call, 40 calls: the state each writes is what the next reads."""
    ids = prompt_ids(40)
    np.testing.assert_allclose(decoded_logits(bundle("minimax"), ids),
                               reference_logits(hf_model("minimax"), ids),
                               rtol=1e-4, atol=1e-4)


def run_graph(session, ids: list[int], start: int, feeds: dict[str, np.ndarray]
              ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One call of the graph on one row: its logits and every present output (KV and
    states), keyed by its past name."""
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(names, {
        "input_ids": np.array([ids], np.int64), "past_lens": np.array([start], np.int32),
        "valid_lens": np.array([len(ids)], np.int32), **feeds}), strict=True))
    return out["logits"][0], {name.replace("present_", "past_"): value
                              for name, value in out.items() if name.startswith("present_")}


def test_the_lightning_state_carries_what_the_next_call_needs(hf_model, bundle):
    """The graph alone, a prompt in two calls: with the first call's states the second's
    logits are transformers'; with the lightning states read as zeros instead (the KV of
    the softmax layers kept) they are not. A runtime that dropped them between calls would
    compute another model."""
    ids = prompt_ids(20)
    expected = reference_logits(hf_model("minimax"), ids)[-1]
    session = ort.InferenceSession(str(bundle("minimax", "standard") / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    zeros = {i.name: np.zeros([1, *(d if isinstance(d, int) else 128 for d in i.shape[1:])],
                              np.float32)  # (the KV's capacity: the bundle's 128)
             for i in session.get_inputs() if i.name.startswith(("past_key", "past_value",
                                                                 "past_recurrent"))}
    assert sorted(n for n in zeros if n.startswith("past_recurrent.")) == \
        [f"past_recurrent.{i}" for i in LIGHTNING]
    _, carried = run_graph(session, ids[:12], 0, zeros)
    logits, _ = run_graph(session, ids[12:], 12, carried)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    dropped = {name: np.zeros_like(value) if name.startswith("past_recurrent.") else value
               for name, value in carried.items()}
    logits, _ = run_graph(session, ids[12:], 12, dropped)
    assert np.abs(logits - expected).max() > 1e-2


@pytest.mark.parametrize("part", ("decay", "factors", "gate"))
def test_each_piece_of_the_layer_moves_transformers_logits(part, hf_model):
    """What the logits tests rest on: the fixture's decays, its residual factors and the
    lightning output gate each move transformers' logits, so a bundle leaving one out
    would fail them."""
    model = load_hf_model(hf_model("minimax"))
    ids = torch.tensor([prompt_ids(40)])
    with torch.no_grad():
        expected = model(ids).logits
        for layer in model.model.layers:
            attn = layer.self_attn
            if part == "factors":
                layer.attn_alpha_factor = layer.attn_beta_factor = 1.0
                layer.mlp_alpha_factor = layer.mlp_beta_factor = 1.0
            elif part == "decay" and layer.block_type == "linear_attention":
                attn.slope_rate.zero_()  # no decay: every block's factors 1
                attn.query_decay.fill_(1.0)
                attn.key_decay.fill_(1.0)
                attn.diagonal_decay.copy_((attn.diagonal_decay > 0).float())
            elif part == "gate" and layer.block_type == "linear_attention":
                attn.output_gate.weight.zero_()  # sigmoid 1/2 everywhere
        changed = model(ids).logits
    assert (expected - changed).abs().max() > 1e-2


def test_the_checkpoints_slopes_are_read_where_it_stores_them(tmp_path):
    """transformers loads slope_rate from the checkpoint (its prompt's block decays too):
    a checkpoint whose slopes are not the computed ones exports as transformers runs it,
    chunked and decoded alike."""
    hf = build_hf_model("minimax", tmp_path / "hf")
    tensors = load_file(hf / "model.safetensors")
    for layer in LIGHTNING:
        p = f"model.layers.{layer}.self_attn."
        rate = (tensors[p + "slope_rate"] * 3.0).astype(np.float32)
        assert np.allclose(tensors[p + "slope_rate"].reshape(-1), slopes(4, layer, 4))
        tensors[p + "slope_rate"] = rate
        block = np.arange(1, 9, dtype=np.float32)[:, None]  # block_size 8
        tensors[p + "query_decay"] = np.exp(-rate * block)
        tensors[p + "key_decay"] = np.exp(-rate * (8 - block))
        gap = rate * (block - block.T)
        tensors[p + "diagonal_decay"] = np.exp(np.where(gap >= 0, -gap, -np.inf))[None]
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                             show_progress=False))
    assert_padded_chunks_match(hf, tmp_path / "b", chunks=(3, 16))


def test_a_sliding_window_slides_the_softmax_layers_as_transformers(tmp_path_factory):
    """With sliding_window 6 transformers masks every full_attention layer to a window;
    the lightning layers, which have none, read their whole past through their state."""
    get = variant_bundles(tmp_path_factory, "minimax", "minimax-window",
                          {"sliding_window": 6})
    hf, path = get("ort")
    assert_padded_chunks_match(hf, path, chunks=(3, 16))


def test_int4_equals_transformers_with_the_dequantized_projections(hf_model, tmp_path):
    """Every projection of the int4 bundle (the lightning q/k/v, gate and output ones and
    the experts; the router stays float) computes with its dequantized weights."""
    check_int4_dequantized_but_kv_b(hf_model("minimax"), tmp_path)


def test_the_int8_bundle_drifts_as_the_other_routed_hybrids_do(hf_model, bundle, tmp_path):
    """The default int8 bundle against the fp32 one, token by token over 40 positions: the
    median of each position's drift of its largest logit (test_kda.py's yardstick, on a
    looser bound: this fixture's unscaled lightning q.k amplify rounding; measured 0.196,
    and transformers itself on its int8-rounded weights alone drifts 0.157)."""
    export(hf_model("minimax"), tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False, quant=QuantConfig("int8")))
    ids = prompt_ids(40)
    reference = decoded_logits(bundle("minimax"), ids)
    got = decoded_logits(tmp_path / "b", ids)
    drift = np.abs(got - reference).max(-1) / np.abs(reference).max(-1)
    assert np.median(drift) < 0.25


def test_a_hub_config_reads_as_transformers_reads_it():
    ours = ModelConfig.from_hf(HUB_TEXT_01)
    hf = transformers.MiniMaxConfig(**{k: v for k, v in HUB_TEXT_01.items()
                                       if k != "rotary_dim"})
    assert list(ours.lightning_layers) == [
        i for i, kind in enumerate(hf.layer_types) if kind == "linear_attention"]
    assert list(ours.kv_layers) == [7 + 8 * i for i in range(10)]
    f = ours.residual_factors
    assert f is not None and (f.full, f.linear, f.mlp) == (
        (hf.full_attn_alpha_factor, hf.full_attn_beta_factor),
        (hf.linear_attn_alpha_factor, hf.linear_attn_beta_factor),
        (hf.mlp_alpha_factor, hf.mlp_beta_factor))
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim, ours.rotary_dim) == (
        hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.head_dim)
    moe = ours.moe
    assert moe is not None and (moe.experts, moe.top_k) == (
        hf.num_local_experts, hf.num_experts_per_tok)
    assert ours.max_positions == hf.max_position_embeddings
    assert all(layer.window is None for layer in ours.layers)


def test_the_remote_codes_keys_read_as_the_converted_ones():
    """MiniMax-Text-01's own config (its remote code's attn_type_list, 0 lightning, and
    layernorm_* factors) reads as the layer_types and factors transformers' conversion
    writes; without either, MiniMaxConfig's default alternation (softmax first)."""
    factors = {k: v for k, v in HUB_TEXT_01.items() if k.endswith("_factor")}
    remote = {k: v for k, v in HUB_TEXT_01.items() if k != "layer_types" and k not in factors}
    remote["attn_type_list"] = [int(kind == "full_attention")
                                for kind in HUB_TEXT_01["layer_types"]]
    remote |= {"layernorm_full_attention_alpha": ALPHA, "layernorm_full_attention_beta": 1.0,
               "layernorm_linear_attention_alpha": ALPHA,
               "layernorm_linear_attention_beta": 1.0, "layernorm_mlp_alpha": ALPHA,
               "layernorm_mlp_beta": 1.0}
    ours, hub = ModelConfig.from_hf(remote), ModelConfig.from_hf(HUB_TEXT_01)
    assert (ours.lightning_layers, ours.residual_factors) == \
        (hub.lightning_layers, hub.residual_factors)
    plain = {k: v for k, v in remote.items() if k != "attn_type_list"}
    assert list(ModelConfig.from_hf(plain).lightning_layers) == [
        i for i, kind in enumerate(transformers.MiniMaxConfig(num_hidden_layers=80).layer_types)
        if kind == "linear_attention"]


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported: the lightning layers"),
    ({"layer_types": ["mamba"] * 80}, r"layer_types \['mamba'\] are not supported"),
    ({"layer_types": ["linear_attention"] * 80}, "without a full_attention layer"),
    ({"layer_types": ["sliding_attention"] * 80}, r"layer_types \['sliding_attention'\]"),
])
def test_a_config_the_export_cannot_honour_is_refused_in_one_line(change, message):
    with pytest.raises(ExportError, match=message) as err:
        ModelConfig.from_hf({**HUB_TEXT_01, **change})
    assert "\n" not in str(err.value)


def test_a_checkpoint_disagreeing_with_its_lightning_widths_is_one_line(hf_model, tmp_path):
    hf = shutil.copytree(hf_model("minimax"), tmp_path / "hf")
    tensors = load_file(hf / "model.safetensors")
    name = "model.layers.1.self_attn.qkv_proj.weight"
    tensors[name] = tensors[name][:96].copy()
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ExportError, match=r"qkv_proj.weight has shape \(96, 64\).*\(192, 64\)"
                       ) as err:
        export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=128,
                                                 show_progress=False))
    assert "\n" not in str(err.value)
