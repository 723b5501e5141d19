"""Deci's DeciLM (`model_type: deci`, remote code over a copy of transformers 4.35's Llama;
transformers has no class for it): Llama whose layers each have a KV head count of their
own (`num_key_value_heads_per_layer`). The reference is transformers' Llama whose k and v
projections the test replaces layer by layer with ones of that layer's KV heads (and its
`num_key_value_groups` set to match), which is what DeciLMAttention builds: q and o of
every query head, k and v of the layer's KV heads, repeat_kv before the softmax. Its rope
is transformers' Llama rope of the same rope_scaling: DeciLM-7B's dynamic x2 (plain rope
within max_position_embeddings) and a linear x2 (which moves every logit). The fixture's
four layers hold 4, 2, 1 and 2 KV heads of 4 query heads; its norms' weights are random,
so a norm read from the wrong tensor or skipped changes the logits."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from edgeprefill.bundle import load_manifest
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.model_quirks import model_quirks
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.sdk import Engine, GenerationParams
from tests.conftest import VOCAB, write_tokenizer
from tests.test_cli_errors import assert_one_line_error, cli
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_openelm import check_chunks_and_padding, check_rows_decode_together
from tests.test_quantize import dequantize_linears, logits_at

DIM, HEADS, HEAD_DIM, WIDTH, MAX_POSITIONS = 64, 4, 16, 96, 128
KV_HEADS = [4, 2, 1, 2]
ROPES = {"dynamic": {"type": "dynamic", "factor": 2.0}, "linear": {"type": "linear",
                                                                    "factor": 2.0}}
# DeciLM-7B's config.json as the Hub holds it, shrunk (no rope_theta, no
# num_key_value_heads: DeciLMConfig's defaults, 10000 and num_attention_heads).
CONFIG = {
    "architectures": ["DeciLMForCausalLM"], "model_type": "deci",
    "auto_map": {"AutoConfig": "configuration_decilm.DeciLMConfig",
                 "AutoModelForCausalLM": "modeling_decilm.DeciLMForCausalLM"},
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": DIM,
    "intermediate_size": WIDTH, "max_position_embeddings": MAX_POSITIONS,
    "num_attention_heads": HEADS, "num_hidden_layers": len(KV_HEADS),
    "num_key_value_heads_per_layer": KV_HEADS, "pretraining_tp": 1, "rms_norm_eps": 1e-5,
    "rope_scaling": ROPES["dynamic"], "tie_word_embeddings": False, "vocab_size": VOCAB,
}


def reference_model(rope: str, seed: int = 0):
    """transformers' Llama computing as DeciLMForCausalLM does: each layer's k_proj and
    v_proj replaced by ones of its KV heads (random, as every other weight), its norms'
    weights far from 1."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    scaling = ROPES[rope]
    config = LlamaConfig(
        hidden_size=DIM, intermediate_size=WIDTH, num_hidden_layers=len(KV_HEADS),
        num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, initializer_range=0.2,
        tie_word_embeddings=False, rope_parameters={"rope_type": scaling["type"],
                                                    "factor": scaling["factor"],
                                                    "rope_theta": 10000.0})
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer, kv in zip(model.model.layers, KV_HEADS, strict=True):
            attn = layer.self_attn
            attn.k_proj, attn.v_proj = (torch.nn.Linear(DIM, kv * HEAD_DIM, bias=False)
                                        for _ in range(2))
            attn.k_proj.weight.normal_(0, 0.2)
            attn.v_proj.weight.normal_(0, 0.2)
            attn.num_key_value_groups = HEADS // kv
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
    return model


def reference_logits(model, ids: list[int]) -> np.ndarray:
    """The model's logits [len(ids), vocab], every position."""
    with one_thread():
        return model(torch.tensor([ids])).logits[0].numpy()


