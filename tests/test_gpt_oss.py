"""gpt-oss (gpt_oss): attention sinks, alternating sliding and full layers, a yarn rope,
q/k/v/o biases, a biased router, experts with biases and the clamped SwiGLU, and the
Hub's MXFP4 experts, against transformers (tests/conftest.py's fixture: a sliding then a
full layer, window 8, 8 experts of width 64, top 2)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from edgeprefill.export import mxfp4
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.quantize import QuantConfig, int4_blockwise, int4_dequantize
from edgeprefill.sdk import Engine
from tests.conftest import build_hf_model, load_hf_model
from tests.rope_tables import assert_tables_close
from tests.state_models import GRAPHS, assert_padded_chunks_match
from tests.test_cli_errors import cli
from tests.test_exactness import check_greedy, prompt_ids, reference_greedy, reference_logits
from tests.test_families import export_small, last_logits
from tests.test_moe import run_rows
from tests.test_quantize import dequantize_embeddings

FAMILY = "gpt_oss"
EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


@pytest.mark.parametrize("flavor, kernels", [
    GRAPHS[0], GRAPHS[2], pytest.param(*GRAPHS[1], marks=pytest.mark.slow)])
def test_logits_equal_transformers_for_chunks_of_1_3_16_and_a_padded_last_chunk(
        flavor, kernels, hf_model, bundle, monkeypatch):
    """Chunks of 1 to 40 tokens over a window of 8, the last before the split padded:
    sinks, window, experts and routing as transformers' eager attention computes them.
    With `auto` the native kernels take both layers (tests/test_attention_sinks.py)."""
    monkeypatch.setenv("EDGEPREFILL_KERNELS", kernels)
    assert_padded_chunks_match(hf_model(FAMILY), bundle(FAMILY, flavor))


def test_the_sinks_change_the_logits(hf_model):
    """What the tests above rest on: the fixture's sinks move its logits (the sink weight
    of a head is exp(sink) over its softmax's sum)."""
    hf_dir = hf_model(FAMILY)
    model = load_hf_model(hf_dir)
    ids = torch.tensor([prompt_ids(20)])
    with torch.no_grad():
        before = model(ids).logits
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        assert (model(ids).logits - before).abs().max() > 0.05


def test_rows_of_different_valid_lengths_in_one_call_each_equal_transformers(
        hf_model, bundle):
    """One call of a 9-token chunk, a decode token and 4 tokens: each row's logits are its
    own prompt's. (The `standard` graph: ONNX Runtime's GroupQueryAttention, which the
    `ort` graph keeps on every gpt-oss layer, takes one row per call beside a past of
    several tokens; the engine never asks it for more, the test below.)"""
    hf_dir = hf_model(FAMILY)
    prompts = [prompt_ids(30, seed=s) for s in (3, 4, 5)]
    engine = Engine.load(bundle(FAMILY, "standard"), threads=2, background=False, kv_slots=3)
    got = run_rows(engine.backend, prompts, [21, 29, 26])
    engine.close()
    for row, ids in enumerate(prompts):
        np.testing.assert_allclose(got[row], reference_logits(hf_dir, ids)[-1], rtol=1e-4,
                                   atol=1e-4, err_msg=f"row {row}")


def test_greedy_text_equals_transformers_unchunked_generate(hf_model, bundle):
    check_greedy(hf_model(FAMILY), bundle(FAMILY), (17,), (5,))


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ("ort", "standard"))
def test_greedy_output_matches_transformers_across_chunk_sizes(flavor, hf_model, bundle):
    check_greedy(hf_model(FAMILY), bundle(FAMILY, flavor), (1, 17, 100), (1, 16, None))


def test_the_run_command_generates_transformers_greedy_text(hf_model, bundle):
    """`edgeprefill run` on a gpt-oss bundle: the fixture's words w0..w127 are its tokens."""
    ids = prompt_ids(12)
    expected = reference_greedy(load_hf_model(hf_model(FAMILY)), ids)
    prompt = " ".join(f"w{t}" for t in ids)  # BOS (w1) first, as the ids are
    ran = cli("run", bundle(FAMILY), "--prompt", prompt, "--max-new-tokens", "8",
              "--temperature", "0", "--ignore-eos")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [f"w{t}" for t in expected[:8]]


