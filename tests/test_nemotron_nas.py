"""NVIDIA's Llama-Nemotron NAS models (`model_type: nemotron-nas`, remote code
modeling_decilm.py; transformers has no class for it): Llama whose layers are each a NAS
block of their own (`block_configs`): attention with num_attention_heads // n_heads_in_group
KV heads, one linear layer (`self_attn.linear_attn`) or none, then a SwiGLU MLP of
round-up-to-256(int(2 * ffn_mult * hidden / 3)), one linear layer (`mlp.linear_mlp`) or
none; a sublayer left out has no norm either.

The reference is transformers' Llama whose decoder layers the test replaces by blocks
built from its own pieces as DeciLMDecoderLayer builds them (LlamaAttention of the block's
KV heads, LlamaMLP of the block's width, LlamaRMSNorm; a bias-free Linear for a linear
sublayer), so the weights are saved under the remote code's names. The fixture's seven
layers hold every one of the six sublayer kinds, the last layer's attention left out (so
the stream's pending output reaches the LM head through it); its rope is Super's llama3
(the scaling moves this fixture's frequencies); its norms' weights are random, so a norm
read where the block has none, or skipped where it has one, changes the logits."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from edgeprefill.bundle import load_manifest
from edgeprefill.engines.base import kv_slot_bytes
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.model_quirks import model_quirks
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import VOCAB, write_tokenizer
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_deci import one_thread
from tests.test_embed import assert_edits_refused
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_openelm import check_chunks_and_padding, check_rows_decode_together
from tests.test_quantize import dequantize_linears, logits_at

DIM, HEADS, HEAD_DIM, MAX_POSITIONS = 64, 4, 16, 128
ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}
SINKS = {"num_sink_tokens": None, "sparsify": None, "unshifted_sink": False,
         "use_prefill_window_in_sink_attention": False, "window_length": None}


def attention(kind: str | int) -> dict:
    """A block's attention entry as the Hub's configs write it: "none", "linear" or its
    n_heads_in_group."""
    group = kind if isinstance(kind, int) else None
    return {"n_heads_in_group": group, "no_op": kind == "none",
            "replace_with_linear": kind == "linear", **SINKS}


def ffn(kind: str | float) -> dict:
    mult = kind if isinstance(kind, float) else None
    return {"ffn_mult": mult, "no_op": kind == "none", "replace_with_linear": kind == "linear",
            "sparsify": None}


# (attention, ffn) per layer: KV heads 2, 1 and 4 (groups 2, 4 and 1); MLP widths 256, 512
# (int(2 * mult * 64 / 3) = 64 and 384, rounded up to multiples of 256)
WIDTHS = {1.5: 256, 9.0: 512}
BLOCKS = [(2, 1.5), ("none", 9.0), ("linear", "linear"), (4, "none"), ("none", "none"),
          (1, 1.5), ("none", 9.0)]
BLOCK_CONFIGS = [{"attention": attention(a), "ffn": ffn(f)} for a, f in BLOCKS]
NO_ATTENTION = [1, 2, 4, 6]
# Llama-3_3-Nemotron-Super-49B-v1's config.json keys, shrunk.
CONFIG = {
    "architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas",
    "auto_map": {"AutoConfig": "configuration_decilm.DeciLMConfig",
                 "AutoModelForCausalLM": "modeling_decilm.DeciLMForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "block_configs": BLOCK_CONFIGS,
    "bos_token_id": 1, "eos_token_id": [2], "hidden_act": "silu", "hidden_size": DIM,
    "initializer_range": 0.02, "intermediate_size": None,
    "max_position_embeddings": MAX_POSITIONS, "mlp_bias": False, "num_attention_heads": HEADS,
    "num_hidden_layers": len(BLOCKS), "num_key_value_heads": None, "pretraining_tp": 1,
    "rms_norm_eps": 1e-5, "rope_scaling": ROPE, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "vocab_size": VOCAB,
}


class Linear(torch.nn.Module):
    """DeciLMLinearAttention / DeciLMLinearMLP: one bias-free Linear under `name`."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        setattr(self, name, torch.nn.Linear(DIM, DIM, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.name)(x)


def _with(config, **sizes):
    """A copy of the model's config (its attention implementation too) with `sizes`."""
    own = copy.deepcopy(config)
    for key, value in sizes.items():
        setattr(own, key, value)
    return own