@contextmanager
def one_thread():
    """torch without gradients on one thread: on two it would wait on ONNX Runtime's, which
    spin after each run, and take ~50x as long."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)


def deci_checkpoint(root: Path, model, **config) -> Path:
    """The model's weights under DeciLM's names (Llama's) beside DeciLM's config.json."""
    hf = root / "deci"
    hf.mkdir(parents=True)
    save_file({name: t.contiguous() for name, t in model.state_dict().items()},
              hf / "model.safetensors")
    (hf / "config.json").write_text(json.dumps({**CONFIG, **config}))
    write_tokenizer(hf)
    return hf


# DeciLM-7B's dynamic rope by default; the linear one's logits are checked by default too
# (test_keys_its_llama_never_reads_change_nothing), its chunks and decode steps under slow.
@pytest.fixture(scope="module", params=["dynamic", pytest.param("linear", marks=pytest.mark.slow)])
def deci(tmp_path_factory, request):
    """(reference model, {flavour: bundle}) of the fixture under each rope_scaling."""
    root = tmp_path_factory.mktemp("deci")
    model = reference_model(request.param)
    hf = deci_checkpoint(root, model, rope_scaling=ROPES[request.param])
    bundles = {}
    for flavor in FLAVORS:
        bundles[flavor] = root / flavor
        export(hf, bundles[flavor], ExportOptions(chunks=(1, 3, 16), max_context=64,
                                                  flavor=flavor, show_progress=False))
    return model, bundles


@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunks_of_1_3_and_16_and_a_padded_one_are_decilms_forward(deci, flavor):
    model, bundles = deci
    ids = prompt_ids(40)
    expected = reference_logits(model, ids)
    check_chunks_and_padding(bundles[flavor], ids, expected)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_different_lengths_decode_together_as_decilms_forward(deci, flavor):
    """Three rows in adjacent slots, prompts of 5, 19 and 33 tokens, then decode steps of
    all three in one call each: every row's logits are the forward's at its position."""
    model, bundles = deci
    check_rows_decode_together(bundles[flavor], lambda ids: reference_logits(model, ids)[-1], 3)


def test_the_sdk_generates_decilms_greedy_tokens(deci):
    model, bundles = deci
    prompt = prompt_ids(9)
    with one_thread():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                              min_new_tokens=6)[0, len(prompt):].tolist()
    with Engine.load(bundles["ort"], threads=2, background=False) as engine:
        got = engine.generate(prompt, GenerationParams(max_new_tokens=6, ignore_eos=True))
        assert got.result().token_ids == want


def test_the_manifest_holds_each_layers_kv_shape_and_inspect_their_range(deci):
    from click.testing import CliRunner

    from edgeprefill.cli.main import cli as edgeprefill

    model = load_manifest(deci[1]["ort"]).model
    assert (model.num_heads, model.num_kv_heads, model.head_dim) == (HEADS, 4, HEAD_DIM)
    assert model.layer_heads == {}
    assert [model.kv_dims(i) for i in range(4)] == [(kv, HEAD_DIM) for kv in KV_HEADS]
    out = CliRunner().invoke(edgeprefill, ["inspect", str(deci[1]["ort"])]).output
    assert f"4 heads / 1-4 KV heads of {HEAD_DIM}, by layer" in out


# Deci/DeciLM-7B's config.json as the Hub holds it.
DECILM_7B = {
    "architectures": ["DeciLMForCausalLM"], "model_type": "deci", "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads_per_layer": [4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 4, 2, 2, 2, 2, 2, 2, 2,
                                      2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4],
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"type": "dynamic", "factor": 2.0}, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_bfloat16": True, "transformers_version": "4.35.2",
    "use_cache": True, "vocab_size": 32000, "tokenizer_class": "LlamaTokenizer",
}


def test_decilm_7bs_config_reads_as_its_remote_code_reads_it():
    cfg = ModelConfig.from_hf(DECILM_7B)
    kv = DECILM_7B["num_key_value_heads_per_layer"]
    assert [cfg.layer_kv_heads(i) for i in range(32)] == kv
    assert [cfg.layer_heads(i) for i in range(32)] == [32] * 32
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.norm_eps, cfg.max_positions) == (
        128, 4, 1e-5, 8192)
    rope = cfg.ropes["global"]
    assert (rope.kind, rope.factor, rope.theta) == ("dynamic", 2.0, 10000.0)
    assert model_quirks(cfg)[2] == "32 query heads and 1-4 KV heads of 128, by layer"


def test_keys_its_llama_never_reads_change_nothing(tmp_path):
    """DeciLMAttention sizes heads hidden_size / num_attention_heads and builds its
    projections without biases, whatever head_dim, attention_bias and mlp_bias say."""
    model = reference_model("linear")
    hf = deci_checkpoint(tmp_path, model, rope_scaling=ROPES["linear"], head_dim=8,
                         attention_bias=True, mlp_bias=True, num_key_value_heads=4)
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False))
    ids = prompt_ids(12)
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), reference_logits(model, ids)[-1],
                               rtol=1e-4, atol=1e-4)


def test_int4_computes_decilms_forward_with_dequantized_weights(tmp_path):
    """Every projection of each layer's own shape, quantized by blocks: the bundle computes
    exactly what the reference does with those weights dequantized."""
    model = reference_model("dynamic")
    hf = deci_checkpoint(tmp_path, model)
    export(hf, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0, embeddings=False)))
    with torch.no_grad():
        dequantize_linears(model)  # every projection and the LM head
    ids = prompt_ids(12)
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), reference_logits(model, ids)[-1],
                               rtol=1e-3, atol=1e-3)


def test_int8_stays_close_to_decilms_forward(tmp_path):
    """int8 quantizes each projection's input on the fly too (DynamicQuantizeMatMul), so
    the forward is only close: 0.067 of the largest logit on this fixture. A layer's k or v
    read in another layer's KV heads moves the logits by their size."""
    model = reference_model("dynamic")
    hf = deci_checkpoint(tmp_path, model)
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False,
                                             quant=QuantConfig("int8", embeddings=False)))
    ids = prompt_ids(12)
    want = reference_logits(model, ids)[-1]
    assert np.abs(logits_at(tmp_path / "b", ids) - want).max() / np.abs(want).max() < 0.1


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "type linear or dynamic only"),
    ({"num_key_value_heads_per_layer": None}, "needs num_key_value_heads_per_layer"),
    ({"num_key_value_heads_per_layer": [4, 2, 1]}, "must list a positive head count for "
                                                   "each of the 4 layers"),
    ({"num_key_value_heads_per_layer": [4, 3, 1, 2]}, "layer 1 has 4 query heads"),
])
def test_what_export_cannot_honour_is_refused_in_one_line(tmp_path, change, message):
    hf = deci_checkpoint(tmp_path, reference_model("dynamic"), **change)
    assert_one_line_error(cli("export", hf, "-o", tmp_path / "b", "--quiet"), message)