def test_mxfp4_dequantizes_as_transformers():
    """export/mxfp4.py against transformers' own dequantization of random codes and
    exponents (its output is the module's [E, in, out]; export's nn.Linear's [out, in])."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 5, 4, 16), dtype=np.uint8)  # 3 experts [5, 128]
    scales = rng.integers(100, 150, (3, 5, 4), dtype=np.uint8)
    expected = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                          dtype=torch.float32)
    got = mxfp4.dequantize(blocks, scales)
    assert got.shape == (3, 5, 128)
    np.testing.assert_array_equal(got, expected.transpose(1, 2).numpy())


def mxfp4_checkpoint(hf_dir, out):
    """hf_dir's checkpoint as the Hub stores gpt-oss: its experts as random MXFP4 blocks
    and scales (their biases float) under quantization_config mxfp4."""
    shutil.copytree(hf_dir, out)
    tensors = load_file(hf_dir / "model.safetensors")
    rng = np.random.default_rng(0)
    for name in [n for n in tensors if n.endswith(EXPERTS)]:
        experts, cols, rows = tensors.pop(name).shape  # [E, in, out]
        blocks, scales = mxfp4.stored_shapes(experts, rows, cols)
        tensors[name + mxfp4.BLOCKS] = rng.integers(0, 256, blocks, dtype=np.uint8)
        tensors[name + mxfp4.SCALES] = rng.integers(122, 127, scales, dtype=np.uint8)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("flavor", ("ort", pytest.param("standard", marks=pytest.mark.slow)))
def test_an_mxfp4_checkpoint_exports_as_transformers_loads_it(flavor, hf_model, tmp_path):
    """The Hub's layout: transformers dequantizes the MXFP4 experts on a CPU; the bundle
    reads the same floats (a checkpoint without the blocks' reader fails to export)."""
    hf_dir = mxfp4_checkpoint(hf_model(FAMILY), tmp_path / "hf")
    ids = prompt_ids(30)
    expected = reference_logits(hf_dir, ids)[-1]
    got = last_logits(export_small(hf_dir, tmp_path / "b", flavor), ids)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def dequantized_int4(model, block: int = 32) -> None:
    """Every projection of a gpt-oss `model` but its routers', its experts' and its (untied)
    embedding table, as the int4 bundle stores them: blocks along each weight's input
    (the experts' fused [E, in, out] along their middle axis)."""
    def rounded(out_in: torch.Tensor) -> torch.Tensor:
        flat = out_in.reshape(-1, out_in.shape[-1]).numpy()
        return torch.from_numpy(int4_dequantize(*int4_blockwise(flat, block), flat.shape[1])
                                ).reshape(out_in.shape)

    with torch.no_grad():
        dequantize_embeddings(model, "int4", block)
        for name, param in model.named_parameters():
            if name.endswith(EXPERTS):
                param.copy_(rounded(param.transpose(1, 2).contiguous()).transpose(1, 2))
            elif param.dim() == 2 and "embed" not in name and "router" not in name \
                    and not name.endswith("_bias"):
                param.copy_(rounded(param))


@pytest.mark.parametrize("block", (32, 128))
def test_int4_experts_equal_transformers_with_dequantized_weights(block, hf_model, tmp_path):
    """QMoE with the experts' biases and clamped SwiGLU (block 32), and the unrolled
    experts' MatMulNBits where QMoE cannot take the block (128, wider than the fixture's
    64), at float compute (accuracy level 0), against the model whose projections are the
    bundle's dequantized int4."""
    hf_dir = hf_model(FAMILY)
    export(hf_dir, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=128, show_progress=False,
        quant=QuantConfig("int4", block, accuracy_level=0)))
    model = load_hf_model(hf_dir)
    dequantized_int4(model, block)
    ids = prompt_ids(20)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(last_logits(tmp_path / "b", ids), expected, rtol=1e-3,
                               atol=1e-3)