class NasBlock(torch.nn.Module):
    """DeciLMDecoderLayer of one block, from transformers' Llama pieces."""

    def __init__(self, config, i: int, attn: str | int, mlp: str | float) -> None:
        from transformers.models.llama.modeling_llama import (
            LlamaAttention,
            LlamaMLP,
            LlamaRMSNorm,
        )

        super().__init__()
        self.attn, self.ffn = attn, mlp
        if attn != "none":
            self.input_layernorm = LlamaRMSNorm(DIM, eps=1e-5)
            if attn == "linear":
                self.self_attn = Linear("linear_attn")
            else:
                self.self_attn = LlamaAttention(_with(config, num_key_value_heads=HEADS // attn),
                                                i)
        if mlp != "none":
            self.post_attention_layernorm = LlamaRMSNorm(DIM, eps=1e-5)
            if mlp == "linear":
                self.mlp = Linear("linear_mlp")
            else:
                self.mlp = LlamaMLP(_with(config, intermediate_size=WIDTHS[mlp]))

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, **_):
        x = hidden_states
        if self.attn == "linear":
            x = x + self.self_attn(self.input_layernorm(x))
        elif self.attn != "none":
            x = x + self.self_attn(self.input_layernorm(x), attention_mask=attention_mask,
                                   position_embeddings=position_embeddings)[0]
        if self.ffn != "none":
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x


def reference_model(seed: int = 0, bias: bool = False, blocks=tuple(BLOCKS)):
    """transformers' Llama whose layers are the fixture's NAS blocks, every weight random
    (the norms' far from 1); `bias`: attention_bias and mlp_bias on (q, k, v, o and the
    MLP's projections, as the remote code's Llama builds them; not the linear sublayers);
    `blocks`: (attention, ffn) per layer, as BLOCKS."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=DIM, intermediate_size=256, num_hidden_layers=len(blocks),
        num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={**ROPE, "rope_theta": 10000.0}, attention_bias=bias, mlp_bias=bias)
    model = LlamaForCausalLM(config).eval()
    model.model.layers = torch.nn.ModuleList(
        NasBlock(config, i, a, f) for i, (a, f) in enumerate(blocks))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + torch.randn_like(param) * 0.2)
            else:
                param.normal_(0, 0.2)
    return model


def reference_logits(model, ids: list[int]) -> np.ndarray:
    """The model's logits [len(ids), vocab], every position."""
    with one_thread():
        return model(torch.tensor([ids]), use_cache=False).logits[0].numpy()


def nas_checkpoint(root: Path, model, **config) -> Path:
    """The model's weights under the remote code's names beside the config.json."""
    hf = root / "nemotron-nas"
    hf.mkdir(parents=True)
    save_file({name: t.contiguous() for name, t in model.state_dict().items()},
              hf / "model.safetensors")
    (hf / "config.json").write_text(json.dumps({**CONFIG, **config}))
    write_tokenizer(hf)
    return hf


@pytest.fixture(scope="module")
def nas(tmp_path_factory):
    """(reference model, {flavour: bundle})."""
    root = tmp_path_factory.mktemp("nas")
    model = reference_model()
    hf = nas_checkpoint(root, model)
    bundles = {}
    for flavor in FLAVORS:
        bundles[flavor] = root / flavor
        export(hf, bundles[flavor], ExportOptions(chunks=(1, 3, 16), max_context=64,
                                                  flavor=flavor, show_progress=False))
    return model, bundles


def test_the_reference_holds_the_remote_codes_tensor_names():
    """What the test saves is what a Nemotron checkpoint stores: the linear sublayers'
    single weights, no norm of a sublayer left out, each MLP of its block's width."""
    names = reference_model().state_dict()
    assert names["model.layers.2.self_attn.linear_attn.weight"].shape == (DIM, DIM)
    assert names["model.layers.2.mlp.linear_mlp.weight"].shape == (DIM, DIM)
    assert "model.layers.1.input_layernorm.weight" not in names
    assert "model.layers.3.post_attention_layernorm.weight" not in names
    assert names["model.layers.1.mlp.up_proj.weight"].shape == (512, DIM)
    assert names["model.layers.3.self_attn.k_proj.weight"].shape == (HEAD_DIM, DIM)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunks_of_1_3_and_16_and_a_padded_one_are_the_blocks_forward(nas, flavor):
    model, bundles = nas
    ids = prompt_ids(40)
    check_chunks_and_padding(bundles[flavor], ids, reference_logits(model, ids))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_different_lengths_decode_together_as_the_blocks_forward(nas, flavor):
    """Three rows in adjacent slots, prompts of 5, 19 and 33 tokens, then decode steps of
    all three in one call each: every row's logits are the forward's at its position."""
    model, bundles = nas
    check_rows_decode_together(bundles[flavor], lambda ids: reference_logits(model, ids)[-1], 3)


def test_the_sdk_generates_the_blocks_greedy_tokens(nas):
    model, bundles = nas
    want = prompt_ids(9)
    prompt = list(want)
    for _ in range(6):  # greedy, each step the whole forward again
        want.append(int(reference_logits(model, want)[-1].argmax()))
    with Engine.load(bundles["ort"], threads=2, background=False) as engine:
        got = engine.generate(prompt, GenerationParams(max_new_tokens=6, ignore_eos=True))
        assert got.result().token_ids == want[len(prompt):]