def test_keys_a_config_leaves_out_read_as_its_llamaconfig_defaults_them():
    """transformers 4.35's LlamaConfig: RMSNorm eps 1e-6, 2048 positions, rope base 10000
    (the reader's own defaults: the family sets none)."""
    raw = {k: v for k, v in DECILM_7B.items()
           if k not in ("rms_norm_eps", "max_position_embeddings", "hidden_act")}
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.norm_eps, cfg.max_positions, cfg.activation) == (1e-6, 2048, "silu")
    assert cfg.ropes["global"].theta == 10000.0


# DeciLM-6B's config.json names no model_type: transformers reads it with the class its
# auto_map names, whose model_type is "deci". NVIDIA's Llama-Nemotron NAS ships a remote
# class of the same name (model_type "nemotron-nas", per-block `block_configs`).
NO_TYPE = {k: v for k, v in DECILM_7B.items() if k != "model_type"}
DECI_AUTO_MAP = {"AutoConfig": "configuration_decilm.DeciLMConfig",
                 "AutoModelForCausalLM": "modeling_decilm.DeciLMForCausalLM"}


@pytest.mark.parametrize("keys", [
    {"auto_map": DECI_AUTO_MAP},
    {"auto_map": DECI_AUTO_MAP, "model_type": None},
    {"auto_map": {"AutoConfig": "Deci/DeciLM-6b--configuration_decilm.DeciLMConfig"}},
    {},  # architectures alone
], ids=["auto-map", "null", "other-repo", "architectures"])
def test_a_decilm_config_without_a_model_type_reads_as_one_with_it(keys):
    assert ModelConfig.from_hf({**NO_TYPE, **keys}) == ModelConfig.from_hf(DECILM_7B)


def test_a_nemotron_nas_config_without_a_model_type_reads_as_one_with_it():
    """Llama-Nemotron NAS's class of the same name: its block_configs tell it apart."""
    from tests.test_nemotron_nas import CONFIG as NAS

    untyped = {k: v for k, v in NAS.items() if k != "model_type"}
    assert ModelConfig.from_hf(untyped) == ModelConfig.from_hf(NAS)


@pytest.mark.parametrize("keys, message", [
    # neither class's key, or both: no one type
    ({"num_key_value_heads_per_layer": None}, "config.json has no model_type"),
    ({"block_configs": [{}]}, "config.json has no model_type"),
    # another remote class
    ({"architectures": ["NonesuchForCausalLM"],
      "auto_map": {"AutoConfig": "configuration_nonesuch.NonesuchConfig"}},
     "config.json has no model_type"),
], ids=["neither", "both", "other-class"])
def test_a_config_without_a_model_type_whose_class_names_no_one_type_is_refused(keys, message):
    from edgeprefill.errors import ExportError

    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf({**NO_TYPE, "auto_map": DECI_AUTO_MAP, **keys})
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_a_decilm_checkpoint_without_a_model_type_exports_as_decilm(tmp_path):
    """As DeciLM-6B's folder: export reads its model_type from auto_map and its keys."""
    model = reference_model("dynamic")
    hf = deci_checkpoint(tmp_path, model)
    config = json.loads((hf / "config.json").read_text())
    del config["model_type"]
    (hf / "config.json").write_text(json.dumps(config))
    export(hf, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                             show_progress=False))
    assert load_manifest(tmp_path / "b").model.family == "deci"
    ids = prompt_ids(12)
    np.testing.assert_allclose(logits_at(tmp_path / "b", ids), reference_logits(model, ids)[-1],
                               rtol=1e-4, atol=1e-4)