def test_a_config_without_layer_types_alternates_sliding_and_full_layers(tmp_path):
    """GptOssConfig's default: layer 0 slides, layer 1 attends globally (and so on); with
    layer_types dropped from config.json the bundle still equals transformers."""
    hf_dir = build_hf_model(FAMILY, tmp_path / "hf", num_hidden_layers=3)
    config = json.loads((hf_dir / "config.json").read_text())
    assert config.pop("layer_types") == ["sliding_attention", "full_attention",
                                         "sliding_attention"]
    (hf_dir / "config.json").write_text(json.dumps(config))
    ids = prompt_ids(30)
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               reference_logits(hf_dir, ids)[-1], rtol=1e-4, atol=1e-4)


# Shaped as the Hub's gpt-oss-20b config.json (its legacy rope_scaling, MXFP4 experts).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
    "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "vocab_size": 201088,
}


def test_the_hub_config_reads_as_transformers_builds_it():
    """Windows per layer, experts, the clamped SwiGLU and the yarn rope's cos table (its
    attention factor included) as transformers' GptOssConfig and rotary embedding have them."""
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    from edgeprefill.export.layer_attention import GLOBAL
    from edgeprefill.export.model_config import ModelConfig

    config = transformers.AutoConfig.for_model(**GPT_OSS_20B)
    cfg = ModelConfig.from_hf(GPT_OSS_20B)
    assert [layer.window for layer in cfg.layers] == [
        config.sliding_window if kind == "sliding_attention" else None
        for kind in config.layer_types]
    assert cfg.moe is not None and cfg.moe.clamped is not None
    assert (cfg.moe.experts, cfg.moe.top_k, cfg.moe.width, cfg.moe.routing,
            cfg.moe.clamped.alpha, cfg.moe.clamped.limit) == (
        config.num_local_experts, config.num_experts_per_tok, config.intermediate_size,
        "topk_softmax", config.swiglu_alpha, config.swiglu_limit)
    assert (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads) == (64, 64, 8)
    rope = cfg.for_context(8192).ropes[GLOBAL]
    with torch.no_grad():
        cos, _ = GptOssRotaryEmbedding(config)(torch.zeros(1), torch.arange(8192)[None])
    freqs = np.outer(np.arange(8192, dtype=np.float32), rope.inv_freq())
    scale = rope.cos_sin_scale()
    assert_tables_close(np.cos(freqs) * np.float32(scale), cos[0].numpy(), atol=1e-4,
                        scale=scale)


class Mxfp4Shapes:
    """The tensors of the Hub's gpt-oss checkpoint of a config, shapes only (the experts
    as MXFP4 blocks and scales): its graph builds without its weights (none is read)."""

    def __init__(self, raw: dict) -> None:
        import transformers

        config = transformers.AutoConfig.for_model(**raw)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        self.shapes: dict[str, tuple[int, ...]] = {}
        for name, tensor in model.state_dict().items():
            if name.endswith(EXPERTS):
                experts, cols, rows = tensor.shape
                blocks, scales = mxfp4.stored_shapes(experts, rows, cols)
                self.shapes[name + mxfp4.BLOCKS], self.shapes[name + mxfp4.SCALES] = \
                    blocks, scales
            else:
                self.shapes[name] = tuple(tensor.shape)
        self.fp8 = None
        self.adapter = None  # no LoRA adapter merged (export/lora.py)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def is_int4(self, name: str) -> bool:
        return False  # MXFP4 experts are not GPTQ/AWQ int4 layers


@pytest.mark.parametrize("quant, op", [(None, "MoE"), (QuantConfig("int4"), "QMoE")])
def test_the_hub_sized_mxfp4_model_builds_one_moe_op_and_one_sinked_attention_per_layer(
        quant, op):
    from edgeprefill.export.decoder import DecoderBuilder
    from edgeprefill.export.flavors import flavor_class
    from edgeprefill.export.model_config import ModelConfig

    cfg = ModelConfig.from_hf(GPT_OSS_20B)
    g = DecoderBuilder(cfg, Mxfp4Shapes(GPT_OSS_20B),  # type: ignore[arg-type]
                       flavor_class("ort")(cfg, np.float32, 4096), quant).build()
    assert sum(n.op_type == op for n in g.nodes) == cfg.num_layers == 24
    attention = [n for n in g.nodes if n.op_type == "GroupQueryAttention"]
    assert [n.input[11] for n in attention] == [
        f"model.layers.{i}.self_attn.sinks" for i in range(24)]
