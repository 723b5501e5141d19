"""GPT-2 and GPTBigCode: their config keys, the Hub's checkpoint layout and learned
positions, as transformers reads and computes them. The fixtures' logits and greedy output
in every chunking are checked in tests/test_exactness.py."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from edgeprefill.errors import ExportError
from edgeprefill.export.model_config import ModelConfig
from tests.conftest import build_hf_model, load_hf_model
from tests.test_exactness import FLAVORS, prompt_ids, reference_logits
from tests.test_families import export_small, last_logits

FAMILIES = ("gpt2", "gpt_bigcode")
SMALL = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 128}


def model_of(family: str, keys: dict):
    config = transformers.AutoConfig.for_model(family, pad_token_id=0, **keys)
    return transformers.AutoModelForCausalLM.from_config(config).transformer


@pytest.mark.parametrize("keys", [
    {},
    {"n_inner": 80, "layer_norm_epsilon": 1e-3, "activation_function": "gelu"},
    # the alias wins where both are given (GPT2Config's attribute_map)
    {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
     "max_position_embeddings": 64},
    # keys other families read, which these models ignore
    {"intermediate_size": 96, "num_key_value_heads": 2, "head_dim": 8,
     "no_rope_layer_interval": 2, "rope_theta": 1e4},
], ids=("n_inner null", "given", "aliases", "foreign keys"))
@pytest.mark.parametrize("family", FAMILIES)
def test_config_keys_read_as_the_model_builds_them(family, keys):
    ours = ModelConfig.from_hf({"model_type": family, **SMALL, **keys})
    model = model_of(family, {**SMALL, **keys})
    block, attn = model.h[0], model.h[0].attn
    fc = block.mlp.c_fc
    assert (ours.hidden_size, ours.num_layers, ours.num_heads, ours.max_positions) == (
        model.wte.embedding_dim, len(model.h), attn.num_heads, model.wpe.num_embeddings)
    assert ours.intermediate_size == getattr(fc, "nf", None) or fc.out_features
    assert ours.num_kv_heads == getattr(attn, "kv_heads", attn.num_heads)  # MQA: one
    assert ours.norm_eps == block.ln_1.eps
    assert ours.attn_scale == attn.scaling
    x = torch.linspace(-4, 4, 101)
    gelu = {"gelu": torch.nn.functional.gelu,
            "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}
    torch.testing.assert_close(gelu[ours.activation](x), block.mlp.act(x))
    assert [layer.rope for layer in ours.layers] == [None] * ours.num_layers
    tied = transformers.AutoConfig.for_model(family, **SMALL, **keys).tie_word_embeddings
    assert ours.tie_embeddings is tied is True


@pytest.mark.parametrize(("keys", "message"), [
    ({"model_type": "gpt_bigcode", "multi_query": False},
     "gpt_bigcode: multi_query=false (a q/k/v projection interleaved per head) is not"),
])
def test_what_export_cannot_compute_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError) as err:
        ModelConfig.from_hf({**SMALL, **keys})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("family, keys", [
    ("gpt2", {"scale_attn_weights": False}),
    ("gpt_bigcode", {"scale_attn_weights": False}),
    # each layer's scores further divided by its index + 1 (layer 1: by 2)
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True, "scale_attn_weights": False}),
    # a key GPTBigCode's model does not read
    ("gpt_bigcode", {"scale_attn_by_inverse_layer_idx": True}),
])
def test_attention_scaling_options_are_the_models(tmp_path, family, keys):
    from edgeprefill.export.exporter import ExportOptions, export

    hf_dir = build_hf_model(family, tmp_path / "hf", **keys)
    ids = prompt_ids(40)
    expected = reference_logits(hf_dir, ids)[-1]
    for flavor in FLAVORS:
        export(hf_dir, tmp_path / flavor, ExportOptions(flavor=flavor, chunks=(64,),
                                                        max_context=128, show_progress=False))
        np.testing.assert_allclose(last_logits(tmp_path / flavor, ids), expected, rtol=1e-4,
                                   atol=1e-4, err_msg=flavor)


def test_reorder_and_upcast_attn_changes_nothing_in_float32(tmp_path):
    # GPT-2's eager attention then scales inside one batched matmul: the same math.
    hf_dir = build_hf_model("gpt2", tmp_path / "hf", reorder_and_upcast_attn=True)
    ids = prompt_ids(40)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(last_logits(export_small(hf_dir, tmp_path / "b"), ids),
                               expected, rtol=1e-4, atol=1e-4)


def test_a_hub_checkpoint_without_the_transformer_prefix_exports(tmp_path, caplog):
    """openai-community/gpt2 and its fine-tunes store `h.0.attn.c_attn.weight`, `wte.weight`
    (no `transformer.`), with the causal-mask buffers `h.{i}.attn.bias` beside them."""
    hf_dir = build_hf_model("gpt2", tmp_path / "hf")
    path = hf_dir / "model.safetensors"
    tensors = {name.removeprefix("transformer."): array
               for name, array in load_file(path).items()}
    assert "h.0.attn.c_attn.weight" in tensors and "wte.weight" in tensors
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 8, 8), np.float32))
    save_file(tensors, path, metadata={"format": "pt"})
    ids = prompt_ids(40)
    with caplog.at_level(logging.WARNING):
        bundle = export_small(hf_dir, tmp_path / "b")
    assert "config.json does not use" not in caplog.text
    np.testing.assert_allclose(last_logits(bundle, ids), reference_logits(hf_dir, ids)[-1],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_last_chunk_reads_the_positions_of_its_valid_tokens(tmp_path, family):
    """A bundle of all n_positions, its last chunk padded (8 valid tokens of 16, the last
    at the table's last row), in both flavours."""
    from edgeprefill.engines import StepBatch
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.sdk import Engine

    hf_dir = build_hf_model(family, tmp_path / "hf", max_position_embeddings=48)
    ids = prompt_ids(48)
    expected = reference_logits(hf_dir, ids)
    for flavor in FLAVORS:
        out = tmp_path / flavor
        export(hf_dir, out, ExportOptions(flavor=flavor, chunks=(16,), max_context=48,
                                          show_progress=False))
        engine = Engine.load(out, threads=2, background=False)
        engine.backend.run(StepBatch(np.array([ids[:16]]), np.array([0], np.int32),
                                     np.array([16], np.int32), 0))
        padded = np.full((1, 16), 7, np.int64)
        padded[0, :8] = ids[16:24]  # positions 16..23, padding 24..31
        logits = engine.backend.run(StepBatch(padded, np.array([16], np.int32),
                                              np.array([8], np.int32), 0))
        np.testing.assert_allclose(logits[0], expected[23], rtol=1e-4, atol=1e-4,
                                   err_msg=flavor)
        # the next chunk overwrites the padding, up to the table's last row
        for start in (24, 40):
            part = ids[start:start + 16]
            logits = engine.backend.run(StepBatch(np.array([part]), np.array([start], np.int32),
                                                  np.array([len(part)], np.int32), 0))
            np.testing.assert_allclose(logits[0], expected[start + len(part) - 1], rtol=1e-4,
                                       atol=1e-4, err_msg=f"{flavor} at {start}")
        engine.close()


def test_a_context_past_n_positions_is_refused(tmp_path):
    from edgeprefill.export.exporter import ExportOptions, export

    hf_dir = build_hf_model("gpt2", tmp_path / "hf", max_position_embeddings=40)
    with pytest.raises(ExportError, match=r"--max-context 41 exceeds the model's "
                                          r"max_position_embeddings \(40\)"):
        export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=41,
                                                     show_progress=False))