def test_layers_without_attention_hold_no_kv_in_graph_manifest_or_cache(nas):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli as edgeprefill

    manifest = load_manifest(nas[1]["ort"])
    model = manifest.model
    assert model.attention_free_layers == NO_ATTENTION
    assert (model.num_heads, model.num_kv_heads, model.head_dim) == (HEADS, 2, HEAD_DIM)
    assert [pair[0] for pair in manifest.graph.kv_inputs] == [
        "past_key.0", "past_key.3", "past_key.5"]
    assert not any(f"past_key.{i}" in manifest.graph.inputs for i in NO_ATTENTION)
    assert [model.kv_dims(i) for i in (0, 3, 5)] == [(2, HEAD_DIM), (1, HEAD_DIM),
                                                     (4, HEAD_DIM)]
    # a slot's cache: keys and values of 2 + 1 + 4 heads of 16, per position, float32
    assert kv_slot_bytes(model, 64, "float32") == 2 * (2 + 1 + 4) * HEAD_DIM * 64 * 4
    out = CliRunner().invoke(edgeprefill, ["inspect", str(nas[1]["ort"])]).output
    assert f"4 heads / 1-4 KV heads of {HEAD_DIM}, by layer" in out
    assert "attention   none in layers 1, 2, 4, 6" in out
    assert "NAS blocks of 7 layers (attention 3 left out, 1 a linear layer; FFN 2 left " \
        "out, 1 a linear layer; MLP widths 256-512)" in out


def test_an_edited_list_of_attention_free_layers_is_refused(nas, tmp_path):
    def edit(free):
        return lambda raw: raw["model"].update(attention_free_layers=free)

    assert_edits_refused(nas[1]["ort"], tmp_path, (
        (lambda raw: raw["model"].pop("attention_free_layers"), "pair per layer with KV"),
        (edit([1, 2, 4]), "pair per layer with KV"),
        (edit([2, 1, 4, 6]), "attention_free_layers .* distinct layers in ascending"),
        (edit([1, 2, 4, 7]), "attention_free_layers .* distinct layers in ascending"),
    ))


# A config.json of the Hub's nemotron-nas releases (hidden 16384 and 128 heads, as
# Llama-3_1-Nemotron-Ultra-253B-v1's), cut to its first 12 blocks.
FULL_8 = {"attention": attention(8), "ffn": ffn(5.25)}
HUB_BLOCKS = [{"attention": attention(8), "ffn": ffn(2.625)}, *[FULL_8] * 5,
              {"attention": attention("none"), "ffn": ffn(2.625)},
              {"attention": attention("none"), "ffn": ffn(2.625)}, *[FULL_8] * 3,
              {"attention": attention("none"), "ffn": ffn(3.28125)}]
HUB = {**CONFIG, "hidden_size": 16384, "num_attention_heads": 128, "num_hidden_layers": 12,
       "block_configs": HUB_BLOCKS, "max_position_embeddings": 131072, "vocab_size": 128256,
       "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
       "rope_theta": 500000.0, "rope_scaling": {"factor": 16.0, "high_freq_factor": 4.0,
                                                "low_freq_factor": 1.0,
                                                "original_max_position_embeddings": 8192,
                                                "rope_type": "llama3"}}


def test_a_hub_config_reads_as_its_remote_code_builds_it():
    cfg = ModelConfig.from_hf(HUB)
    assert cfg.attention_free_layers == (6, 7, 11)
    assert cfg.kv_layers == (0, 1, 2, 3, 4, 5, 8, 9, 10)
    assert {cfg.layer_kv_heads(i) for i in cfg.kv_layers} == {16}
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.norm_eps, cfg.eos_token_ids) == (
        128, 16, 1e-5, (128001, 128008, 128009))
    assert cfg.nas is not None
    assert cfg.nas.widths == (28672, *[57344] * 5, 28672, 28672, *[57344] * 3, 35840)
    assert cfg.intermediate_size == 57344
    rope = cfg.ropes["global"]
    assert (rope.kind, rope.factor, rope.theta) == ("llama3", 16.0, 500000.0)
    assert not (cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias)
    assert "NAS blocks of 12 layers (attention 3 left out; MLP widths 28672-57344)" in \
        model_quirks(cfg)


