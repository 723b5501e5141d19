"""DiffLlama (export/families/diffllama.py, export/differential.py): differential attention
over an ordinary KV cache. Its fixture (conftest.FAMILIES: diffllama) runs in the generic
suites too. Here against transformers' DiffLlamaForCausalLM (eager): chunks of 1 (decode
steps), 3 and 16 and a padded chunk in both flavours, the ort one with the native kernels
and without; rows of other lengths in one call; int4 and int8; lambda shown to move
transformers' logits and the bundle's alike; a Hub-shaped config.json; refusals."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from edgeprefill.errors import ExportError
from edgeprefill.export.exporter import ExportOptions, export
from edgeprefill.export.model_config import ModelConfig
from edgeprefill.export.quantize import QuantConfig
from edgeprefill.kernels import select
from edgeprefill.sdk import Engine
from tests.conftest import load_hf_model
from tests.flavour_bundles import (
    check_an_edit_moves_both,
    check_chunks_against,
    check_rows_of_other_lengths,
    flavour_fixtures,
    hf_logits,
)
from tests.test_exactness import FLAVORS, prompt_ids
from tests.test_openelm import check_chunks_and_padding, run_chunks
from tests.test_quantize import dequantize_linears

MINIMAL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


hf, bundle = flavour_fixtures("diffllama")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_chunks_decode_and_padding_match_transformers(flavor, hf, bundle):
    ids = prompt_ids(40)
    check_chunks_and_padding(bundle(flavor), ids, hf_logits(load_hf_model(hf), ids))


@pytest.mark.parametrize("kernels", ["off", "require"])
def test_the_ort_bundle_is_exact_with_and_without_the_native_kernels(kernels, hf, bundle,
                                                                     monkeypatch):
    """Both GroupQueryAttention calls of a layer (the second over copies of the cache the
    first wrote) are ones the native kernels take; stock or native, the same logits."""
    if kernels == "require" and select.why_not("ort", "float32", "cpu") is not None:
        pytest.skip("the native kernels do not run here")
    monkeypatch.setenv(select.MODE_ENV, kernels)
    model = onnx.load(str(bundle("ort") / "model.onnx"), load_external_data=False)
    choice = select.choose(model, "ort", "float32", "cpu")
    assert choice.described.startswith("native" if kernels == "require" else "GroupQuery")
    ids = prompt_ids(40, seed=5)
    check_chunks_and_padding(bundle("ort"), ids, hf_logits(load_hf_model(hf), ids))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_of_other_lengths_in_one_call(flavor, hf, bundle):
    """Three rows prefilled to 30, 12 and 21 tokens, then 4-token chunks (the second row's
    1 valid token; the ort graph's rows one by one: GroupQueryAttention takes one row with
    a past per call), then one decode call of the three: each row's logits are
    transformers' of its own prompt."""
    model = load_hf_model(hf)
    prompts = [prompt_ids(35, seed) for seed in (1, 2, 3)]
    check_rows_of_other_lengths(bundle(flavor), flavor, prompts,
                                lambda ids: hf_logits(model, ids))


def test_lambda_moves_transformers_logits_and_the_bundles_alike(hf, tmp_path):
    """lambda_q1 of every layer changed in the checkpoint: transformers' logits move, and a
    bundle exported from it moves with them (equal to them again)."""
    check_an_edit_moves_both(hf, tmp_path, "lambda_q1")


def test_int4_computes_transformers_forward_with_dequantized_weights(hf, tmp_path):
    export(hf, tmp_path / "b", ExportOptions(
        chunks=(16,), max_context=64, show_progress=False,
        quant=QuantConfig("int4", 32, accuracy_level=0, embeddings=False)))
    model = load_hf_model(hf)
    with torch.no_grad():
        dequantize_linears(model)
    check_chunks_against(tmp_path / "b", model, prompt_ids(40))


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


def test_a_hub_shaped_config_exports_as_transformers_reads_it(hf, tmp_path):
    """config.json as transformers 4.4x saved DiffLlama's (kajuma/DiffLlama-0.3B-handcut's
    keys): rope_theta beside a null rope_scaling, head_dim null, lambda_std_dev,
    attention_dropout 0.0, torch_dtype; the bundle still computes transformers' logits."""
    hub = tmp_path / "hub"
    hub.mkdir()
    for f in hf.iterdir():
        (hub / f.name).write_bytes(f.read_bytes())
    raw = json.loads((hub / "config.json").read_text())
    for key in ("rope_parameters", "dtype", "transformers_version"):
        raw.pop(key, None)
    raw.update({"rope_theta": 10000.0, "rope_scaling": None, "head_dim": None,
                "lambda_std_dev": 0.1, "attention_dropout": 0.0, "torch_dtype": "float32",
                "transformers_version": "4.48.0", "architectures": ["DiffLlamaForCausalLM"]})
    (hub / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.spec.differential) == (16, 2, True)
    export(hub, tmp_path / "b", ExportOptions(chunks=(16,), max_context=64,
                                              show_progress=False))
    ids = prompt_ids(20, seed=3)
    engine = Engine.load(tmp_path / "b", threads=2, background=False)
    got = run_chunks(engine, ids, 16)
    engine.close()
    want = hf_logits(load_hf_model(hub), ids)
    np.testing.assert_allclose(np.stack(got), want[[15, 19]], rtol=1e-4, atol=1e-4)


def test_defaults_read_as_diffllama_config():
    cfg = ModelConfig.from_hf({"model_type": "diffllama", "vocab_size": 128})
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
            cfg.num_kv_heads, cfg.norm_eps) == (2048, 8192, 16, 32, 32, 1e-5)


@pytest.mark.parametrize("keys, message", [
    ({"num_key_value_heads": 1, "num_attention_heads": 4},
     "diffllama: num_key_value_heads must be even .*got 1"),
    ({"attention_dropout": 0.1}, "diffllama: attention_dropout > 0 is refused"),
])
def test_what_diffllama_cannot_run_is_refused_in_one_line(keys, message):
    with pytest.raises(ExportError, match=message) as refused:
        ModelConfig.from_hf({"model_type": "diffllama", **MINIMAL, **keys})
    assert "\n" not in str(refused.value)