def test_a_position_table_that_disagrees_with_n_positions_is_refused(tmp_path):
    from edgeprefill.export.exporter import ExportOptions, export

    hf_dir = build_hf_model("gpt2", tmp_path / "hf", max_position_embeddings=40)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "n_positions": 64}))
    with pytest.raises(ExportError) as err:
        export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=32,
                                                     show_progress=False))
    assert str(err.value) == ("transformer.wpe.weight has shape (40, 64), but config.json "
                              "implies (64, 64) (n_positions 64, hidden 64)")


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_text_fills_the_whole_context_as_transformers(tmp_path, family):
    """Decoding up to the last position of the table, after a prompt whose last chunk is
    short."""
    from edgeprefill.export.exporter import ExportOptions, export
    from edgeprefill.sdk import Engine, GenerationParams

    hf_dir = build_hf_model(family, tmp_path / "hf", max_position_embeddings=40)
    export(hf_dir, tmp_path / "b", ExportOptions(chunks=(16,), max_context=40,
                                                  show_progress=False))
    ids = prompt_ids(37)
    model = load_hf_model(hf_dir)
    with torch.no_grad():  # 40 tokens in all: the whole context
        expected = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, 37:].tolist()
    engine = Engine.load(tmp_path / "b", threads=2, background=False, prefix_reuse=False)
    got = engine.generate(ids, GenerationParams(max_new_tokens=3, ignore_eos=True),
                          chunk_size=16).result()
    engine.close()
    assert got.token_ids == expected