def test_a_last_layer_of_linear_sublayers_reads_each_rows_last_token(tmp_path):
    """The last layer's sublayers run on each row's last valid token only: its linear
    attention too, after its norm of the whole chunk."""
    blocks = ((2, 1.5), ("linear", "linear"))
    model = reference_model(blocks=blocks)
    hf = nas_checkpoint(tmp_path, model, num_hidden_layers=2, block_configs=[
        {"attention": attention(a), "ffn": ffn(f)} for a, f in blocks])
    export(hf, tmp_path / "b", ExportOptions(chunks=(1, 3, 16), max_context=64,
                                             show_progress=False))
    ids = prompt_ids(40)
    check_chunks_and_padding(tmp_path / "b", ids, reference_logits(model, ids))


def test_attention_and_mlp_biases_where_the_config_switches_them_on(tmp_path):
    model = reference_model(bias=True)
    assert model.state_dict()["model.layers.0.self_attn.o_proj.bias"].abs().sum() > 0
    hf = nas_checkpoint(tmp_path, model, attention_bias=True, mlp_bias=True)
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False))
    ids = prompt_ids(12)
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), reference_logits(model, ids)[-1],
                               rtol=1e-4, atol=1e-4)


def test_int4_computes_the_blocks_forward_with_dequantized_weights(tmp_path):
    """Every projection, the linear sublayers' included, quantized by blocks: the bundle
    computes exactly what the reference does with those weights dequantized."""
    model = reference_model()
    hf = nas_checkpoint(tmp_path, model)
    export(hf, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0, embeddings=False)))
    with torch.no_grad():
        dequantize_linears(model)  # every projection and the LM head
    ids = prompt_ids(12)
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), reference_logits(model, ids)[-1],
                               rtol=1e-3, atol=1e-3)


def test_int8_stays_close_to_the_blocks_forward(tmp_path):
    """int8 quantizes each projection's input on the fly too (DynamicQuantizeMatMul), so
    the forward is only close. A linear sublayer read as its block's other kind, or a norm
    misplaced, moves the logits by their size."""
    model = reference_model()
    hf = nas_checkpoint(tmp_path, model)
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False,
                                             quant=QuantConfig("int8", embeddings=False)))
    ids = prompt_ids(12)
    want = reference_logits(model, ids)[-1]
    assert np.abs(logits_at(tmp_path / "b", ids) - want).max() / np.abs(want).max() < 0.1


def _block(i: int, part: str, **change) -> list[dict]:
    blocks = json.loads(json.dumps(BLOCK_CONFIGS))
    blocks[i][part].update(change)
    return blocks


@pytest.mark.parametrize(("change", "message"), [
    ({"block_configs": None}, "block_configs must list an object for each of the 7 layers"),
    ({"block_configs": BLOCK_CONFIGS[:6]}, "block_configs must list an object for each"),
    ({"block_configs": _block(0, "attention", window_length=64)},
     "block_configs[0].attention sets window_length: a sliding window or attention sinks"),
    ({"block_configs": _block(5, "attention", num_sink_tokens=4, unshifted_sink=True)},
     "sets num_sink_tokens, unshifted_sink: a sliding window"),
    ({"block_configs": _block(3, "ffn", moe={"num_local_experts": 8})},
     "block_configs[3].ffn sets moe: settings export does not know"),
    ({"block_configs": _block(2, "ffn", no_op=True)}, "both no_op and replace_with_linear"),
    ({"block_configs": _block(0, "attention", n_heads_in_group=3)},
     "n_heads_in_group must be a positive divisor of num_attention_heads (4), got 3"),
    ({"block_configs": _block(0, "ffn", ffn_mult=None)}, "ffn_mult must be a positive number"),
    ({"block_configs": [{"attention": attention("none"), "ffn": ffn(1.5)}] * 7},
     "no block of block_configs has attention"),
    # the checkpoint's MLP of layer 1 is 512 wide: 4.5's width is 256
    ({"block_configs": _block(1, "ffn", ffn_mult=4.5)},
     "model.layers.1.mlp.up_proj.weight has shape (512, 64), but config.json implies "
     "(256, 64) (block_configs[1].ffn.ffn_mult's width 256)"),
])
def test_what_export_cannot_honour_is_refused_in_one_line(tmp_path, change, message):
    hf = nas_checkpoint(tmp_path, reference_model(), **change)
    assert_one_line_error(cli("export", hf, "-o", tmp_path / "b", "--quiet"), message)


def test_a_window_on_a_block_without_attention_is_ignored_as_its_config_class_does():
    """AttentionConfig clears window_length and num_sink_tokens where the attention is
    left out or linear; a sparsify list only hooks training."""
    blocks = _block(1, "attention", window_length=64, num_sink_tokens=4)
    blocks[0]["ffn"]["sparsify"] = ["ffn"]
    cfg = ModelConfig.from_hf({**CONFIG, "block_configs": blocks})
    assert cfg.attention_free_layers == tuple(NO_ATTENTION)
